# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Prepare ahead against per batch: the rollout of N lab hosts in the collection's default batches, two ways.

    python bench/prepare_ahead.py [--hosts 16]          figures as JSON, one line per run on stderr

- per batch: a fresh lab prep-<N> at the old stack and a fresh controller folder, then upgrade.yml once with the
  default batch policy: every batch downloads, builds and verifies its stack inside the batch, after the previous
  batch's post-check.
- prepare ahead: a fresh lab and controller folder, upgrade.yml -e gpufleet_stop_after=prepare over the whole fleet
  in one batch (nothing drained), then upgrade.yml with the default batch policy, which finds each host prepared
  and only drains, switches, checks and undrains.

Per run: wall and controller CPU (bench/fleet_scale.run_measured). Per host, from the run's report.json: the time
the host spent drained (the durations of the phases the phase table marks drained, plus undrain: out of rotation
until it ends) and its serving downtime (downtime_s). The lab's sized wheels at 1/10 of the real cu130 set, served
by private index servers, as bench/fleet_scale.py runs them.
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
sys.path.insert(0, str(REPO / ".venv" / "collections"))

import fleet_scale as fs  # noqa: E402

from ansible_collections.gpufleet.upgrade.plugins.module_utils._state import PHASE_TABLE  # noqa: E402
from lab import nodes  # noqa: E402

BENCH_DIR = REPO / ".lab" / "bench" / "prepare-ahead"
# Out of rotation: the drained phases, and undrain until it has put the host back.
DRAINED = [p.name for p in PHASE_TABLE if p.drained] + ["undrain"]


def playbook(lab: str, controller: Path, up: fs.Upstreams, name: str, extra: dict) -> dict:
    """One upgrade.yml run over lab ``lab``: wall, CPU, the hosts' outcomes and drained seconds."""
    extravars = fs.upgrade_vars(0, "pull", controller, up)
    del extravars["gpufleet_batch_size"]  # the collection's default batch policy unless ``extra`` sets one
    extravars.update(extra)
    argv, env = fs.upgrade_command(lab, extravars, controller.parent / f"extravars-{name}.json")
    log = BENCH_DIR / "logs" / f"{lab}-{name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    before = set(controller.glob("runs/*/report.json"))
    m = fs.run_measured(argv, env, log, up.pids(), nodes.ssh_ports(lab))
    reports = sorted(set(controller.glob("runs/*/report.json")) - before)
    hosts = json.loads(reports[-1].read_text())["hosts"] if reports else []
    drained = {
        h["host"]: round(sum(p.get("duration_s") or 0 for p in h.get("phases", []) if p["name"] in DRAINED), 1)
        for h in hosts
    }
    return {
        "run": name,
        "rc": m["rc"],
        "wall_s": m["wall_s"],
        "cpu_total_s": m["cpu_total_s"],
        "outcomes": sorted({h["outcome_kind"] for h in hosts}),
        "hosts": len(hosts),
        "drained_s": drained,
        "downtime_s": {h["host"]: h.get("downtime_s") for h in hosts},
        "log": str(log),
    }


def spread(values: dict) -> dict:
    figures = [v for v in values.values() if v is not None]
    if not figures:
        return {}
    return {"min": min(figures), "median": round(statistics.median(figures), 1), "max": max(figures)}


def case(count: int, mode: str, up: fs.Upstreams) -> dict:
    lab = f"prep-{count}"
    controller = BENCH_DIR / f"{lab}-{mode}" / "controller"
    shutil.rmtree(controller.parent, ignore_errors=True)
    controller.mkdir(parents=True)
    row: dict = {"hosts": count, "mode": mode, "lab_up_s": fs.fresh_lab(lab, count), "runs": []}
    try:
        if mode == "prepare-ahead":
            ahead = {"gpufleet_stop_after": "prepare", "gpufleet_batch_size": count}
            row["runs"].append(playbook(lab, controller, up, "prepare", ahead))
        row["runs"].append(playbook(lab, controller, up, "rollout", {}))
    finally:
        nodes.down(lab)
    rollout = row["runs"][-1]
    row["wall_s"] = round(sum(r["wall_s"] for r in row["runs"]), 1)
    row["rollout_wall_s"] = rollout["wall_s"]
    row["drained_s"] = spread(rollout["drained_s"])
    row["downtime_s"] = spread(rollout["downtime_s"])
    row["ok"] = all(r["rc"] == 0 and r["hosts"] == count for r in row["runs"]) and rollout["outcomes"] == ["upgraded"]
    return row


def line(row: dict) -> str:
    runs = ", ".join(f"{r['run']} {r['wall_s']} s (rc {r['rc']}, {r['outcomes']})" for r in row["runs"])
    d, t = row["drained_s"], row["downtime_s"]
    return (
        f"N={row['hosts']} {row['mode']}: ok {row['ok']}, wall {row['wall_s']} s ({runs}); drained per host "
        f"median {d.get('median')} s (min {d.get('min')}, max {d.get('max')}); downtime median {t.get('median')} s"
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=16)
    args = ap.parse_args(argv)
    pad = fs.padded_index()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    report: dict = {"scale": fs.SCALE, "command": " ".join(["python", "bench/prepare_ahead.py", *sys.argv[1:]])}
    report["rows"] = []
    out_file = BENCH_DIR / f"prepare_ahead-{stamp}.json"
    out_file.parent.mkdir(parents=True, exist_ok=True)
    up = fs.Upstreams(pad["root"], BENCH_DIR / "logs" / stamp)
    try:
        for mode in ("per-batch", "prepare-ahead"):
            row = case(args.hosts, mode, up)
            report["rows"].append(row)
            print(f"[prepare_ahead] {line(row)}", file=sys.stderr, flush=True)
            out_file.write_text(json.dumps(report, indent=2) + "\n")  # partial figures survive a failure
    finally:
        up.stop()
    fs.finish_report(report, out_file, "prepare_ahead", line)
    return 0 if all(row["ok"] for row in report["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())
