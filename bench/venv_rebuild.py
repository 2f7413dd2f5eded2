# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Benchmark: rebuild the lab serving venv of one lock several ways, cold and warm cache, in one run.

1. role    - gpufleet.upgrade.venv_rebuild (inspect + one build call: uv from the tools venv, hashes required,
             verification inside the new venv, the mark), a whole ansible-playbook run; it plans (probes the indexes,
             resolves with uv) as a standalone run does
   role-lock - the same given the planned lock (-e gpufleet_wheel_lock), as an upgrade's later batches and an
             operator applying a reviewed lock run it: the install path that the pip and uv rows also get a lock for
2. pip     - the same lock through ansible.builtin.pip (python -m venv + pip, hashes required; pip compiles bytecode)
3. uv      - raw `uv venv && uv pip sync` of the same lock on the node with the role's flags (hashes required, no
             index, its own cache on the venvs' file system with hardlinks, removed after; bytecode compiled), no
             Ansible
   uv-shared - raw uv with uv's shared cache (/root/.cache/uv) and copies, no bytecode: what the role ran before

At realistic sizes by default (--scale 10: lab-main with the real cu130 set's big wheels at 1/10 of their shape:
file counts, .py modules and bytes, lab.wheels.sized_index, served on a private loopback port); --scale 1 is the
real set's shape; --scale 0 uses the small lab set. A warm-up run of the role fills the node's wheelhouse from the
fleet cache, so every timed run installs from the node's wheelhouse (no network): the figures compare the install
paths. Before each timed run every method's venv is removed and the node's file system synced (no run pays for the
writeback of the one before); "cold" also empties the tools' caches on the node (uv: /root/.cache/uv, pip:
/root/.cache/pip); "warm" keeps them. Prints one table, the ratios the issue asks for (role >= 5x faster than pip;
role within 1.3x of raw uv plus a fixed overhead) and the role's fixed overhead (role wall - uv).

    CONTAINERS_CONF=lab/containers.conf .venv/bin/python bench/venv_rebuild.py [--scale 10] [--repeats 3]

Needs the lab (mirrors + node image). Brings up one node named venv-bench-node1 and removes it at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import packaging

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("CONTAINERS_CONF", str(REPO / "lab" / "containers.conf"))

from lab import mirrors, nodes  # noqa: E402
from lab.common import mirror_ports, mirror_urls, venv_host_module  # noqa: E402
from lab.harness import run_playbook  # noqa: E402
from lab.wheels import sized_index  # noqa: E402

ROLE_PLAYBOOK = "tests/integration/playbooks/venv_rebuild.yml"
PIP_PLAYBOOK = "tests/integration/playbooks/venv_bench_pip.yml"
SERVING = "/opt/gpufleet/serving"
WHEELHOUSE = "/opt/gpufleet/wheelhouse"
PY = "/usr/bin/python3.11"
UV = "/opt/gpufleet/tools/bin/uv"
PIP_MODULE_PY = "/opt/gpufleet/bench-ansible-py"
UV_BENCH_CACHE = f"{SERVING}/.uv-bench-cache"
venv_host = venv_host_module()
BUILD_TASKS = ("Pull the locked wheels, build the new venv and verify it",)


def sh(node: str, cmd: str) -> str:
    return nodes.node_exec(node, cmd, check=True).stdout


def fresh(node: str, venv: str, cache: str) -> None:
    """Before each timed run: no venv of any method (disk stays bounded at real sizes), no tool cache when cold,
    and no dirty pages left by the previous run's writes (sync), so that no method pays for another's writeback."""
    gone = [venv, f"{SERVING}/bench-pip", f"{SERVING}/bench-uv"]
    gone += ["/root/.cache/uv", "/root/.cache/pip"] if cache == "cold" else []
    sh(node, f"rm -rf {' '.join(gone)} && sync")


def task_seconds(res, names) -> float:
    """Time the role spent in its build tasks (from ansible-runner's per-task durations)."""
    return sum(secs for task, secs in task_durations(res).items() if any(n in task for n in names))


