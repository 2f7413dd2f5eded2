# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Controller CPU per host: a first upgrade, a converged re-run and an audit of N lab hosts, for one checkout or two.

    python bench/controller_cpu.py [--hosts 1,4,16] [--repeat 1] [--tree DIR ...]

For each N (a fresh lab cc-<N> at the old stack, one batch of N, pull through the run's fleet cache, the lab's wheels
at 1/10 of the real sizes as bench/fleet_scale.py serves them) and each checkout (--tree; default this one):
- first: upgrade.yml on the old stack;
- converged: upgrade.yml again (every host already at the profile);
- audit: audit.yml --check (in sync).
Each run's controller CPU is the user+sys time of every process it started on the controller, the detached SSH
ControlPersist masters and the fleet cache server included (bench/fleet_scale.py run_measured, a child subreaper).
The per-host figure is the slope of a straight line through the N's (the fixed part is the run's own work: plan,
batches, report); with one N it is CPU / N. Tasks per host are the PLAY RECAP's ok + skipped.

--tree DIR runs another checkout's playbooks, roles and plugins (e.g. `git worktree add /tmp/before <commit>`) with
this checkout's venv and lab, so that two commits are compared on one machine, on the same lab, in alternation:
the figures of a 2-core machine that runs other work are noisy, and alternation spreads the noise over both.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import fleet_scale as fs  # noqa: E402

from lab import nodes  # noqa: E402

KINDS = ("first", "converged", "audit")


def tree_env(tree: Path, scratch: Path) -> dict:
    """Environment that makes ansible-playbook load collection gpufleet.upgrade (and the roles) from ``tree``."""
    if tree == REPO:
        return {}
    root = scratch / f"collections-{tree.name}" / "ansible_collections"
    (root / "gpufleet").mkdir(parents=True, exist_ok=True)
    link = root / "gpufleet" / "upgrade"
    if not link.is_symlink():
        link.symlink_to(tree)
    for dep in (REPO / ".venv" / "collections" / "ansible_collections").iterdir():
        if dep.name != "gpufleet" and not (root / dep.name).exists():
            (root / dep.name).symlink_to(dep)
    return {"ANSIBLE_COLLECTIONS_PATH": str(root.parent), "ANSIBLE_ROLES_PATH": str(tree / "roles")}


def one_run(kind: str, lab: str, tree: Path, extravars: dict, scratch: Path, up: fs.Upstreams) -> dict:
    playbook = tree / "playbooks" / ("audit.yml" if kind == "audit" else "upgrade.yml")
    argv, env = fs.upgrade_command(lab, extravars, scratch / f"{lab}-{kind}.extravars.json", str(playbook))
    if kind == "audit":
        argv += ["--check", "--diff"]
    env.update(tree_env(tree, scratch))
    log = fs.LOG_DIR / f"controller_cpu-{lab}-{kind}-{tree.name}.log"
    fs.LOG_DIR.mkdir(parents=True, exist_ok=True)
    m = fs.run_measured(argv, env, log, up.pids(), nodes.ssh_ports(lab))
    stats = fs.recap(log.read_text(errors="replace"))
    row = {
        "kind": kind,
        "tree": str(tree),
        "rc": m["rc"],
        "wall_s": m["wall_s"],
        "cpu_total_s": m["cpu_total_s"],
        "cpu_s": m["cpu_s"],
        "ok_hosts": sum(1 for s in stats.values() if not s["failed"] and not s["unreachable"]),
        "tasks_per_host": round(sum(s["ok"] + s["skipped"] for s in stats.values()) / max(1, len(stats)), 1),
        "changed": sum(s["changed"] for s in stats.values()),
        "log": str(log),
    }
    if m["rc"] != 0:
        row["failures"] = fs.failures(log.read_text(errors="replace"))
    return row


def run_case(count: int, tree: Path, up: fs.Upstreams, scratch: Path) -> list[dict]:
    lab = f"cc-{count}"
    controller = scratch / f"controller-{count}-{tree.name}"
    shutil.rmtree(controller, ignore_errors=True)
    controller.mkdir(parents=True)
    fs.fresh_lab(lab, count)
    try:
        extravars = fs.upgrade_vars(count, "pull", controller, up)
        rows = []
        for kind in KINDS:
            row = one_run(kind, lab, tree, extravars, scratch, up)
            row["hosts"] = count
            rows.append(row)
            print(f"[controller_cpu] N={count} {kind} {tree.name}: {row['cpu_total_s']} s CPU", file=sys.stderr)
            if row["rc"] != 0 and kind == "first":
                break
        return rows
    finally:
        nodes.down(lab)


def summarize(rows: list[dict]) -> list[dict]:
    out = []
    for tree in sorted({r["tree"] for r in rows}):
        for kind in KINDS:
            done = [r for r in rows if r["tree"] == tree and r["kind"] == kind and r["rc"] == 0]
            done = [r for r in done if r["ok_hosts"] == r["hosts"]]
            if not done:
                continue
            xs = [r["hosts"] for r in done]
            cpu = fs.fit(xs, [r["cpu_total_s"] for r in done])
            per_host = cpu["per_host"] if cpu["per_host"] is not None else round(done[0]["cpu_total_s"] / xs[0], 2)
            out.append(
                {
                    "tree": tree,
                    "kind": kind,
                    "runs": len(done),
                    "hosts": sorted(set(xs)),
                    "cpu_s_per_host": per_host,
                    "cpu_s_fixed": cpu["fixed"],
                    "cpu_s_by_n": {str(r["hosts"]): r["cpu_total_s"] for r in done},
                    "tasks_per_host": sorted({r["tasks_per_host"] for r in done}),
                }
            )
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", default="1,4", help="comma-separated host counts (e.g. 1,4,16)")
    ap.add_argument("--repeat", type=int, default=1, help="rounds over every N and tree")
    ap.add_argument("--tree", action="append", type=Path, help="a checkout to measure (repeat for several)")
    args = ap.parse_args(argv)
    trees = [t.resolve() for t in (args.tree or [REPO])]
    hosts = [int(h) for h in args.hosts.split(",")]
    pad = fs.padded_index()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out_file = fs.BENCH_DIR / f"controller_cpu-{stamp}.json"
    report: dict = {"hosts": hosts, "trees": [str(t) for t in trees], "rows": []}
    up = fs.Upstreams(pad["root"], fs.BENCH_DIR / "logs" / f"cc-{stamp}")
    scratch = Path(tempfile.mkdtemp(prefix="controller_cpu-", dir=fs.BENCH_DIR))
    try:
        for _round in range(args.repeat):
            for count in hosts:
                for tree in trees:
                    report["rows"] += run_case(count, tree, up, scratch)
                    report["per_host"] = summarize(report["rows"])
                    out_file.write_text(json.dumps(report, indent=2) + "\n")
    finally:
        up.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    fs.finish_report(
        report,
        out_file,
        "controller_cpu",
        lambda r: f"{r['tree']} N={r['hosts']} {r['kind']}: {r['cpu_total_s']} s CPU, {r['tasks_per_host']} tasks/host",
    )
    for line in report.get("per_host", []):
        print(json.dumps(line), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
