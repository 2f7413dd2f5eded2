# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Fleet scale: bytes, controller CPU and wall time of one upgrade of N hosts, pull against push distribution.

    python bench/fleet_scale.py [--hosts 1,4] [--distributions pull,push] [--keep]   every case, figures as JSON
    python bench/fleet_scale.py pad                                                  only the padded wheels

Realistic sizes at 1/10 scale (the lab's sized set, lab.wheels.sized_index): the lab wheels the lab profile installs
get the real wheels' shapes at 1/10 (lab.wheel_shapes: file counts and bytes by extension), so that lab-torch is
53 MB (torch cu130 ~531 MB), lab-flashinfer-jit-cache 190 MB (~1.9 GB), lab-sgl-kernel 54 MB (~536 MB),
lab-flashinfer-cubin 25 MB (~246 MB); the other wheels are the lab's own. They
are written once under .lab/mirrors/lab-main-1in10/ and served by the lab's index server on a
private port; lab-stale and the redist tree are the lab's own trees, also served on private ports, so that the
three access logs count only this benchmark's upstream traffic.

For each N and distribution: a fresh lab fs-<N> at the old stack, a fresh controller folder, upgrade.yml once
(gpufleet_batch_size N: one batch), then lab down. Measured per run:
- wall seconds of ansible-playbook;
- controller CPU seconds: user+sys of every process the run started on the controller. This process is made a
  child subreaper while the playbook runs, so the detached SSH ControlPersist masters (which do the encryption of
  everything pushed) and the run's fleet cache server are reaped here too: os.wait4 gives each one's rusage;
- bytes over loopback (/proc/net/dev 'lo' tx delta): every byte of the run crosses lo once (lab nodes share the
  machine's network namespace), with TCP/IP headers, and with anything else on the machine at the same time;
- fleet cache bytes (the run's fleet-cache-<mount>.access.jsonl), upstream bytes (the private indexes' access logs);
- SSH bytes: the payload of every TCP connection to the lab nodes' sshd ports, polled with ss every 0.5 s;
  and, as asked, the estimate lo - fleet cache - upstream, which on a shared machine also counts other work.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("CONTAINERS_CONF", str(REPO / "lab" / "containers.conf"))

from lab import nodes  # noqa: E402
from lab.common import MIRRORS, mirror_ports  # noqa: E402
from lab.mirrors import PrivateServer  # noqa: E402
from lab.wheel_shapes import MB  # noqa: E402
from lab.wheels import sized_index  # noqa: E402

BENCH_DIR = REPO / ".lab" / "bench"
LOG_DIR = Path("/tmp/fleet_scale")
SCALE = "1/10 of the real cu130 set"
DEFAULT_BATCHES = [1, "10%", "25%"]  # upgrade.yml's default gpufleet_batch_size
PROJECT_TO = 500
PR_SET_CHILD_SUBREAPER = 36


# ---- padded wheels -------------------------------------------------------------------------------------------


def padded_index() -> dict:
    """The lab's sized set at 1/10 (lab.wheels.sized_index; reused when its recipe matches)."""
    return sized_index(10)


# ---- private upstream servers -------------------------------------------------------------------------------


class Upstreams:
    """lab-main (padded), lab-stale and redist on private loopback ports, each with its own access log."""

    def __init__(self, main_root: Path, log_dir: Path):
        log_dir.mkdir(parents=True, exist_ok=True)
        specs = {
            "lab-main": (["--kind", "pypi", "--root", str(main_root), "--pep691"], "/simple"),
            "lab-stale": (["--kind", "pypi", "--root", str(MIRRORS / "lab-stale")], "/simple"),
            "redist": (["--kind", "static", "--root", str(MIRRORS / "redist"), "--prefix", "/redist"], "/redist"),
        }
        self.servers = {}
        self.logs = {name: log_dir / f"{name}.access.jsonl" for name in specs}
        for name, (args, path) in specs.items():
            log_file = log_dir / f"{name}.log"
            self.servers[name] = PrivateServer(f"fs-{name}", args, path, self.logs[name], log_file)
        self.urls = {name: server.url for name, server in self.servers.items()}

    def pids(self) -> set[int]:
        return {server.proc.pid for server in self.servers.values()}

    def served(self, since: float) -> dict:
        """Bytes each upstream served since ``since``: files (GET 200 of a wheel or archive) and everything."""
        out = {}
        for name, path in self.logs.items():
            rows = [r for r in _jsonl(path) if r.get("ts", 0) >= since]
            files = [r for r in rows if r.get("method") == "GET" and r.get("status") == 200 and _is_file(r["path"])]
            out[name] = {
                "requests": len(rows),
                "bytes": sum(r.get("bytes") or 0 for r in rows),
                "file_bytes": sum(r.get("bytes") or 0 for r in files),
                "files": len(files),
            }
        return out

    def stop(self) -> None:
        for server in self.servers.values():
            server.stop()


def _is_file(path: str) -> bool:
    return path.split("?")[0].endswith((".whl", ".tar.xz", ".tar.gz"))


def _jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


# ---- measuring one playbook run ------------------------------------------------------------------------------


def lo_tx_bytes() -> int:
    for line in Path("/proc/net/dev").read_text().splitlines():
        name, _, data = line.partition(":")
        if name.strip() == "lo":
            return int(data.split()[8])
    raise SystemExit("no 'lo' interface in /proc/net/dev")


def _children(exclude: set[int]) -> dict[int, str]:
    """Direct children of this process (zombies included) and their command name."""
    me, out = os.getpid(), {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        comm = text[text.index("(") + 1 : text.rindex(")")]
        ppid = int(text[text.rindex(")") + 2 :].split()[1])
        pid = int(stat.parent.name)
        if ppid == me and pid not in exclude:
            out[pid] = comm
    return out


class SshMeter:
    """Payload bytes (sent + received) of every TCP connection to the lab nodes' sshd ports, polled with ss.

    A connection's counters grow until it closes; the last value seen counts. ControlPersist masters close only
    after 60 s idle, so the poll interval loses at most the last half second of a short-lived connection."""

    def __init__(self, ports: list[int], interval: float = 0.5):
        self.expr = "( " + " or ".join(f"dport = :{p}" for p in ports) + " )"
        self.interval, self.seen, self.stop_event = interval, {}, threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def poll(self) -> None:
        res = subprocess.run(["ss", "-tinH", "state", "established", self.expr], capture_output=True, text=True)
        key = None
        for line in res.stdout.splitlines():
            if not line.startswith((" ", "\t")):
                fields = line.split()
                key = fields[2] if len(fields) > 2 else None
                continue
            if key:
                self.seen[key] = sum(int(v) for v in re.findall(r"bytes_(?:acked|received):(\d+)", line))

    def _loop(self) -> None:
        while not self.stop_event.wait(self.interval):
            self.poll()

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop_event.set()
        self.thread.join()
        self.poll()

    @property
    def total(self) -> int:
        return sum(self.seen.values())


def _reap(pid: int, timeout: float) -> tuple[float, float] | None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            got, _, ru = os.wait4(pid, os.WNOHANG)
        except ChildProcessError:
            return None
        if got:
            return ru.ru_utime, ru.ru_stime
        if time.monotonic() > deadline:
            return None
        time.sleep(0.1)


def run_measured(argv: list[str], env: dict, log: Path, exclude: set[int], ssh_ports: list[int]) -> dict:
    """Run ansible-playbook and account the CPU of everything it left on the controller (see the docstring)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    try:
        with SshMeter(ssh_ports) as meter:
            lo0, t0, started = lo_tx_bytes(), time.monotonic(), time.time()
            with log.open("wb") as out:
                proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
                _, status, ru = os.wait4(proc.pid, 0)
            wall = time.monotonic() - t0
            lo1 = lo_tx_bytes()
        cpu = {"ansible_playbook": ru.ru_utime + ru.ru_stime, "ssh_masters": 0.0, "fleet_cache": 0.0, "other": 0.0}
        left = _children(exclude | {proc.pid})
        masters = {pid for pid, comm in left.items() if comm == "ssh"}
        for pid in masters:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for pid, comm in left.items():
            # The fleet cache server ends itself within a second of the playbook's exit (it watches its pid).
            used = _reap(pid, 15)
            if used:
                kind = "ssh_masters" if comm == "ssh" else "fleet_cache" if comm.startswith("python") else "other"
                cpu[kind] += sum(used)
    finally:
        libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
    return {
        "rc": os.waitstatus_to_exitcode(status),
        "wall_s": round(wall, 1),
        "cpu_s": {k: round(v, 2) for k, v in cpu.items()},
        "cpu_total_s": round(sum(cpu.values()), 2),
        "lo_bytes": lo1 - lo0,
        "ssh_bytes": meter.total,
        "ssh_connections": len(meter.seen),
        "reap_s": round(time.monotonic() - t0 - wall, 1),
        "started": started,
    }


RECAP = re.compile(
    r"^(\S+)\s+: ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)\s+skipped=(\d+)\s+rescued=(\d+)", re.M
)


def recap(text: str) -> dict:
    out = {}
    for m in RECAP.finditer(text.split("PLAY RECAP")[-1] if "PLAY RECAP" in text else ""):
        out[m.group(1)] = dict(
            zip(("ok", "changed", "unreachable", "failed", "skipped", "rescued"), map(int, m.groups()[1:]), strict=True)
        )
    return out


def failures(text: str, limit: int = 5) -> list[dict]:
    """The task and message of each failure in an ansible-playbook log (default callback)."""
    found, task = [], ""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("TASK ["):
            task = line[6 : line.rfind("]")]
        elif re.match(r"^(fatal|failed): \[", line):
            body = [line] + [x for x in lines[i + 1 : i + 12] if x.startswith(" ")]
            found.append({"task": task, "message": "\n".join(body)[:1500]})
    return found[:limit]


# ---- one case and the whole benchmark ------------------------------------------------------------------------


def fresh_lab(lab: str, count: int) -> float:
    """Lab ``lab`` of ``count`` new nodes at the old stack; the seconds it took."""
    t0 = time.monotonic()
    nodes.down(lab)
    nodes.up(count, lab, mirror_ports())
    return round(time.monotonic() - t0, 1)


def upgrade_vars(count: int, distribution: str, controller: Path, up: Upstreams) -> dict:
    """upgrade.yml's extra vars for one batch of ``count`` hosts against the private upstream servers."""
    return {
        "gpufleet_batch_size": count,
        "gpufleet_distribution": distribution,
        "gpufleet_controller_dir": str(controller),
        "gpufleet_index_urls": {"lab-main": up.urls["lab-main"], "lab-stale": up.urls["lab-stale"]},
        "gpufleet_redist_url": up.urls["redist"],
    }


def upgrade_command(
    lab: str, extravars: dict, ev: Path, playbook: str = "playbooks/upgrade.yml"
) -> tuple[list[str], dict]:
    """``playbook`` (upgrade.yml unless told) over lab ``lab`` with ``extravars`` (written to ``ev``): its argv and
    environment."""
    ev.write_text(json.dumps(extravars))
    argv = [str(REPO / ".venv" / "bin" / "ansible-playbook"), "-i", str(REPO / ".lab" / lab / "inventory.yml")]
    argv += [playbook, "-e", f"@{ev}"]
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    env["PATH"] = f"{REPO / '.venv' / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return argv, env


def finish_report(report: dict, out_file: Path, tag: str, line) -> None:
    """A benchmark's report with each row's summary ``line``: written to ``out_file`` and printed as JSON."""
    report["summary"] = [line(row) for row in report["rows"]]
    out_file.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    print(f"[{tag}] written to {out_file}", file=sys.stderr)


def run_case(count: int, distribution: str, up: Upstreams, keep: bool) -> dict:
    lab = f"fs-{count}"
    case = f"{lab}-{distribution}"
    controller = BENCH_DIR / "runs" / case / "controller"
    shutil.rmtree(controller.parent, ignore_errors=True)
    controller.mkdir(parents=True)
    row: dict = {"hosts": count, "distribution": distribution, "lab": lab, "lab_up_s": fresh_lab(lab, count)}
    try:
        extravars = upgrade_vars(count, distribution, controller, up)
        argv, env = upgrade_command(lab, extravars, controller.parent / "extravars.json")
        log = LOG_DIR / f"{case}.log"
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        m = run_measured(argv, env, log, up.pids(), nodes.ssh_ports(lab))
        text = log.read_text(errors="replace")
        stats = recap(text)
        row.update({k: v for k, v in m.items() if k != "started"})
        row["log"] = str(log)
        row["ok_hosts"] = sum(1 for s in stats.values() if not s["failed"] and not s["unreachable"])
        row["tasks_per_host"] = round(sum(s["ok"] + s["skipped"] for s in stats.values()) / max(1, len(stats)), 1)
        if m["rc"] != 0 or row["ok_hosts"] != count:
            row["failures"] = failures(text)
        cache = [r for p in controller.glob("runs/*/fleet-cache-*.access.jsonl") for r in _jsonl(p)]
        row["fleet_cache_bytes"] = sum(r.get("bytes") or 0 for r in cache)
        row["fleet_cache_wheel_bytes"] = sum(r.get("bytes") or 0 for r in cache if r["path"].startswith("/wheels/"))
        row["fleet_cache_redist_bytes"] = sum(r.get("bytes") or 0 for r in cache if r["path"].startswith("/redist/"))
        row["fleet_cache_errors"] = sum(1 for r in cache if isinstance(r.get("status"), int) and r["status"] >= 400)
        served = up.served(m["started"])
        row["upstream"] = served
        row["upstream_file_bytes"] = sum(s["file_bytes"] for s in served.values())
        row["upstream_bytes"] = sum(s["bytes"] for s in served.values())
        row["ssh_bytes_est"] = row["lo_bytes"] - row["fleet_cache_bytes"] - row["upstream_bytes"]
    finally:
        if not keep:
            nodes.down(lab)
    return row


def fit(xs: list[float], ys: list[float]) -> dict:
    """Least squares y = fixed + per_host * N (exact through two points; None with one N)."""
    if len(set(xs)) < 2:
        return {"fixed": None, "per_host": None}
    n, mx, my = len(xs), sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    return {"fixed": round(my - slope * mx, 2), "per_host": round(slope, 3), "points": n}


def batches(total: int, serial: list) -> list[int]:
    """Ansible's serial list: percentages of all hosts (floored, at least 1); the last size repeats."""
    sizes, left, i = [], total, 0
    while left > 0:
        item = serial[min(i, len(serial) - 1)]
        size = int(total * float(item[:-1]) / 100) if isinstance(item, str) else int(item)
        size = min(max(size, 1), left)
        sizes.append(size)
        left -= size
        i += 1
    return sizes


def summarize(rows: list[dict]) -> dict:
    done = [r for r in rows if r.get("rc") == 0 and r.get("ok_hosts") == r["hosts"]]
    per_host = []
    for r in done:
        n = r["hosts"]
        controller_bytes = r["ssh_bytes"] + r["fleet_cache_bytes"]
        per_host.append(
            {
                "hosts": n,
                "distribution": r["distribution"],
                "ssh_bytes_per_host": round(r["ssh_bytes"] / n),
                "ssh_bytes_per_host_est_lo": round(r["ssh_bytes_est"] / n),
                "fleet_cache_bytes_per_host": round(r["fleet_cache_bytes"] / n),
                "controller_bytes_per_host": round(controller_bytes / n),
                "upstream_file_bytes_per_run": r["upstream_file_bytes"],
                "cpu_s_per_host": round(r["cpu_total_s"] / n, 2),
                "wall_s_per_host": round(r["wall_s"] / n, 1),
            }
        )
    fits, projection = {}, {}
    sizes = batches(PROJECT_TO, DEFAULT_BATCHES)
    for dist in sorted({r["distribution"] for r in done}):
        rs = sorted((r for r in done if r["distribution"] == dist), key=lambda r: r["hosts"])
        xs = [r["hosts"] for r in rs]
        f = {
            "wall_s": fit(xs, [r["wall_s"] for r in rs]),
            "cpu_s": fit(xs, [r["cpu_total_s"] for r in rs]),
            "ssh_bytes": fit(xs, [r["ssh_bytes"] for r in rs]),
            "fleet_cache_bytes": fit(xs, [r["fleet_cache_bytes"] for r in rs]),
            "upstream_file_bytes": fit(xs, [r["upstream_file_bytes"] for r in rs]),
        }
        fits[dist] = f
        if f["wall_s"]["per_host"] is None:
            continue
        # Each batch pays the fixed part once (the play's per-batch tasks) and the per-host part per host.
        projection[dist] = {
            "wall_h": round(sum(f["wall_s"]["fixed"] + f["wall_s"]["per_host"] * s for s in sizes) / 3600, 2),
            "cpu_h": round(sum(f["cpu_s"]["fixed"] + f["cpu_s"]["per_host"] * s for s in sizes) / 3600, 2),
            "ssh_gb": round(sum(f["ssh_bytes"]["fixed"] + f["ssh_bytes"]["per_host"] * s for s in sizes) / 1e9, 1),
            "fleet_cache_gb": round(PROJECT_TO * f["fleet_cache_bytes"]["per_host"] / 1e9, 1),
        }
    return {
        "per_host": per_host,
        "fit": fits,
        "projection": {
            "note": (
                f"a PROJECTION, not a measurement: {PROJECT_TO} hosts at the default batches {DEFAULT_BATCHES} "
                f"({sizes}), from the straight-line fits above (lab hosts on this 2-core machine, sizes at {SCALE}: "
                "bytes x10 for the real set; wall here includes the nodes' own work on the same 2 cores)"
            ),
            "batches": sizes,
            **projection,
        },
    }


def everything(hosts: list[int], distributions: list[str], keep: bool) -> int:
    pad = padded_index()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    report: dict = {
        "scale": f"{SCALE}: " + ", ".join(f"{n} {s / MB:.0f} MB" for n, s in sorted(pad["padded"].items())),
        "padded_index": {"root": str(pad["root"]), "reused": pad["reused"], "seconds": pad["seconds"]},
        "ssh_bytes_note": (
            "ssh_bytes: payload of every TCP connection to the lab nodes' sshd ports (ss, polled every 0.5 s). "
            "ssh_bytes_est = lo tx delta - fleet cache bytes - upstream bytes: an ESTIMATE only, lo also carries "
            "TCP/IP headers, the nodes' own loopback traffic (health checks, serving bench) and whatever else ran on "
            "this shared machine meanwhile (other labs' upgrades), so it reads high"
        ),
        "rows": [],
    }
    out_file = BENCH_DIR / f"fleet_scale-{stamp}.json"
    up = Upstreams(pad["root"], BENCH_DIR / "logs" / stamp)
    try:
        for count in hosts:
            for dist in distributions:
                print(f"[fleet_scale] N={count} {dist}", file=sys.stderr, flush=True)
                report["rows"].append(run_case(count, dist, up, keep))
                report.update(summarize(report["rows"]))
                out_file.write_text(json.dumps(report, indent=2) + "\n")  # partial figures survive a later failure
    finally:
        up.stop()
    print(json.dumps(report, indent=2))
    print(f"[fleet_scale] written to {out_file}", file=sys.stderr)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kind", nargs="?", choices=["all", "pad"], default="all")
    ap.add_argument("--hosts", default="1,4", help="comma-separated host counts (e.g. 1,4,16)")
    ap.add_argument("--distributions", default="pull,push")
    ap.add_argument("--keep", action="store_true", help="leave each lab up after its run")
    args = ap.parse_args(argv)
    # A terminated benchmark still runs its finally blocks: labs down, upstream servers stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.kind == "pad":
        pad = padded_index()
        print(json.dumps({**pad, "root": str(pad["root"])}, indent=2))
        return 0
    dists = [d for d in args.distributions.split(",") if d]
    if set(dists) - {"pull", "push"}:
        ap.error(f"--distributions {args.distributions!r}: give pull, push or both")
    return everything([int(n) for n in args.hosts.split(",")], dists, args.keep)


if __name__ == "__main__":
    sys.exit(main())
