# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The host model's cost: the audit of 1 host against N hosts, and the first upgrade against a converged re-run.

    python bench/host_state.py [--hosts 16] [--repeats 3] [--keep]        everything, figures as JSON
    python bench/host_state.py audit --lab hs-16                           one audit (for farm-bench)
    python bench/host_state.py upgrade --lab hs-16                         one upgrade (for farm-bench)

Brings up labs hs-1 (1 node) and hs-<N> (N nodes) at the old stack, upgrades each once (timed: the first
upgrade), then times audit.yml --check on each and upgrade.yml on the converged labs (median of --repeats).
Goals (issue: one truthful model): audit of N hosts <= 3x the audit of 1; converged re-run <= 30 % of the first.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from lab import mirrors, nodes  # noqa: E402
from lab.common import mirror_ports  # noqa: E402
from lab.harness import run_playbook  # noqa: E402

LAB_DIR = REPO / ".lab"


def inventory(lab: str) -> Path:
    return LAB_DIR / lab / "inventory.yml"


def timed(playbook: str, lab: str, check: bool = False) -> tuple[float, dict]:
    t0 = time.monotonic()
    res = run_playbook(f"playbooks/{playbook}", inventory(lab), check=check, extravars={"gpufleet_batch_size": 100})
    wall = time.monotonic() - t0
    if res.rc != 0:
        print(str(res), file=sys.stderr)
        raise SystemExit(f"{playbook} failed on lab {lab}")
    changed = sum(s["changed"] for s in res.stats.values())
    return wall, {"changed": changed, "hosts": len(res.stats)}


def one(kind: str, lab: str) -> int:
    timed("audit.yml" if kind == "audit" else "upgrade.yml", lab, check=kind == "audit")
    return 0


def everything(hosts: int, repeats: int, keep: bool) -> int:
    ports = mirror_ports()
    mirrors.build()
    mirrors.start(ports)
    labs = {1: "hs-1", hosts: f"hs-{hosts}"}
    report = {"hosts": hosts, "repeats": repeats}
    try:
        for count, lab in labs.items():
            nodes.up(count, lab, ports)
            first, stats = timed("upgrade.yml", lab)
            report[f"first_upgrade_{count}_s"] = round(first, 1)
            audits = [timed("audit.yml", lab, check=True) for _ in range(repeats)]
            report[f"audit_{count}_s"] = round(statistics.median(w for w, _ in audits), 1)
            report[f"audit_{count}_changed"] = max(s["changed"] for _, s in audits)
            again = [timed("upgrade.yml", lab) for _ in range(repeats)]
            report[f"converged_upgrade_{count}_s"] = round(statistics.median(w for w, _ in again), 1)
            report[f"converged_upgrade_{count}_changed"] = max(s["changed"] for _, s in again)
        report["audit_ratio"] = round(report[f"audit_{hosts}_s"] / report["audit_1_s"], 2)
        for count in labs:
            report[f"converged_vs_first_{count}"] = round(
                report[f"converged_upgrade_{count}_s"] / report[f"first_upgrade_{count}_s"], 2
            )
    finally:
        if not keep:
            for lab in labs.values():
                nodes.down(lab)
    print(json.dumps(report, indent=2))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kind", nargs="?", choices=["all", "audit", "upgrade"], default="all")
    ap.add_argument("--lab", default="hs-16")
    ap.add_argument("--hosts", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--keep", action="store_true", help="leave the labs up (for farm-bench runs of audit/upgrade)")
    args = ap.parse_args(argv)
    if args.kind == "all":
        return everything(args.hosts, args.repeats, args.keep)
    return one(args.kind, args.lab)


if __name__ == "__main__":
    sys.exit(main())