def build_steps(res) -> dict[str, float]:
    """The build step's own timing of its host steps (module venv_build's "seconds")."""
    for ev in res.events:
        data = ev.get("event_data", {})
        if ev.get("event") == "runner_on_ok" and any(n in data.get("task", "") for n in BUILD_TASKS):
            out = data.get("res", {}).get("stdout", "")
            return json.loads(out).get("seconds", {}) if out.strip().startswith("{") else {}
    return {}


def task_durations(res) -> dict[str, float]:
    """Seconds per task name (summed over hosts) of one run, from ansible-runner's task events."""
    out: dict[str, float] = {}
    for ev in res.events:
        data = ev.get("event_data", {})
        if ev.get("event") in ("runner_on_ok", "runner_on_skipped", "runner_on_failed") and data.get("duration"):
            out[data.get("task", "?")] = out.get(data.get("task", "?"), 0.0) + float(data["duration"])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--scale", type=int, default=10, help="realistic sizes at 1/scale (0: the small lab set)")
    ap.add_argument("--keep", action="store_true", help="leave the node up")
    ap.add_argument(
        "--caches", type=lambda v: v.split(","), default=["cold", "warm"], help="cold,warm (default) or one of them"
    )
    args = ap.parse_args()

    ports = mirror_ports()
    mirrors.build()
    mirrors.start(ports)
    server = None
    base = {"venv_rebuild_switch": False, "venv_rebuild_keep": 5}
    if args.scale:
        sized = sized_index(args.scale)
        args_serve = ["--kind", "pypi", "--root", str(sized["root"]), "--pep691"]
        server = mirrors.PrivateServer("venv-bench-lab-main", args_serve, "/simple", os.devnull)
        urls = mirror_urls(ports)
        base["gpufleet_index_urls"] = {"lab-main": server.url, "lab-stale": urls["lab-stale"]}
        print(f"sized set 1/{args.scale}: {sized['bytes'] / 1e6:.0f} MB in {sized['root']}", flush=True)
    out = nodes.up(1, "venv-bench", ports)
    node, inventory = out["nodes"][0], out["inventory"]
    controller = tempfile.mkdtemp(prefix="venv-bench-controller-")
    base["gpufleet_controller_dir"] = controller
    try:
        # Warm-up: plan, controller wheelhouse, host wheelhouse, tools venv; the serving unit stays on the seed venv.
        first = run_playbook(ROLE_PLAYBOOK, inventory, base)
        if first.rc != 0:
            print(first, file=sys.stderr)
            return 1
        # ansible.builtin.pip imports `packaging` on the host, which the node's system Python lacks: give the pip
        # path an interpreter that has it (the controller's pure-Python copy), outside the timed runs.
        sh(node, f"{PY} -m venv {PIP_MODULE_PY}")
        subprocess.run(
            ["podman", "cp", packaging.__path__[0], f"{node}:{PIP_MODULE_PY}/lib/python3.11/site-packages/"],
            check=True,
        )
        lock = json.loads(next(Path(controller, "locks").glob("lab-*.json")).read_text())
        venv = f"{SERVING}/venvs/{lock['venv_name']}"
        lock_file = f"{SERVING}/locks/{lock['venv_name']}.txt"
        size_mb = sum(e["size"] or 0 for e in lock["packages"]) / 1e6
        rows = {}
        role_tasks: dict[tuple[str, str], list[float]] = {}
        role_steps: dict[tuple[str, str, str], list[float]] = {}

        def record(method, cache, seconds, build=None):
            rows.setdefault((method, cache), []).append((seconds, build))

        for _ in range(args.repeats):
            for cache in args.caches:
                # role: as a standalone run plans (probes the indexes); role-lock: given the planned lock, as the
                # later batches of an upgrade are and as an operator applies a reviewed lock (-e gpufleet_wheel_lock)
                for method, extra in (("role", {}), ("role-lock", {"gpufleet_wheel_lock": lock})):
                    fresh(node, venv, cache)
                    t0 = time.monotonic()
                    res = run_playbook(ROLE_PLAYBOOK, inventory, {**base, **extra})
                    wall = time.monotonic() - t0
                    assert res.rc == 0, res
                    record(method, cache, wall, task_seconds(res, BUILD_TASKS))
                    for name, secs in task_durations(res).items():
                        role_tasks.setdefault((method, name), []).append(secs)
                    for step, secs in build_steps(res).items():
                        role_steps.setdefault((method, cache, step), []).append(secs)
                # ansible.builtin.pip
                fresh(node, venv, cache)
                t0 = time.monotonic()
                res = run_playbook(
                    PIP_PLAYBOOK,
                    inventory,
                    {
                        "bench_lock_file": lock_file,
                        "bench_venv": f"{SERVING}/bench-pip",
                        "ansible_python_interpreter": f"{PIP_MODULE_PY}/bin/python",
                    },
                )
                wall = time.monotonic() - t0
                assert res.rc == 0, res
                record("pip", cache, wall, task_seconds(res, ("Install the lock with ansible.builtin.pip",)))
                # raw uv, timed inside the node: the role's own command (venv_host.sync_argv), and uv's shared cache
                # with copies (what the role ran before it had a cache of its own)
                uv_spec = {"venv": f"{SERVING}/bench-uv", "wheelhouse": WHEELHOUSE, "lock_file": lock_file}
                role_sync = venv_host.sync_argv({**uv_spec, "compile_bytecode": True}, UV, UV_BENCH_CACHE)
                shared_sync = (
                    f"{UV} pip sync --no-config --require-hashes --no-index --link-mode copy --find-links {WHEELHOUSE}"
                    f" --python {SERVING}/bench-uv/bin/python {lock_file}"
                )
                for method, sync in (
                    ("uv", f"{shlex.join(role_sync)} && rm -rf {UV_BENCH_CACHE}"),
                    ("uv-shared", shared_sync),
                ):
                    fresh(node, venv, cache)
                    secs = sh(
                        node,
                        "s=$(date +%s.%N); "
                        f"{UV} venv -q --no-config --python {PY} {SERVING}/bench-uv && {sync} >/dev/null && "
                        'e=$(date +%s.%N); python3 -c "print($e - $s)"',
                    ).strip()
                    record(method, cache, float(secs), float(secs))

        med = {k: statistics.median(s for s, _ in v) for k, v in rows.items()}
        med_build = {k: statistics.median(b for _, b in v) for k, v in rows.items()}
        print(f"lock {lock['venv_name']}: {len(lock['packages'])} wheels, {size_mb:.1f} MB; repeats {args.repeats}")
        print(f"{'method':9} {'cache':5} {'wall s (median)':>16} {'install step s':>15}")
        for (method, cache), value in sorted(med.items()):
            print(f"{method:9} {cache:5} {value:16.2f} {med_build[(method, cache)]:15.2f}")
        for cache in args.caches:
            for method in ("role", "role-lock"):
                print(
                    f"{cache}: pip/{method} wall {med[('pip', cache)] / med[(method, cache)]:.2f}x, "
                    f"pip/{method} install step {med_build[('pip', cache)] / med_build[(method, cache)]:.2f}x, "
                    f"{method}/uv wall {med[(method, cache)] / med[('uv', cache)]:.2f}x, "
                    f"{method}/uv install step {med_build[(method, cache)] / med[('uv', cache)]:.2f}x, "
                    f"{method} fixed overhead (wall - uv) {med[(method, cache)] - med[('uv', cache)]:.2f} s"
                )
        runs = len(args.caches) * args.repeats
        for method in ("role", "role-lock"):
            top = sorted(((n, v) for (m, n), v in role_tasks.items() if m == method), key=lambda kv: -sum(kv[1]))
            print(f"where {method}'s wall goes (mean s per run over {runs} runs, top 8 tasks):")
            for name, secs in top[:8]:
                print(f"  {sum(secs) / runs:6.2f}  {name}")
            for cache in args.caches:
                steps = [(step, v) for (m, c, step), v in role_steps.items() if (m, c) == (method, cache)]
                shown = ", ".join(f"{step} {statistics.median(v):.2f}" for step, v in steps)
                print(f"  {method} build step's host steps, {cache} (median s): {shown}")
        return 0
    finally:
        if server:
            server.stop()
        if not args.keep:
            nodes.down("venv-bench")


if __name__ == "__main__":
    sys.exit(main())
