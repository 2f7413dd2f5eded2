# Copyright: (c) 2026, gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Every way back ends serving: interruption point x way back, on lab hosts.

An interruption is a killed ansible-playbook (parked at a phase's test hook with gpufleet_fault_action=hang, then
SIGKILL, with gpufleet_drain none, stop or haproxy; or killed while the backup phase writes its backup, before the
backup is complete) or a failing task at that hook. A way back is a re-run of upgrade.yml, rollback.yml, or
rollback.yml naming the interrupted run's backup. After it, every host must serve one consistent stack (the old one,
or the new one: the running server loaded exactly that venv's packages and `current` points at it), its state.json
must hold a terminal result, the lock must be released, the drain undone (unit active; under HAProxy the server
ready with no drain record left), /usr/local/cuda where it was, the backup its record names complete (never the
folder a killed backup left half written), and the report must say what was done (a unit that was down is reported
as restarted, never as "serving unit answers").

A round interrupts up to GPUFLEET_MATRIX_HOSTS hosts (default 6, one case each, all of one drain setting), then
takes each way back once for the hosts that case names, checks every host and puts the moved ones back on the old
stack. `make test` runs the wheel cut short by the fleet cache; the slice (a host killed right after its stop drain,
back through rollback.yml and through upgrade.yml), the rest of the matrix (81 cases) and the lost records (a host
whose backups folder or state.json is gone) are marked `long` (`make integration-long`). The rows are appended to the
fault-injection document (reports/fault-injection.md, or docs/ with GPUFLEET_UPDATE_DOCS=1) as a second table.
"""

from __future__ import annotations

import datetime
import functools
import http.server
import json
import os
import signal
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from test_fault_injection import (
    NEW_SGLANG,
    OLD_TOOLKIT,
    OLD_VENV,
    REPO,
    SUMMARY_ENV,
    per_host,
    report_of,
    served_stack,
    sh,
    upgrade,
)

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _backup as bk
from ansible_collections.gpufleet.upgrade.plugins.module_utils import _drain_haproxy as hx
from lab import haproxy as lab_haproxy
from lab import nodes as labnodes
from lab.common import podman_env

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPORT = REPO / ("docs" if os.environ.get("GPUFLEET_UPDATE_DOCS") == "1" else "reports") / "fault-injection.md"
MATRIX_HEADING = "## Recovery matrix: interruption x way back"
HOOKS = ("after_preflight", "after_backup", "after_toolkit", "after_drain", "after_venv", "after_postcheck")
# Not a hook of the playbook: the run is killed while backup_manifest writes the backup's .partial-<id> folder.
DURING_BACKUP = "during_backup"
KILL_POINTS = (HOOKS[0], DURING_BACKUP, *HOOKS[1:])
DRAINS = ("none", "stop", "haproxy")
WAYS = ("upgrade.yml", "rollback.yml", "rollback.yml -e rollback_backup_id")
STATE = "/var/lib/gpufleet/state.json"
BACKUPS = "/var/lib/gpufleet/backups"
# The hook parks with `sleep 900`; the bracket keeps pgrep from matching the shell that runs it.
PARKED = "pgrep -f 'sleep [9]00' >/dev/null && echo parked"
# Hosts a round interrupts at once (the fleet's size): one case each.
ROUND_HOSTS = max(2, int(os.environ.get("GPUFLEET_MATRIX_HOSTS", "6")))
ROWS: list[dict] = []


@dataclass(frozen=True)
class Case:
    hook: str
    how: str  # killed | failing
    drain: str
    way: str

    @property
    def way_label(self):
        return self.way.split()[0].removesuffix(".yml") + ("-id" if "rollback_backup_id" in self.way else "")

    @property
    def label(self):
        return f"{self.how}-{self.hook}-{self.drain}-{self.way_label}"


def all_cases():
    killed = [Case(h, "killed", d, w) for h in KILL_POINTS for d in DRAINS for w in WAYS]
    failing = [Case(h, "failing", "none", w) for h in HOOKS for w in WAYS]
    return killed + failing


def rounds(cases, size):
    """Rounds of up to ``size`` cases, one per host, all of one drain (one drain setting per run); the slice's cases
    are left out (their own test). Cases stay in order, so the killed ones of a round share few hooks: a run parks
    every host at the same hook (under the linear strategy a host parked at a hook holds the others at that task),
    so each hook of a round costs a killed run of its own."""
    in_slice = {c for pair in SLICE for c in pair}
    by_drain = {}
    for case in cases:
        if case not in in_slice:
            by_drain.setdefault(case.drain, []).append(case)
    return [tuple(group[i : i + size]) for group in by_drain.values() for i in range(0, len(group), size)]


def round_id(cases):
    """``stop:killed-after_drain(rollback-id)+killed-after_venv(upgrade,rollback,rollback-id)``."""
    parts = {}
    for case in cases:
        parts.setdefault(f"{case.how}-{case.hook}", []).append(case.way_label)
    return f"{cases[0].drain}:" + "+".join(f"{k}({','.join(v)})" for k, v in parts.items())


# The slice make test runs (two cases, one per host): the drained host killed mid-run and each way back.
SLICE = [(Case("after_drain", "killed", "stop", WAYS[1]), Case("after_drain", "killed", "stop", WAYS[0]))]


# --------------------------------------------------------------------------- helpers


def playbook_env():
    return dict(
        os.environ,
        ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
        PATH=f"{REPO / '.venv' / 'bin'}:{os.environ['PATH']}",
        **SUMMARY_ENV,
    )


def start_killed_run(fleet, nodes, extravars):
    """upgrade.yml on ``nodes`` in a session of its own (a SIGKILL to the group ends it and its SSH clients)."""
    args = {
        "gpufleet_batch_size": len(nodes),
        "backup_keep": 30,
        "gpufleet_fault_action": "hang",
        **extravars,
    }
    cmd = [
        str(REPO / ".venv" / "bin" / "ansible-playbook"),
        "-i",
        str(fleet.inventory),
        "-l",
        ",".join(nodes),
        str(REPO / "playbooks" / "upgrade.yml"),
        "-e",
        json.dumps(args),
    ]
    log = Path(fleet.inventory).parent / f"killed-run-{time.time_ns()}.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            cmd, cwd=REPO, env=playbook_env(), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    return proc, log


def kill_when(proc, ready, timeout):
    """Poll ``ready()`` (the hosts that are where the kill belongs) until it holds them all, then SIGKILL the run."""
    deadline = time.time() + timeout
    got = []
    try:
        while time.time() < deadline and proc.poll() is None:
            got = ready()
            if got is True:
                break
            time.sleep(1)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    return got


def kill_parked(fleet, node_exec, hook, nodes, extravars, timeout=1800):
    """Run upgrade.yml with every host's hook set to hang, SIGKILL ansible-playbook once every host is parked.

    One hook per run: under the linear strategy a host parked at a hook holds the others at that task."""
    proc, log = start_killed_run(fleet, nodes, {"gpufleet_fault_inject": hook, **extravars})
    parked = []

    def ready():
        parked[:] = [n for n in nodes if sh(node_exec, n, PARKED) == "parked"]
        return len(parked) == len(nodes) or parked

    kill_when(proc, ready, timeout)
    for n in nodes:
        sh(node_exec, n, "pkill -f 'sleep [9]00' || true")
    tail = log.read_text(errors="replace")[-3000:]
    assert len(parked) == len(nodes), (
        f"not every host parked at {hook}: {parked} of {nodes}; rc {proc.returncode}\n{tail}"
    )


# Runs on a host: waits for a new .partial-<id> folder in the backups folder (a backup being written), then stops
# (SIGSTOP) the module writing it, a Python process of an SSH session, and writes what it saw to the marker file.
# Stopped, the module cannot finish while the test kills ansible-playbook; the test then SIGKILLs it.
MID_BACKUP_WATCHER = r"""
import json, os, signal, sys, time

