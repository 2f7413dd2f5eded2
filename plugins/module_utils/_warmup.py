# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Warm a restarted server up until it compiles nothing new (pure logic, standard library only).

A server that answers ``/health`` may still compile: FlashInfer JIT-compiles a kernel the first time the server meets
its shape (a sampled request, a batch size) and writes it to its JIT cache folder,
``$FLASHINFER_WORKSPACE_BASE/.cache/flashinfer`` (else the server user's home: ``flashinfer/jit/env.py``) as
``<version>/<archs>/cached_ops/<kernel>/<kernel>.so``. The warm-up sends the shapes the server will serve, pass after
pass, and reads the folder between passes: a pass after which no compiled entry is new or rewritten (key: inode and
ctime, which change with every write) means the server is warm. A server that still compiles after the last pass
fails the gate, naming the kernels it built.
"""

from __future__ import annotations

import os
import pwd

CACHE_SUFFIX = (".so",)
OPS_FOLDER = "cached_ops"


def jit_cache_dirs(env: dict, home: str) -> list:
    """The JIT cache folders a server with environment ``env`` (its own, from /proc) writes: FlashInfer's."""
    env = env or {}
    base = env.get("FLASHINFER_WORKSPACE_BASE") or env.get("HOME") or home
    return [os.path.join(base, ".cache", "flashinfer")] if base else []


def user_home(pid, proc_root="/proc") -> str:
    """The home of the user process ``pid`` runs as (real uid of /proc/<pid>/status); '' when unknown."""
    try:
        with open(os.path.join(proc_root, str(pid), "status"), encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("Uid:"):
                    return pwd.getpwuid(int(line.split()[1])).pw_dir
    except (OSError, KeyError, ValueError, IndexError):
        pass
    return ""


def kernel_name(relpath: str) -> str:
    """``<ver>/<archs>/cached_ops/<kernel>/<kernel>.so`` -> ``<kernel>``; other entries keep their path."""
    parts = relpath.split(os.sep)
    if OPS_FOLDER in parts[:-1]:
        return parts[parts.index(OPS_FOLDER) + 1]
    return relpath


def snapshot(dirs) -> dict:
    """Compiled entries under ``dirs``: ``{folder/relpath: (inode, ctime_ns)}`` (a rewrite changes both)."""
    entries = {}
    for top in dirs:
        for folder, _subdirs, files in os.walk(top):
            for name in files:
                if not name.endswith(CACHE_SUFFIX):
                    continue
                path = os.path.join(folder, name)
                try:
                    st = os.stat(path)
                except OSError:  # removed while we walked: a build in flight, seen on the next pass
                    continue
                entries[path] = (st.st_ino, st.st_ctime_ns)
    return entries


def compiled(before: dict, after: dict, dirs=()) -> list:
    """Kernels written between two snapshots (new or rewritten entries), sorted, each named once."""
    names = set()
    for path, key in after.items():
        if before.get(path) != key:
            rel = path
            for top in dirs:
                if path.startswith(top.rstrip(os.sep) + os.sep):
                    rel = os.path.relpath(path, top)
                    break
            names.add(kernel_name(rel))
    return sorted(names)


def warm_up(run_pass, take_snapshot, max_passes: int, clock, dirs=()) -> dict:
    """Run passes until one compiles nothing new, at most ``max_passes``.

    ``run_pass()`` sends one whole pass of requests and returns ``{requests, failed, errors}``; ``take_snapshot()``
    reads the cache folders; ``clock()`` is monotonic seconds. The result: each pass (compiled kernels, requests,
    failed, seconds), ``warm``, every kernel compiled, ``compiled_after_warmup`` (the last pass's, when not warm),
    ``wall_s`` and ``ended`` (the clock at the end: the ``warm`` edge).
    """
    start = clock()
    seen = take_snapshot()
    passes, everything = [], set()
    warm = False
    for number in range(1, max(1, int(max_passes)) + 1):
        t0 = clock()
        sent = run_pass()
        now = take_snapshot()
        built = compiled(seen, now, dirs)
        seen = now
        everything.update(built)
        passes.append(
            {
                "pass": number,
                "compiled": built,
                "requests": int(sent.get("requests", 0)),
                "failed": int(sent.get("failed", 0)),
                "errors": list(sent.get("errors") or [])[:3],
                "seconds": round(clock() - t0, 3),
            }
        )
        if sent.get("requests") and sent.get("failed", 0) >= sent["requests"]:
            break  # a server that answers nothing compiles nothing: not warm, and more passes prove nothing
        if not built:
            warm = True
            break
    ended = clock()
    return {
        "passes": passes,
        "warm": warm,
        "kernels": sorted(everything),
        "compiled_after_warmup": [] if warm else passes[-1]["compiled"],
        "wall_s": round(ended - start, 3),
        "ended": ended,
    }


def judge(host: str, result: dict, dirs, max_compiled: int) -> dict:
    """The warm-up gate: warm (a whole pass compiled nothing), requests answered, at most ``max_compiled`` kernels
    built in the last pass."""
    passes = result["passes"]
    last = passes[-1] if passes else {"requests": 0, "failed": 0, "errors": []}
    where = ", ".join(dirs) or "(no JIT cache folder)"
    said = f"{len(passes)} pass(es) in {result['wall_s']:.1f} s, {len(result['kernels'])} kernel(s) compiled" + (
        f" ({', '.join(result['kernels'])})" if result["kernels"] else ""
    )
    if last["requests"] and last["failed"] >= last["requests"]:
        return {
            "status": "failed",
            "reasons": [
                f"{host}: the warm-up's requests all failed ({last['failed']} of {last['requests']}; first: "
                f"{(last['errors'] or ['?'])[0]}); fix the server (journalctl of its unit), then run again"
            ],
            "notes": [],
        }
    late = result["compiled_after_warmup"]
    if result["warm"] or len(late) <= int(max_compiled):
        return {"status": "passed", "reasons": [], "notes": [said + f"; cache {where}"]}
    return {
        "status": "failed",
        "reasons": [
            f"{host}: the server still compiles after {len(passes)} warm-up pass(es): its last pass built "
            f"{', '.join(late)} in {where}; traffic would meet these compiles. Fix: build the stack's kernels before "
            "the drain (phase prepare), or raise postcheck.return.warmup_passes in the profile"
        ],
        "notes": [said],
    }
