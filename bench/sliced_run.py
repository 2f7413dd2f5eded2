# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Two slices at once, as AWX's job slicing runs a job: N lab hosts, two ansible-playbook processes over half each.

    python bench/sliced_run.py [--hosts 4] [--groups 0] [--group-max 10%] [--keep]
                                                    figures and checks as JSON; exit 1 when a check failed

1. A fresh lab sl-<N> at the old stack, a fresh controller folder, the private upstreams bench/fleet_scale.py serves
   (the lab's wheels at 1/10 of the real sizes) and a real nginx site cache (lab/site_cache.py) over the controller
   folder, cold.
2. Plan once (playbooks/plan.yml): the fleet's lock file, its wheels into the controller's wheelhouse.
3. Two upgrade.yml processes started together, each with ``--limit`` over its half of the hosts (the first half and
   the second half of the inventory, as AWX splits it), the same lock file, ``gpufleet_fleet_cache_url`` naming the
   site cache, one batch each. With ``--groups G`` the hosts form G serving groups (contiguous in inventory order,
   host variable ``lab_serving_group``) and the slices take whole groups (group i goes to slice i mod 2, as
   docs/awx.md advises: ``--limit`` by group); each slice plans its batches with ``gpufleet_batch_by`` and
   ``gpufleet_batch_group_max`` (``--group-max``), so no group is in two slices and the cap holds across them. A
   watcher asks every host's serving port for /health once a second: the most hosts of one group down at once, over
   both slices, is checked against the cap.
4. playbooks/merge_reports.yml over the two slices' run ids, then audit.yml --check over every host.

Checked (each a line of ``checks``): both slices end rc 0 with every host of theirs upgraded; two run ids, two run
folders, each slice's report naming only its own hosts; no host lock left on any host; the site cache served every
host and the run's own fleet caches served nothing; the merged report has every host once, upgraded, and both slices;
the audit finds every host in sync; with ``--groups``, no group had more hosts down at once than its cap.
Measured beside them: each slice's wall, its process tree's CPU (wait4) and its main process's own CPU (/proc, the
strategy loop's one core), the hosts' durations and downtime from the reports, and the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import fleet_scale as fs  # noqa: E402
from idle_cost import own_cpu_s  # noqa: E402

from lab import nodes  # noqa: E402
from lab import site_cache as sc  # noqa: E402

BENCH_DIR = REPO / ".lab" / "bench" / "sliced"
REPORT_LINE = re.compile(r"^gpufleet report: (\S+)/report\.html", re.M)
BATCH_LINE = re.compile(r"^gpufleet: batch \d+ of \d+", re.M)


def playbook(lab: str, name: str, extravars: dict, work: Path, tag: str, *extra: str) -> tuple[list[str], dict, Path]:
    """argv, environment and log of playbooks/<name> over lab ``lab`` (fleet_scale's command, another playbook)."""
    argv, env = fs.upgrade_command(lab, extravars, work / f"extravars-{tag}.json", f"playbooks/{name}")
    return argv + list(extra), env, work / f"{tag}.log"


def run(argv: list[str], env: dict, log: Path) -> int:
    with log.open("wb") as out:
        return subprocess.run(argv, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, check=False).returncode


def report_dir(log: Path) -> Path | None:
    found = REPORT_LINE.findall(log.read_text(errors="replace"))
    return Path(found[-1]) if found else None


def group_of(hosts: list[str], groups: int) -> dict[str, str]:
    """Serving groups of contiguous hosts in inventory order: ``groups`` of them (0: no groups)."""
    if not groups:
        return {}
    size = -(-len(hosts) // groups)
    return {h: f"group-{i // size}" for i, h in enumerate(hosts)}


def slices_of(hosts: list[str], groups: dict[str, str]) -> list[list[str]]:
    """Two slices: halves of the inventory, or (with groups) whole groups, group i to slice i mod 2."""
    if not groups:
        return [hosts[: len(hosts) // 2], hosts[len(hosts) // 2 :]]
    names = sorted(set(groups.values()), key=lambda g: int(g.rsplit("-", 1)[1]))
    return [[h for h in hosts if names.index(groups[h]) % 2 == n] for n in (0, 1)]


def most_down_at_once(samples: list[tuple[float, set]], groups: dict[str, str]) -> dict[str, int]:
    """Per group, the most of its hosts seen down in one sample (every host asked once per sample)."""
    worst = dict.fromkeys(set(groups.values()), 0)
    for _t, down in samples:
        for g in worst:
            worst[g] = max(worst[g], sum(1 for h in down if groups.get(h) == g))
    return worst


def add_group_vars(lab: str, groups: dict[str, str]) -> None:
    """The lab's inventory with each host's serving group (host variable lab_serving_group)."""
    import yaml

    path = REPO / ".lab" / lab / "inventory.yml"
    data = yaml.safe_load(path.read_text())
    for host, vars_ in data["all"]["children"]["gpufleet_lab"]["hosts"].items():
        vars_["lab_serving_group"] = groups[host]
    path.write_text(yaml.safe_dump(data, sort_keys=False))


class HealthWatch(threading.Thread):
    """Asks every host's serving port for /health once a second; keeps (time, hosts not answering 200)."""

    def __init__(self, ports: dict[str, int]):
        super().__init__(daemon=True)
        self.ports, self.samples, self.stop = ports, [], threading.Event()

    def healthy(self, port: int) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def run(self):
        while not self.stop.wait(1.0):
            down = {h for h, p in self.ports.items() if not self.healthy(p)}
            self.samples.append((time.time(), down))


def everything(count: int, keep: bool, groups_n: int = 0, group_max: str = "10%") -> int:
    pad = fs.padded_index()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    lab = f"sl-{count}"
    work = BENCH_DIR / stamp
    controller = work / "controller"
    controller.mkdir(parents=True)
    up = fs.Upstreams(pad["root"], work / "upstream-logs")
    cache = sc.start(lab, controller_dir=controller, clear=True)
    report: dict = {"hosts": count, "scale": fs.SCALE, "site_cache": cache["url"], "checks": []}
    report["load_at_start"], report["cores"] = os.getloadavg(), os.cpu_count()
    checks = report["checks"]

    def check(ok: bool, what: str) -> None:
        checks.append(("ok: " if ok else "FAILED: ") + what)

    try:
        report["lab_up_s"] = fs.fresh_lab(lab, count)
        state = nodes.load_state(lab)
        hosts = sorted(state["nodes"])
        groups = group_of(hosts, groups_n)
        halves = slices_of(hosts, groups)
        if groups:
            add_group_vars(lab, groups)
            report["groups"] = groups
            report["group_max"] = group_max
        lock_file = controller / "fleet.lock.yml"
        base = dict(fs.upgrade_vars(count, "pull", controller, up), gpufleet_lock_file=str(lock_file))
        t0 = time.monotonic()
        rc = run(*playbook(lab, "plan.yml", base, work, "plan"))
        report["plan"] = {"rc": rc, "wall_s": round(time.monotonic() - t0, 1)}
        check(rc == 0 and lock_file.is_file(), f"plan.yml wrote the lock file {lock_file} (rc {rc})")
        watch = HealthWatch({h: state["nodes"][h]["serving_port"] for h in hosts})
        watch.start()
        since, t0 = time.time(), time.monotonic()
        slices = []
        for number, half in enumerate(halves, 1):
            extravars = dict(base, gpufleet_batch_size=len(half), gpufleet_fleet_cache_url=cache["url"])
            if groups:
                extravars.update(gpufleet_batch_by="lab_serving_group", gpufleet_batch_group_max=group_max)
            argv, env, log = playbook(lab, "upgrade.yml", extravars, work, f"slice{number}", "--limit", ",".join(half))
            out = log.open("wb")
            proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
            slices.append(
                {"number": number, "hosts": half, "log": log, "proc": proc, "out": out, "t0": time.monotonic()}
            )
        loads = []
        while any("rc" not in s for s in slices):  # each slice's own wall: whichever ends first
            for s in slices:
                if "rc" in s:
                    continue
                batches = BATCH_LINE.findall(s["log"].read_text(errors="replace"))
                s.setdefault("batch_started_s", {})
                for line in batches[len(s["batch_started_s"]) :]:  # when each batch's line appeared, from the start
                    s["batch_started_s"][line] = round(time.monotonic() - s["t0"], 1)
                own = own_cpu_s(s["proc"].pid)
                s["main_cpu_s"] = own if own is not None else s.get("main_cpu_s")
                pid, status, usage = os.wait4(s["proc"].pid, os.WNOHANG)
                if pid:
                    s["proc"].returncode = os.waitstatus_to_exitcode(status)
                    s["rc"], s["wall_s"] = s["proc"].returncode, round(time.monotonic() - s["t0"], 1)
                    s["tree_cpu_s"] = round(usage.ru_utime + usage.ru_stime, 1)
                    s["out"].close()
            loads.append(os.getloadavg()[0])
            time.sleep(0.5)
        report["slices_wall_s"] = round(time.monotonic() - t0, 1)
        watch.stop.set()
        watch.join()
        report["load_during"] = {"min": min(loads), "max": max(loads), "mean": round(sum(loads) / len(loads), 1)}
        if groups:
            worst = most_down_at_once(watch.samples, groups)
            cap = {g: _cap(group_max, sum(1 for h in groups if groups[h] == g)) for g in worst}
            report["group_down_at_once"] = {"most": worst, "cap": cap, "samples": len(watch.samples)}
            check(
                all(worst[g] <= cap[g] for g in worst) and any(worst.values()),
                f"no serving group had more hosts down at once than its cap, over both slices: {worst} (cap {cap})",
            )
        run_ids = []
        for s in slices:
            folder = report_dir(s["log"])
            data = json.loads((folder / "report.json").read_text()) if folder else {}
            outcomes = {h["host"]: h.get("outcome_kind") for h in data.get("hosts", [])}
            run_ids.append(data.get("run_id"))
            records = data.get("hosts", [])
            report[f"slice{s['number']}"] = {
                "hosts": s["hosts"],
                "rc": s["rc"],
                "wall_s": s["wall_s"],
                "tree_cpu_s": s.get("tree_cpu_s"),
                "main_cpu_s": s.get("main_cpu_s"),
                "batch_started_s": s.get("batch_started_s"),
                "host_duration_s": {h["host"]: h.get("duration_s") for h in records},
                "host_downtime_s": {h["host"]: h.get("downtime_s") for h in records},
                "run_id": data.get("run_id"),
                "report": str(folder),
                "outcomes": outcomes,
                "log": str(s["log"]),
            }
            check(
                s["rc"] == 0 and outcomes == dict.fromkeys(s["hosts"], "upgraded"),
                f"slice {s['number']} (rc {s['rc']}) upgraded exactly its hosts {s['hosts']}: {outcomes}",
            )
        check(len(set(run_ids)) == 2 and None not in run_ids, f"two run ids, two run folders: {run_ids}")
        locks = {
            h: nodes.node_exec(h, ["sh", "-c", "ls /var/lib/gpufleet/upgrade.lock 2>/dev/null || true"]).stdout.strip()
            for h in hosts
        }
        check(not any(locks.values()), f"no host lock left: {locks}")
        counts = sc.read_counts(lab, since=since)
        own = [r for p in controller.glob("runs/*/fleet-cache-*.access.jsonl") for r in fs._jsonl(p)]
        report["site_cache_counts"] = counts
        check(
            counts.get("requests", 0) > 0 and not own,
            f"the site cache served {counts.get('requests')} requests, the runs' own fleet caches {len(own)}",
        )
        merge_vars = dict(base, gpufleet_merge_runs=run_ids)
        rc = run(*playbook(lab, "merge_reports.yml", merge_vars, work, "merge"))
        # merge_reports.yml writes <controller>/runs/merged-<hash12>/ (its message names the report.html).
        merged = next(iter(sorted(controller.glob("runs/merged-*"))), None)
        data = json.loads((merged / "report.json").read_text()) if merged else {}
        merged_hosts = sorted(h["host"] for h in data.get("hosts", []))
        report["merged"] = {"rc": rc, "report": str(merged), "totals": data.get("totals"), "slices": data.get("slices")}
        check(
            rc == 0 and merged_hosts == hosts and len(data.get("slices") or []) == 2,
            f"merged report (rc {rc}) has every host once and both slices: {merged_hosts}",
        )
        rc = run(*playbook(lab, "audit.yml", base, work, "audit", "--check", "--diff"))
        audit = (work / "audit.log").read_text(errors="replace")
        check(
            rc == 0 and f"{count} host(s) audited, 0 drifted" in audit,
            f"audit.yml --check: every host in sync (rc {rc})",
        )
    finally:
        sc.stop(lab)
        up.stop()
        if not keep:
            nodes.down(lab)
    out_file = work / "sliced_run.json"
    out_file.write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(json.dumps(report, indent=2, default=str))
    print(f"[sliced_run] written to {out_file}", file=sys.stderr)
    return 0 if all(c.startswith("ok: ") for c in checks) else 1


def _cap(group_max: str, size: int) -> int:
    """The collection's cap for a group of ``size`` hosts (plugin_utils/_batches.py group_caps)."""
    sys.path.insert(0, str(REPO / ".venv" / "collections"))
    from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _batches

    members = [f"h{i}" for i in range(size)]
    return _batches.group_caps(dict.fromkeys(members, "g"), members, group_max)["g"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=4, help="lab hosts, split in two slices")
    ap.add_argument("--groups", type=int, default=0, help="serving groups (0: none); slices take whole groups")
    ap.add_argument("--group-max", default="10%", help="gpufleet_batch_group_max of each slice")
    ap.add_argument("--keep", action="store_true", help="leave the lab up")
    args = ap.parse_args(argv)
    return everything(args.hosts, args.keep, args.groups, args.group_max)


if __name__ == "__main__":
    sys.exit(main())