backups, marker, timeout = sys.argv[1], sys.argv[2], float(sys.argv[3])


def partials():
    try:
        return {n for n in os.listdir(backups) if n.startswith(".partial-")}
    except FileNotFoundError:
        return set()


def parent_and_comm(pid):
    with open(f"/proc/{pid}/stat") as handle:
        stat = handle.read()
    return int(stat[stat.rindex(")") + 2 :].split()[1]), stat[stat.index("(") + 1 : stat.rindex(")")]


def in_ssh_session(pid):
    while pid > 1:
        pid, comm = parent_and_comm(pid)
        if comm.startswith("sshd"):
            return True
    return False


def module_pids():
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                exe = os.path.basename(handle.read().split(b"\0")[0])
            if exe.startswith(b"python") and in_ssh_session(int(entry)):
                found.append(int(entry))
        except (OSError, ValueError, IndexError):
            continue
    return found


before = partials()
deadline = time.time() + timeout
while time.time() < deadline:
    new = sorted(partials() - before)
    if new:
        pids = module_pids()
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        folder = os.path.join(backups, new[0])
        files = sorted(os.path.relpath(os.path.join(d, f), folder) for d, _, fs in os.walk(folder) for f in fs)
        with open(marker + ".tmp", "w") as handle:
            json.dump({"partial": new[0], "pids": pids, "files": files}, handle)
        os.rename(marker + ".tmp", marker)
        sys.exit(0)
    time.sleep(0.005)
