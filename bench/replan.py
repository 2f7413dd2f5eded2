# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Re-planning an unchanged profile: wall time and requests, with the index answers kept by their validators
(``_index.ValidatorCache``, after) and without (before: every page and METADATA read again), against loopback
indexes that serve ETag / Last-Modified and answer 304 (lab/validating.py), each request after --latency seconds.

    python bench/replan.py [--latency 0.05] [--repeats 3]
    python bench/replan.py --real stacks/cu130.yml --drop flashinfer-jit-cache --allow-stale --repeats 1

Run from a checkout that predates the validators (lab/validating.py and this file copied in), it measures that
checkout's re-plan as "before" (the figures of the old code: uv's cache pruned with --ci, wheels given to uv without
their sha256).

Two scenarios, each planned once cold, then re-planned --repeats times per way:
  pages     make_lock in check mode (no wheelhouse, uv resolving the dependencies) over the three static pages
            recorded from real CUDA indexes (lab/recorded_index.py recorded_profile: torch nightly links without a
            sha256, a republished sgl-kernel, an undated flashinfer page, PyTorch's 403s);
  default   the probe over the default index's recorded listings of torch, sglang, sgl-kernel, flashinfer-python
            and flashinfer-cubin (1,706 files) and the METADATA (PEP 658) the recording holds.
--real plans a shipped profile's default-index copy (as bench/real_stack.py --plan-only --default-index-only makes
it) in check mode, cold and then --repeats times with the same controller cache folder, on the machine's configured
default index, read at run time.
Prints JSON: per scenario and way the median wall seconds of a re-plan, the planner's requests (all, conditional,
answered 304), uv's requests (pages scenario), and the bytes the planner read.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / ".venv" / "collections"))

from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _index as ix  # noqa: E402
from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _wheel_plan as wp  # noqa: E402
from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _wheels as w  # noqa: E402
from lab.recorded_index import RecordedIndex, RecordedPages, recorded_profile  # noqa: E402
from lab.validating import by_agent, validating  # noqa: E402

TODAY = dt.date(2026, 3, 1)
WAYS = ("before",) if not hasattr(ix, "ValidatorCache") else ("before", "after")
DEFAULT_SPECS = {
    "torch": "==2.9.1",
    "sglang": "==0.5.9",
    "sgl-kernel": "==0.3.21",
    "flashinfer-python": "==0.6.4",
    "flashinfer-cubin": "==0.6.4",
}


OLD_TREE = not hasattr(ix, "ValidatorCache")  # run from a checkout before the validators: "before" only


if not OLD_TREE:

    class Forgetful(ix.ValidatorCache):
        """The planner with its validators off: nothing kept, nothing asked conditionally."""

        def conditions(self, key):
            return {}

        def put(self, *args, **kwargs):
            return None


def _fetcher(way: str, cache_dir: str) -> ix.Fetcher:
    if OLD_TREE:
        return ix.Fetcher()
    return ix.Fetcher(cache=Forgetful(cache_dir) if way == "before" else ix.ValidatorCache(cache_dir))


def _counts(servers: list, fetcher: ix.Fetcher) -> dict:
    asked = [a for s in servers for a in s.asked]
    mine = [a for s in servers for a in by_agent(s.asked, ix.USER_AGENT)]
    return {
        "planner_requests": fetcher.requests,
        "planner_conditional": getattr(fetcher, "conditional", 0),
        "planner_304": sum(1 for a in mine if a["status"] == 304),
        "planner_bytes": fetcher.bytes_in,
        "uv_requests": len(asked) - len(mine),
        "uv_304": sum(1 for a in asked if a["status"] == 304) - sum(1 for a in mine if a["status"] == 304),
    }


def _pages_plan(servers: dict, cache_dir: str, fetcher: ix.Fetcher, uv: str) -> dict:
    for server in servers.values():
        server.asked.clear()
    t0 = time.monotonic()
    lock = wp.make_lock(
        recorded_profile(servers),
        w.Target("3.11", "x86_64-manylinux_2_28"),
        fetcher,
        uv,
        tools=(),
        today=TODAY,
        cache_dir=cache_dir,
    )
    return {"seconds": time.monotonic() - t0, "hash": lock["hash"], **_counts(list(servers.values()), fetcher)}


def _default_plan(idx, fetcher: ix.Fetcher) -> dict:
    idx.asked.clear()
    wheels = {
        "indexes": [{"name": "default", "url": idx.url}],
        "packages": [{"name": n, "spec": s, "indexes": ["default"]} for n, s in DEFAULT_SPECS.items()],
        "rules": {},
    }
    target = w.Target("3.12", "x86_64-manylinux_2_28")
    rules_by_pkg, _rules = w.rules_from_profile(wheels)
    t0 = time.monotonic()
    cands = wp.probe(fetcher, wheels, rules_by_pkg, target)
    # The METADATA the recording holds (sglang, flashinfer-python, flashinfer-cubin), as the resolution reads it.
    read = sorted(c.filename for c in cands if c.filename in idx.metadata and fetcher.metadata(c))
    seconds = time.monotonic() - t0
    if getattr(fetcher, "cache", None):
        fetcher.cache.save()
    return {"seconds": seconds, "chosen": read, **_counts([idx], fetcher)}


