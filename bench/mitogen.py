# Copyright: (c) 2026, gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Mitogen against the default strategy: one upgrade of N lab hosts, wall and controller CPU (docs/awx.md section 5).

    python bench/mitogen.py [--hosts 1] [--rounds 3]      figures as JSON, one line per run on stderr

Each round runs both strategies in turn (default, then Mitogen's mitogen_linear, lab.mitogen.strategy_env), each on
a fresh lab mitogen-bench-<N> at the old stack with a fresh controller folder, pulling from the lab's mirrors as the
tests do; upgrade.yml in one batch. Per run: wall and controller CPU of everything the run started on the controller
(bench/fleet_scale.run_measured) and each host's outcome from report.json. The ratios Mitogen / default are taken
round by round (a drift of the shared machine's load moves both runs of a round) and their median reported.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import fleet_scale as fs  # noqa: E402

from lab import mitogen, nodes  # noqa: E402

BENCH_DIR = REPO / ".lab" / "bench" / "mitogen"
STRATEGIES = ("default", "mitogen")


def run(count: int, strategy: str, round_no: int) -> dict:
    lab = f"mitogen-bench-{count}"
    controller = BENCH_DIR / f"{lab}-{strategy}-{round_no}" / "controller"
    shutil.rmtree(controller.parent, ignore_errors=True)
    controller.mkdir(parents=True)
    row: dict = {"hosts": count, "strategy": strategy, "round": round_no, "lab_up_s": fs.fresh_lab(lab, count)}
    try:
        extravars = {"gpufleet_batch_size": count, "gpufleet_controller_dir": str(controller)}
        argv, env = fs.upgrade_command(lab, extravars, controller.parent / "extravars.json")
        if strategy == "mitogen":
            env.update(mitogen.strategy_env())
        log = BENCH_DIR / "logs" / f"{lab}-{strategy}-{round_no}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        m = fs.run_measured(argv, env, log, set(), nodes.ssh_ports(lab))
    finally:
        nodes.down(lab)
    reports = sorted(controller.glob("runs/*/report.json"))
    hosts = json.loads(reports[-1].read_text())["hosts"] if reports else []
    row.update(rc=m["rc"], wall_s=m["wall_s"], cpu_total_s=m["cpu_total_s"], cpu_s=m["cpu_s"], log=str(log))
    row["outcomes"] = sorted({h["outcome_kind"] for h in hosts})
    row["ok"] = m["rc"] == 0 and len(hosts) == count and row["outcomes"] == ["upgraded"]
    return row


def line(row: dict) -> str:
    return (
        f"N={row['hosts']} {row['strategy']} round {row['round']}: ok {row['ok']} ({row['outcomes']}), wall "
        f"{row['wall_s']} s, controller CPU {row['cpu_total_s']} s {row['cpu_s']}"
    )


def ratios(rows: list[dict]) -> dict:
    """Mitogen / default per round, for wall and CPU: each ratio's min, median and max."""
    by = {(r["round"], r["strategy"]): r for r in rows if r["ok"]}
    pairs = [(by[(n, "mitogen")], by[(n, "default")]) for n, s in by if s == "default" and (n, "mitogen") in by]
    out = {}
    for key in ("wall_s", "cpu_total_s"):
        values = [m[key] / d[key] for m, d in pairs]
        if values:
            out[key] = {"min": round(min(values), 2), "median": round(statistics.median(values), 2)}
            out[key]["max"] = round(max(values), 2)
    out["rounds"] = len(pairs)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    reason = mitogen.unsupported()
    if reason:
        raise SystemExit(f"bench/mitogen.py: {reason}")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    report: dict = {"command": " ".join(["python", "bench/mitogen.py", *sys.argv[1:]]), "rows": []}
    out_file = BENCH_DIR / f"mitogen-{stamp}.json"
    out_file.parent.mkdir(parents=True, exist_ok=True)
    for round_no in range(1, args.rounds + 1):
        for strategy in STRATEGIES:
            row = run(args.hosts, strategy, round_no)
            report["rows"].append(row)
            print(f"[mitogen] {line(row)}", file=sys.stderr, flush=True)
            out_file.write_text(json.dumps(report, indent=2) + "\n")  # partial figures survive a failure
    report["mitogen_over_default"] = ratios(report["rows"])
    fs.finish_report(report, out_file, "mitogen", line)
    return 0 if all(row["ok"] for row in report["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())
