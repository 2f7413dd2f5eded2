# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Serving downtime per host against the host's whole upgrade, for each drain mode.

    python bench/downtime.py [--modes none,stop,tasks] [--repeats 1] [--keep]

For each mode: a fresh one-node lab dt-<mode> at the old stack, upgrade.yml once, then the run's fleet report
(report.json, written by the summary callback) gives the host's downtime (the serving unit down - stopped or
restarting - until its /health wait answered on the new stack) and its upgrade time (first phase to its report).
Goal (issue: fleet scale): downtime / upgrade time <= 10 % in the lab. Mode tasks runs a drain and an undrain
task file that only write a marker on the host (stand-ins for a load balancer's API); haproxy and slurm need their
lab servers and are measured by tests/integration/test_drain_haproxy.py and test_drain_slurm.py.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from lab import mirrors, nodes  # noqa: E402
from lab.common import mirror_ports  # noqa: E402
from lab.harness import run_playbook  # noqa: E402

HOOK = """---
- name: Mark the host {state} (stand-in for a load balancer's API)
  ansible.builtin.copy:
    dest: /run/gpufleet-bench-{state}
    content: "{state}\\n"
    mode: "0644"
"""


def one(mode: str, ports: dict, hooks: Path, keep: bool) -> dict:
    lab = f"dt-{mode}"
    nodes.down(lab)
    nodes.up(1, lab, ports)
    extravars = {"gpufleet_drain": mode}
    if mode == "tasks":
        extravars.update(
            gpufleet_drain_tasks=str(hooks / "drain.yml"), gpufleet_undrain_tasks=str(hooks / "undrain.yml")
        )
    try:
        res = run_playbook("playbooks/upgrade.yml", REPO / ".lab" / lab / "inventory.yml", extravars=extravars)
        if res.rc != 0:
            raise SystemExit(f"upgrade with gpufleet_drain={mode} failed:\n{res}")
        reports = sorted((REPO / ".lab" / lab / "controller" / "runs").glob("*/report.json"))
        host = json.loads(reports[-1].read_text())["hosts"][0]
        return {
            "downtime_s": host["downtime_s"],
            "upgrade_s": host["duration_s"],
            "drain_phase_s": next((p["duration_s"] for p in host["phases"] if p["name"] == "drain"), None),
        }
    finally:
        if not keep:
            nodes.down(lab)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--modes", default="none,stop,tasks")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args(argv)
    ports = mirror_ports()
    mirrors.build()
    mirrors.start(ports)
    hooks = Path(tempfile.mkdtemp(prefix="gpufleet-downtime-"))
    for state in ("drain", "undrain"):
        (hooks / f"{state}.yml").write_text(HOOK.format(state=state), encoding="utf-8")
    report = {}
    for mode in args.modes.split(","):
        runs = [one(mode, ports, hooks, args.keep) for _ in range(args.repeats)]
        down = statistics.median(r["downtime_s"] for r in runs)
        total = statistics.median(r["upgrade_s"] for r in runs)
        report[mode] = {
            "downtime_s": round(down, 1),
            "upgrade_s": round(total, 1),
            "downtime_share": round(down / total, 3) if total else None,
            "runs": runs,
        }
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