def _summary(runs: list) -> dict:
    keys = [k for k in runs[0] if k not in ("hash", "chosen")]
    out = {k: statistics.median(r[k] for r in runs) for k in keys}
    out["seconds"] = round(out["seconds"], 3)
    return out


def pages_scenario(latency: float, repeats: int) -> dict:
    kind = validating(RecordedPages)
    uv = wp.find_uv()
    with (
        kind("pytorch-nightly-cu130", latency=latency) as torch,
        kind("sgl-whl-cu130", latency=latency) as sgl,
        kind("flashinfer-whl-cu130", latency=latency) as fi,
        tempfile.TemporaryDirectory(prefix="replan-") as tmp,
    ):
        servers = {"pytorch": torch, "sgl": sgl, "flashinfer": fi}
        cache_dir = str(Path(tmp) / "cache")
        cold = _pages_plan(servers, cache_dir, _fetcher("after", cache_dir), uv)
        runs = {
            way: [_pages_plan(servers, cache_dir, _fetcher(way, cache_dir), uv) for _ in range(repeats)] for way in WAYS
        }
        assert {r["hash"] for rs in runs.values() for r in rs} == {cold["hash"]}, "a re-plan locked something else"
    return {"cold": _summary([cold]), **{way: _summary(rs) for way, rs in runs.items()}}


def default_scenario(latency: float, repeats: int) -> dict:
    kind = validating(RecordedIndex)
    with kind(projects=tuple(DEFAULT_SPECS), latency=latency) as idx, tempfile.TemporaryDirectory() as tmp:
        cold = _default_plan(idx, _fetcher("after", tmp))
        runs = {way: [_default_plan(idx, _fetcher(way, tmp)) for _ in range(repeats)] for way in WAYS}
        assert all(r["chosen"] == cold["chosen"] for rs in runs.values() for r in rs), "a re-plan chose other files"
    return {"cold": _summary([cold]), **{way: _summary(rs) for way, rs in runs.items()}}


def real_scenario(profile_path: str, drop: list, allow_stale: bool, repeats: int) -> dict:
    """A shipped profile's default-index copy (bench/real_stack.py --default-index-only), planned in check mode
    (no wheelhouse) with one controller cache folder, cold then re-planned: the machine's configured default index is
    read at run time by the profile loader ("default"), never named here."""
    sys.path.insert(0, str(REPO / "bench"))
    from real_stack import default_index_only, host_platform

    from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _profile

    with tempfile.TemporaryDirectory(prefix="replan-real-") as tmp:
        copy, changes = default_index_only(Path(profile_path), Path(tmp), drop, [], allow_stale)
        profile = _profile.load_profile(path=str(copy))
        target = w.Target(profile["python"]["version"], host_platform())
        cache_dir, uv = str(Path(tmp) / "cache"), wp.find_uv()
        runs = []
        for _ in range(1 + repeats):
            fetcher = _fetcher("after", cache_dir)
            t0 = time.monotonic()
            lock = wp.make_lock(profile, target, fetcher, uv, tools=(), cache_dir=cache_dir)
            runs.append(
                {
                    "seconds": round(time.monotonic() - t0, 1),
                    "hash": lock["hash"][:12],
                    "packages": len(lock["packages"]),
                    "planner_requests": fetcher.requests,
                    "planner_conditional": getattr(fetcher, "conditional", 0),
                    "planner_304": getattr(fetcher, "revalidated", 0),
                    "planner_bytes": fetcher.bytes_in,
                    "uv_cache_bytes": lock["uv_cache"]["bytes"],
                }
            )
    return {"profile": profile_path, "changes": changes, "cold": runs[0], "replans": runs[1:]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--latency", type=float, default=0.05)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", choices=["pages", "default"])
    parser.add_argument("--real", metavar="PROFILE", help="plan this shipped profile's default-index copy instead")
    parser.add_argument("--drop", action="append", default=[], help="with --real: a package the index lacks")
    parser.add_argument("--allow-stale", action="store_true", help="with --real: as bench/real_stack.py")
    args = parser.parse_args()
    if args.real:
        out = real_scenario(args.real, args.drop, args.allow_stale, args.repeats)
        print(json.dumps({**out, "load_avg_5m": round(os.getloadavg()[1], 1)}, indent=1))
        return 0
    out = {"latency_s": args.latency, "repeats": args.repeats}
    if args.only in (None, "default"):
        out["default"] = default_scenario(args.latency, args.repeats)
    if args.only in (None, "pages"):
        out["pages"] = pages_scenario(args.latency, args.repeats)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