sys.exit(1)
"""
MID_BACKUP_MARKER = "/run/gpufleet-matrix-mid-backup.json"


def kill_mid_backup(fleet, node_exec, nodes, extravars, timeout=1800):
    """Run upgrade.yml and kill it while the backup phase writes each host's backup; returns {host: partial folder}.

    The host gets a line in its unit's environment file first, so that no backup describes it and the run writes a
    new one (a matching backup is reused, nothing written); the venv archive (backup_archive_venv) gives the write
    seconds, not milliseconds."""
    for n in nodes:
        sh(
            node_exec,
            n,
            f'rm -f {MID_BACKUP_MARKER}; echo "# recovery matrix $(date +%s%N)" >> /etc/gpufleet/gpufleet-serving.env',
        )
    watchers = [
        subprocess.Popen(
            ["podman", "exec", n, "python3", "-c", MID_BACKUP_WATCHER, BACKUPS, MID_BACKUP_MARKER, str(timeout)],
            env=podman_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for n in nodes
    ]
    proc, log = start_killed_run(
        fleet, nodes, {"gpufleet_fault_inject": "none", "backup_archive_venv": True, **extravars}
    )
    seen = {}

    def ready():
        for n in nodes:
            if n not in seen:
                raw = sh(node_exec, n, f"cat {MID_BACKUP_MARKER} 2>/dev/null || true")
                if raw:
                    seen[n] = json.loads(raw)
        return len(seen) == len(nodes) or list(seen)

    try:
        kill_when(proc, ready, timeout)
    finally:
        # A watcher left running would stop the next run's backup module: end each one in its host.
        for n in nodes:
            sh(node_exec, n, f"pkill -f '{MID_BACKUP_MARKER[:-1]}[{MID_BACKUP_MARKER[-1]}]' || true")
        for w in watchers:
            w.wait()
    for n, found in seen.items():
        if found["pids"]:
            sh(node_exec, n, "kill -KILL " + " ".join(map(str, found["pids"])) + " 2>/dev/null || true")
    tail = log.read_text(errors="replace")[-3000:]
    assert len(seen) == len(nodes), f"not every host began writing a backup: {list(seen)} of {nodes}\n{tail}"
    for n, found in seen.items():
        partial = f"{BACKUPS}/{found['partial']}"
        complete = f"{BACKUPS}/{found['partial'].removeprefix('.partial-')}"
        left = sh(node_exec, n, f"test -d {partial} && ! test -e {complete} && echo partial")
        assert found["pids"] and left == "partial", (n, found, left, "the backup was not caught half written")
    return {n: found["partial"] for n, found in seen.items()}


def state_of(node_exec, node):
    raw = sh(node_exec, node, f"cat {STATE} 2>/dev/null || echo missing")
    if raw == "missing":
        return {}
    return json.loads(raw)


def unit_active(node_exec, node):
    return sh(node_exec, node, "systemctl is-active gpufleet-serving || true") == "active"


def haproxy_admin(balancer, node):
    api = hx.Runtime(balancer["socket"])
    states = hx.parse_servers_state(api.command(f"show servers state {balancer['backend']}"))
    stats = hx.parse_stat(api.command(f"show stat {balancer['backend']} 4 -1"))
    return hx.server_view(states, stats, balancer["backend"], node)["admin"]


def backup_complete(node_exec, node, partial=None):
    """The backup the host's record names is complete (its manifest written, the folder renamed into place); when a
    backup was killed half written (``partial``) and a re-run of upgrade.yml took the host back, its folder is gone."""
    named = state_of(node_exec, node).get("backup_id")
    ok = not named or sh(node_exec, node, f"test -f {BACKUPS}/{named}/{bk.MANIFEST} && echo ok") == "ok"
    if partial:
        ok = ok and sh(node_exec, node, f"test -e {BACKUPS}/{partial} && echo left || true") == ""
    return ok


def end_checks(fleet, node_exec, node, baseline, drain, balancer=None, records=None, partial=None, recorded=True):
    """What must hold after a way back: each value True when it does. ``partial``: the half-written backup folder a
    killed run left, to be gone after the way back (given for the re-run of upgrade.yml only: a rollback writes no
    backup, so the next upgrade's backup removes it). ``recorded``: whether the host had a state.json after the
    interruption (a run killed in its preflight on a host never upgraded writes none; no record is then right)."""
    state = state_of(node_exec, node)
    served = served_stack(node_exec, node, fleet.serving_port(node))
    current = sh(node_exec, node, "readlink -f /opt/gpufleet/serving/current")
    old = served == baseline[node] and current == OLD_VENV
    new = isinstance(served, dict) and served.get("lab-sglang") == NEW_SGLANG and current != OLD_VENV
    drained_out = False
    if drain == "haproxy":
        drained_out = haproxy_admin(balancer, node) != "ready" or any(Path(records).glob("*.json"))
    return {
        "serves one stack": old or new,
        "state terminal": state.get("result") not in (None, "in_progress") or not (state or recorded),
        "lock released": sh(node_exec, node, "test -e /var/lib/gpufleet/upgrade.lock && echo held || echo free")
        == "free",
        "drain undone": unit_active(node_exec, node) and not drained_out,
        "/usr/local/cuda unchanged": sh(node_exec, node, "readlink /usr/local/cuda") == OLD_TOOLKIT,
        "backup complete": backup_complete(node_exec, node, partial),
    }


def truthful(case, before_active, report):
    """The way back's report says what was done: a unit that was down is reported restarted."""
    outcome = report["outcome"]
    if case.way == WAYS[0]:
        return outcome == "upgraded" and (before_active or "restarted the serving unit" in report["phases"]["recover"])
    if before_active:
        return "did not answer" not in outcome
    return "restarted the serving unit" in outcome and "serving unit answers" not in outcome


def drain_vars(drain, balancer=None, records=None):
    extravars = {"gpufleet_drain": drain}
    if drain == "haproxy":
        extravars.update(
            gpufleet_haproxy_socket=balancer["socket"],
            gpufleet_haproxy_backend=balancer["backend"],
            gpufleet_drain_record_dir=str(records),
            gpufleet_drain_timeout_s=30,
        )
    return extravars


def rollback(fleet, run_playbook, nodes, **extravars):
    return run_playbook(
        "playbooks/rollback.yml", fleet.inventory, extravars=extravars, envvars=SUMMARY_ENV, limit=",".join(nodes)
    )


def reset(fleet, run_playbook, node_exec, first_backup, nodes, extravars):
    """Back to the old stack for the next round (a host already there is left alone)."""
    moved = [n for n in nodes if sh(node_exec, n, "readlink -f /opt/gpufleet/serving/current") != OLD_VENV]
    if moved:
        back = rollback(
            fleet,
            run_playbook,
            moved,
            rollback_backup_id=per_host({n: first_backup[n] for n in moved}, ""),
            **extravars,
        )
        assert back.rc == 0, str(back)


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def fleet(lab_fleet):
    # lab_fleet adds the run's suffix (two sessions never recreate each other's nodes): a lab kept with LAB_KEEP=1
    # is used again with the same GPUFLEET_LAB_NAME and GPUFLEET_LAB_RUN.
    return lab_fleet(ROUND_HOSTS, name=os.environ.get("GPUFLEET_LAB_NAME") or "rm")


@pytest.fixture(scope="module")
def baseline(fleet):
    return {node: served_stack(labnodes.node_exec, node, fleet.serving_port(node)) for node in fleet.nodes}


@pytest.fixture(scope="module")
def first_backup(fleet):
    """The backup of each host's old stack, as the first run that backed it up recorded it (filled as rounds go)."""
    return {}


@pytest.fixture(scope="module")
def balancer(fleet):
    info = lab_haproxy.start(fleet.name)
    yield info
    lab_haproxy.stop(fleet.name)


@pytest.fixture(scope="module", autouse=True)
def write_rows():
    yield
    if ROWS:
        append_matrix(ROWS)


def matrix_key(cells):
    """A row's case: (interruption, drain, way back), its first three cells."""
    return tuple(cells[:3])


def table_rows(text, header):
    """The rows of the matrix already in the document, by case, when its columns are this run's ``header``."""
    if "\n" + MATRIX_HEADING not in text or header not in text:
        return {}
    table = text.split("\n" + MATRIX_HEADING, 1)[1].split(header, 1)[1]
    rows = {}
    for line in table.splitlines()[2:]:
        if not line.startswith("| "):
            break
        rows[matrix_key([c.strip() for c in line.strip().strip("|").split("|")])] = line
    return rows


def append_matrix(rows):
    """The matrix as a second table of the fault-injection document (replacing an earlier one); rewritten after
    every round. Each row says when it ran: a run of some rounds (``-k``, or one stopped early) replaces the rows of
    the cases it took and keeps the others from the table before, so the table says which cases are missing."""
    checks = list(rows[0]["checks"])
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    header = (
        "| interruption | drain | way back | host | way back reported | "
        + " | ".join(checks)
        + " | truthful | verdict | run |"
    )
    text = REPORT.read_text(encoding="utf-8") if REPORT.exists() else "# Fault injection\n"
    merged = table_rows(text, header)
    for row in rows:
        outcome = row["outcome"].replace("|", "/")
        if len(outcome) > 160:
            outcome = outcome[:157] + "..."
        marks = " | ".join("yes" if row["checks"][c] else "**NO**" for c in checks)
        ok = all(row["checks"].values()) and row["truthful"]
        cells = [f"{row['how']} {row['hook']}", row["drain"], row["way"]]
        merged[matrix_key(cells)] = (
            f"| {' | '.join(cells)} | {row['host']} | {outcome} | {marks} | "
            f"{'yes' if row['truthful'] else '**NO**'} | {'serving' if ok else '**NOT SERVING**'} | {stamp} |"
        )
    order = [matrix_key([f"{c.how} {c.hook}", c.drain, c.way]) for c in all_cases()]
    missing = [key for key in order if key not in merged]
    size = f"{len(order)} cases" if not missing else f"PARTIAL: {len(order) - len(missing)} of {len(order)} cases"
    lines = [
        MATRIX_HEADING,
        "",
        f"Generated by `pytest tests/integration/test_recovery_matrix.py` on lab hosts ({size}, up to {ROUND_HOSTS} "
        f"hosts a round; last written {stamp}, {len(rows)} rows by that run; each row's run in its last column). "
        "Do not edit by hand.",
        "",
        "Each row: the interruption (a killed ansible-playbook parked at the hook, killed while the backup phase "
        "writes the backup (`during_backup`), or a failing task at the hook, under the drain named), then the way "
        "back; the checks after it (backup complete: the backup the host's record names has its manifest, and after "
        "a backup killed half written and a re-run of upgrade.yml its folder is gone); whether the way back's report "
        "said what was done (a restart reported as one). `make integration-long` runs every case, the slice among "
        "them.",
        "",
        header,
        "|---|---|---|---|---|" + "---|" * len(checks) + "---|---|---|",
        *(merged[key] for key in order if key in merged),
    ]
    if missing:
        lines += ["", "Not run: " + "; ".join(" / ".join(key) for key in missing) + "."]
    text = text.split("\n" + MATRIX_HEADING)[0].rstrip("\n") + "\n\n"
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    REPORT.write_text(text + "\n".join(lines) + "\n", encoding="utf-8")
    print(f"recovery matrix: {len(rows)} rows written to {REPORT.relative_to(REPO)}, {len(missing)} cases not run")


# --------------------------------------------------------------------------- the matrix


def together(calls):
    """Run each call in a thread of its own, wait for all, return their results in order (the first error raised).
    Runs on disjoint hosts wait on SSH and on the hosts more than they compute: side by side, a round takes the time
    of its longest run, not the sum."""
    if len(calls) < 2:
        return [call() for call in calls]
    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        futures = [pool.submit(call) for call in calls]
        return [f.result() for f in futures]


def interrupt(fleet, run_playbook, node_exec, cases, extravars):
    """Interrupt each host as its case says, side by side: a killed run per kill point (one run parks every host at
    the same hook), and one run with a failing task at each failing host's hook. Returns {host: half-written backup}."""
    killed = {}
    for node, case in cases.items():
        if case.how == "killed":
            killed.setdefault(case.hook, []).append(node)
    calls = []
    for hook, nodes in killed.items():
        if hook == DURING_BACKUP:
            calls.append(functools.partial(kill_mid_backup, fleet, node_exec, nodes, extravars))
        else:
            calls.append(functools.partial(kill_parked, fleet, node_exec, hook, nodes, extravars))
    failing = {n: c.hook for n, c in cases.items() if c.how == "failing"}
    if failing:
        inject = per_host(failing, "none")
        calls.append(
            functools.partial(
                upgrade, fleet, run_playbook, limit=",".join(failing), gpufleet_fault_inject=inject, **extravars
            )
        )
    partials = {}
    for result in together(calls):
        if isinstance(result, dict):
            partials.update(result)
    return partials


def way_back(fleet, run_playbook, way, nodes, interrupted, extravars):
    """One way back for ``nodes``; the report of each."""
    if way == WAYS[0]:
        result = upgrade(fleet, run_playbook, limit=",".join(nodes), **extravars)
    elif way == WAYS[1]:
        result = rollback(fleet, run_playbook, nodes, **extravars)
    else:
        named = per_host({n: interrupted[n] for n in nodes}, "")
        result = rollback(fleet, run_playbook, nodes, rollback_backup_id=named, **extravars)
    return {n: report_of(result, n) for n in nodes}


def take_ways_back(fleet, run_playbook, cases, interrupted, extravars):
    """Each way back once, side by side, for the hosts whose case names it; the report of each host."""
    calls = []
    for way in WAYS:
        these = [n for n, c in cases.items() if c.way == way]
        if these:
            calls.append(functools.partial(way_back, fleet, run_playbook, way, these, interrupted, extravars))
    reports = {}
    for result in together(calls):
        reports.update(result)
    return reports


def run_round(fleet, run_playbook, node_exec, baseline, first_backup, round_cases, balancer, records):
    """One round: interrupt each host (one case each), take each case's way back, check, reset."""
    nodes = fleet.nodes[: len(round_cases)]
    cases = dict(zip(nodes, round_cases, strict=True))
    drain = round_cases[0].drain
    extravars = drain_vars(drain, balancer, records)
    partials = interrupt(fleet, run_playbook, node_exec, cases, extravars)
    before = {n: unit_active(node_exec, n) for n in nodes}
    recorded = {n: bool(state_of(node_exec, n)) for n in nodes}
    interrupted = {}
    for n in nodes:
        backup = state_of(node_exec, n).get("backup_id")
        # Every round starts on the old stack: the first backup a run takes or reuses is the old stack's.
        if backup:
            first_backup.setdefault(n, backup)
        interrupted[n] = backup or first_backup.get(n, "")
    reports = take_ways_back(fleet, run_playbook, cases, interrupted, extravars)
    outcome = {}
    for node, case in cases.items():
        report = reports[node]
        if case.way == WAYS[0] and report.get("backup_id"):
            # A host interrupted before its first backup was complete gets it from the re-run.
            first_backup.setdefault(node, report["backup_id"])
        partial = partials.get(node) if case.way == WAYS[0] else None
        checks = end_checks(fleet, node_exec, node, baseline, drain, balancer, records, partial, recorded[node])
        ok = truthful(case, before[node], report)
        text = report["outcome"]
        if case.way == WAYS[0] and report["phases"].get("recover"):
            text += " (recover: " + report["phases"]["recover"] + ")"
        ROWS.append(
            {
                "how": case.how,
                "hook": case.hook,
                "drain": case.drain,
                "way": case.way,
                "host": node,
                "outcome": text,
                "checks": checks,
                "truthful": ok,
            }
        )
        outcome[node] = (checks, ok, text)
    append_matrix(ROWS)
    reset(fleet, run_playbook, node_exec, first_backup, nodes, extravars)
    return outcome


def assert_serving(outcome):
    bad = {n: o for n, o in outcome.items() if not (all(o[0].values()) and o[1])}
    assert not bad, bad


# In make integration-long since CI's budget grew: a killed run recovered by the next run is
# test_fault_injection's (make test); the rest of the matrix is long as well.
@pytest.mark.long
@pytest.mark.parametrize("pair", SLICE, ids=round_id)
def test_recovery_slice(fleet, run_playbook, node_exec, baseline, first_backup, balancer, tmp_path_factory, pair):
    records = tmp_path_factory.mktemp("drain-records")
    assert_serving(run_round(fleet, run_playbook, node_exec, baseline, first_backup, pair, balancer, records))


@pytest.mark.long
@pytest.mark.parametrize("round_cases", rounds(all_cases(), ROUND_HOSTS), ids=round_id)
def test_recovery_matrix(
    fleet, run_playbook, node_exec, baseline, first_backup, balancer, tmp_path_factory, round_cases
):
    records = tmp_path_factory.mktemp("drain-records")
    assert_serving(run_round(fleet, run_playbook, node_exec, baseline, first_backup, round_cases, balancer, records))


# --------------------------------------------------------------------------- lost records


def upgraded(fleet, run_playbook, node_exec, first_backup, nodes):
    result = upgrade(fleet, run_playbook, limit=",".join(nodes))
    for node in nodes:
        report = report_of(result, node)
        assert report["outcome"] == "upgraded", report
        assert sh(node_exec, node, "readlink -f /opt/gpufleet/serving/current") != OLD_VENV
        first_backup.setdefault(node, report["backup_id"])
    return result


# A full upgrade of two hosts, an audit and three rollbacks (about 16 minutes here): make integration-long.
@pytest.mark.long
def test_lost_backups_and_lost_run_record(fleet, run_playbook, node_exec, baseline, first_backup):
    """node1 loses its backups folder, node2 its state.json, both after an upgrade. The audit names node2's lost
    record; rollback.yml puts node1's backup back from the controller's copy (after refusing, naming the missing
    file, while the copy is incomplete) and rolls node2 back saying its record is missing and what the controller
    last knew. Both end on the old stack with a terminal record."""
    n1, n2 = fleet.nodes[:2]
    upgraded(fleet, run_playbook, node_exec, first_backup, [n1, n2])
    sh(node_exec, n1, f"rm -rf {BACKUPS}")
    sh(node_exec, n2, f"rm -f {STATE}")

    audit = run_playbook("playbooks/audit.yml", fleet.inventory, check=True, limit=n2, envvars=SUMMARY_ENV)
    verdict = audit.audit_reports()[n2]
    assert not verdict["in_sync"], verdict
    assert any(f"the host's run record {STATE} is missing" in line for line in verdict["drift"]), verdict["drift"]
    # One line: the venv is judged against the lock the host still keeps for the verified venv current points at,
    # not reported a second time as "records no lock".
    assert len(verdict["drift"]) == 1, verdict["drift"]

    copy = Path(fleet.inventory).parent / "controller" / "backups" / n1 / first_backup[n1]
    env_copy = next(p for p in copy.rglob("*.env") if p.is_file())
    kept = env_copy.read_bytes()
    env_copy.unlink()
    try:
        refused = rollback(fleet, run_playbook, [n1])
    finally:
        env_copy.write_bytes(kept)
    assert refused.rc != 0
    text = report_of(refused, n1)["outcome"]
    assert f"backup {first_backup[n1]} is gone from the host" in text, text
    assert f"{env_copy.relative_to(copy)} is missing" in text and "nothing was changed" in text, text
    assert sh(node_exec, n1, "readlink -f /opt/gpufleet/serving/current") != OLD_VENV, "a refusal changed the host"

    back = rollback(fleet, run_playbook, [n1, n2])
    assert back.rc == 0, str(back)
    one, two = report_of(back, n1)["outcome"], report_of(back, n2)["outcome"]
    assert one.startswith(f"rolled back to backup {first_backup[n1]}"), one
    assert "put back on the host from the controller copy" in one and "never upgraded" not in one, one
    assert f"the host's run record {STATE} is missing; last known from the controller: run " in two, two
    assert ": upgraded" in two, two
    for node in (n1, n2):
        checks = end_checks(fleet, node_exec, node, baseline, "none")
        assert all(checks.values()), (node, checks)
        assert sh(node_exec, node, "readlink -f /opt/gpufleet/serving/current") == OLD_VENV
        assert state_of(node_exec, node)["result"] == "rolled_back"


# --------------------------------------------------------------------------- a wheel cut short


class CuttingCache(http.server.BaseHTTPRequestHandler):
    """A site fleet cache (gpufleet_fleet_cache_url) that serves half of every wheel, announced as the whole: what a
    mirror that stops early looks like. Toolkit archives are served whole from the controller's redist cache."""

    controller = Path()

    def do_GET(self):
        name = self.path.rsplit("/", 1)[-1]
        if self.path.startswith("/wheels/"):
            found = [p for p in self.controller.rglob(name) if p.is_file() and "backups" not in p.parts]
            body = found[0].read_bytes()[: found[0].stat().st_size // 2] if found else None
        else:
            path = self.controller / "cache" / "redist" / self.path.split("/redist/", 1)[-1]
            body = path.read_bytes() if path.is_file() else None
        if body is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_a_wheel_cut_short_is_reported_as_a_truncated_download(fleet, run_playbook, node_exec, baseline, first_backup):
    node = fleet.nodes[0]
    if sh(node_exec, node, "readlink -f /opt/gpufleet/serving/current") != OLD_VENV:
        assert rollback(fleet, run_playbook, [node]).rc == 0, "the host could not be put back on the old stack"
    # The host must fetch: no wheel of the lock and no built venv of it left from earlier runs (the one current
    # points at is kept).
    sh(
        node_exec,
        node,
        "rm -rf /opt/gpufleet/wheelhouse; cd /opt/gpufleet/serving/venvs && cur=$(readlink -f ../current) && "
        'for v in *; do [ "$PWD/$v" = "$cur" ] || rm -rf "$v"; done',
    )
    CuttingCache.controller = Path(fleet.inventory).parent / "controller"
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), CuttingCache)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        result = upgrade(
            fleet, run_playbook, limit=node, gpufleet_fleet_cache_url=f"http://127.0.0.1:{server.server_port}"
        )
    finally:
        server.shutdown()
        server.server_close()
    outcome = report_of(result, node)["outcome"]
    assert outcome.startswith("rolled back:"), outcome
    assert "truncated download of " in outcome and "bytes (the lock's size)" in outcome, outcome
    assert "did not match the lock" not in outcome, outcome
    checks = end_checks(fleet, node_exec, node, baseline, "none")
    assert all(checks.values()) and sh(node_exec, node, "readlink -f /opt/gpufleet/serving/current") == OLD_VENV, checks
