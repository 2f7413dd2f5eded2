# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Site cache: one upgrade of N lab hosts pulling through a real nginx site cache (lab/site_cache.py).

    python bench/site_cache.py [--hosts 1,4] [--warm] [--keep]          figures as JSON, one line per run on stderr

For each N: a fresh lab sc-<N> at the old stack, a fresh controller folder, an nginx site cache sc-<N> with an empty
cache (cold) whose origin is that controller folder's wheelhouse and redist cache, then upgrade.yml once with
``gpufleet_fleet_cache_url`` naming the cache (gpufleet_batch_size N: one batch, distribution pull), as
bench/fleet_scale.py runs it: the lab's sized wheels at 1/10 of the real cu130 set and the redist tree, served by
private index servers. With ``--warm`` the same N runs again on a fresh lab, the same controller folder and the
cache as the cold run left it (the next fleet of a site).

Counted from nginx's own logs over the run (lab.site_cache.counts): upstream bytes (what nginx received from its
upstream, headers included; and what the origin sent, bodies only), bytes served to the hosts, hit rate (HIT
requests over all requests; and over bytes served), requests per cache status. Beside them: the controller's bytes
from the indexes (the private servers' logs), wall and controller CPU (bench/fleet_scale.run_measured).
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import fleet_scale as fs  # noqa: E402

from lab import nodes  # noqa: E402
from lab import site_cache as sc  # noqa: E402

BENCH_DIR = REPO / ".lab" / "bench" / "site-cache"
LOG_DIR = Path("/tmp/site_cache_bench")
MB = 1e6


def run_once(count: int, phase: str, up: fs.Upstreams, controller: Path, cache: dict, keep: bool) -> dict:
    lab = f"sc-{count}"
    row: dict = {"hosts": count, "cache": phase, "lab": lab, "site_cache": cache["url"]}
    row["lab_up_s"] = fs.fresh_lab(lab, count)
    try:
        extravars = dict(fs.upgrade_vars(count, "pull", controller, up), gpufleet_fleet_cache_url=cache["url"])
        argv, env = fs.upgrade_command(lab, extravars, controller.parent / f"extravars-{phase}.json")
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        log = LOG_DIR / f"{lab}-{phase}.log"
        m = fs.run_measured(argv, env, log, up.pids(), nodes.ssh_ports(lab))
        text = log.read_text(errors="replace")
        stats = fs.recap(text)
        row.update(rc=m["rc"], wall_s=m["wall_s"], cpu_total_s=m["cpu_total_s"], log=str(log))
        row["ok_hosts"] = sum(1 for s in stats.values() if not s["failed"] and not s["unreachable"])
        if m["rc"] != 0 or row["ok_hosts"] != count:
            row["failures"] = fs.failures(text)
        row["site_cache_counts"] = sc.read_counts(lab, since=m["started"])
        # The run's own fleet cache must not have served anything: every host byte came through the site cache.
        own = [r for p in controller.glob("runs/*/fleet-cache-*.access.jsonl") for r in fs._jsonl(p)]
        row["own_fleet_cache_requests"] = len(own)
        indexes = up.served(m["started"])
        row["index_file_bytes"] = sum(s["file_bytes"] for s in indexes.values())
    finally:
        if not keep:
            nodes.down(lab)
    return row


def line(row: dict) -> str:
    c = row.get("site_cache_counts") or {}
    rate = c.get("hit_rate")
    return (
        f"N={row['hosts']} {row['cache']}: rc {row.get('rc')}, ok {row.get('ok_hosts')}/{row['hosts']}, "
        f"upstream {c.get('upstream_bytes', 0) / MB:.1f} MB (origin sent {c.get('origin_bytes', 0) / MB:.1f} MB), "
        f"served to hosts {c.get('served_bytes', 0) / MB:.1f} MB, hit rate {rate} "
        f"({c.get('by_cache_status', {}).get('HIT', {}).get('requests', 0)}/{c.get('requests', 0)} requests, "
        f"bytes {c.get('byte_hit_rate')}), wall {row.get('wall_s')} s, "
        f"controller from indexes {row.get('index_file_bytes', 0) / MB:.1f} MB"
    )


def everything(hosts: list[int], warm: bool, keep: bool) -> int:
    pad = fs.padded_index()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    command = " ".join(["python", "bench/site_cache.py", *sys.argv[1:]])
    report: dict = {"scale": fs.SCALE, "command": command, "rows": []}
    out_file = BENCH_DIR / f"site_cache-{stamp}.json"
    out_file.parent.mkdir(parents=True, exist_ok=True)
    up = fs.Upstreams(pad["root"], BENCH_DIR / "logs" / stamp)
    try:
        for count in hosts:
            lab = f"sc-{count}"
            controller = BENCH_DIR / lab / "controller"
            shutil.rmtree(controller.parent, ignore_errors=True)
            controller.mkdir(parents=True)
            cache = sc.start(lab, controller_dir=controller, clear=True)
            report["nginx_config"] = cache["config"]
            try:
                for phase in ["cold", "warm"] if warm else ["cold"]:
                    row = run_once(count, phase, up, controller, cache, keep)
                    report["rows"].append(row)
                    print(f"[site_cache] {line(row)}", file=sys.stderr, flush=True)
                    out_file.write_text(json.dumps(report, indent=2) + "\n")  # partial figures survive a failure
            finally:
                sc.stop(lab)
    finally:
        up.stop()
    fs.finish_report(report, out_file, "site_cache", line)
    return 0 if all(r.get("rc") == 0 and r.get("ok_hosts") == r["hosts"] for r in report["rows"]) else 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", default="1,4", help="comma-separated host counts (e.g. 1,4,16)")
    ap.add_argument("--warm", action="store_true", help="run each N again on the cache the cold run filled")
    ap.add_argument("--keep", action="store_true", help="leave each lab up after its run")
    args = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # finally blocks still run: labs down, servers stopped
    return everything([int(n) for n in args.hosts.split(",") if n], args.warm, args.keep)


if __name__ == "__main__":
    sys.exit(main())
