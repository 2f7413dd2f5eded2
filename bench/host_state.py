# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The host model's cost: the audit of 1 host against N hosts, and the first upgrade against a converged re-run.

    python bench/host_state.py [--hosts 16] [--repeats 3] [--keep]        everything, figures as JSON
    python bench/host_state.py audit --lab hs-16                           one audit (for farm-bench)
    python bench/host_state.py upgrade --lab hs-16                         one upgrade (for farm-bench)

Brings up labs hs-1 (1 node) and hs-<N> (N nodes) at the old stack, upgrades each once (timed: the first
upgrade), then times audit.yml --check and upgrade.yml on the converged labs, the two labs in turn (median of
--repeats; the audit's N / 1 ratio also pair by pair, as farm-bench --vs takes it).
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


def paired(playbook: str, labs: dict[int, str], repeats: int, check: bool = False) -> dict:
    """The playbook on each lab in turn (1, N, 1, N ...), so the machine's drift hits both alike; the ratio N / 1 is
    taken pair by pair (median, min, max) as well as the ratio of the medians."""
    runs: dict[int, list[tuple[float, dict]]] = {count: [] for count in labs}
    for _ in range(repeats):
        for count, lab in labs.items():
            runs[count].append(timed(playbook, lab, check=check))
    small, big = sorted(labs)
    pairs = [b[0] / a[0] for a, b in zip(runs[small], runs[big], strict=True)]
    return {
        "s": {count: round(statistics.median(w for w, _ in r), 1) for count, r in runs.items()},
        "changed": {count: max(s["changed"] for _, s in r) for count, r in runs.items()},
        "pair_ratio": {
            "median": round(statistics.median(pairs), 2),
            "min": round(min(pairs), 2),
            "max": round(max(pairs), 2),
        },
    }


def everything(hosts: int, repeats: int, keep: bool) -> int:
    ports = mirror_ports()
    mirrors.build()
    mirrors.start(ports)
    labs = {1: "hs-1", hosts: f"hs-{hosts}"}
    report = {"hosts": hosts, "repeats": repeats}
    try:
        # Both labs up and upgraded first: every timed audit and re-run below has the same containers running.
        for count, lab in labs.items():
            nodes.up(count, lab, ports)
        for count, lab in labs.items():
            first, _stats = timed("upgrade.yml", lab)
            report[f"first_upgrade_{count}_s"] = round(first, 1)
        audit = paired("audit.yml", labs, repeats, check=True)
        again = paired("upgrade.yml", labs, repeats)
        for count in labs:
            report[f"audit_{count}_s"] = audit["s"][count]
            report[f"audit_{count}_changed"] = audit["changed"][count]
            report[f"converged_upgrade_{count}_s"] = again["s"][count]
            report[f"converged_upgrade_{count}_changed"] = again["changed"][count]
        report["audit_ratio"] = round(report[f"audit_{hosts}_s"] / report["audit_1_s"], 2)
        report["audit_ratio_pairwise"] = audit["pair_ratio"]
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
