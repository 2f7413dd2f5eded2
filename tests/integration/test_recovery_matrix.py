# Copyright: (c) 2026, gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Every way back ends serving: interruption point x way back, on lab hosts.

An interruption is a killed ansible-playbook (parked at a phase's test hook with gpufleet_fault_action=hang, then
SIGKILL, with gpufleet_drain none, stop or haproxy) or a failing task at that hook. A way back is a re-run of
upgrade.yml, rollback.yml, or rollback.yml naming the interrupted run's backup. After it, every host must serve one
consistent stack (the old one, or the new one: the running server loaded exactly that venv's packages and `current`
points at it), its state.json must hold a terminal result, the lock must be released, the drain undone (unit
active; under HAProxy the server ready with no drain record left), /usr/local/cuda where it was, and the report must
say what was done (a unit that was down is reported as restarted, never as "serving unit answers").

`make test` runs the wheel cut short by the fleet cache; the slice (a host killed right after its stop drain, back
through rollback.yml and through upgrade.yml), the rest of the matrix (72 cases, two per round) and the lost records
(a host whose backups folder or state.json is gone) are marked `long` (`make integration-long`). The
rows are appended to the fault-injection document (reports/fault-injection.md, or docs/ with GPUFLEET_UPDATE_DOCS=1)
as a second table.
"""

from __future__ import annotations

import datetime
import http.server
import json
import os
import signal
import subprocess
import threading
import time
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

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _drain_haproxy as hx
from lab import haproxy as lab_haproxy
from lab import nodes as labnodes

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPORT = REPO / ("docs" if os.environ.get("GPUFLEET_UPDATE_DOCS") == "1" else "reports") / "fault-injection.md"
MATRIX_HEADING = "## Recovery matrix: interruption x way back"
HOOKS = ("after_preflight", "after_backup", "after_toolkit", "after_drain", "after_venv", "after_postcheck")
DRAINS = ("none", "stop", "haproxy")
WAYS = ("upgrade.yml", "rollback.yml", "rollback.yml -e rollback_backup_id")
STATE = "/var/lib/gpufleet/state.json"
BACKUPS = "/var/lib/gpufleet/backups"
# The hook parks with `sleep 900`; the bracket keeps pgrep from matching the shell that runs it.
PARKED = "pgrep -f 'sleep [9]00' >/dev/null && echo parked"
ROWS: list[dict] = []


@dataclass(frozen=True)
class Case:
    hook: str
    how: str  # killed | failing
    drain: str
    way: str

    @property
    def label(self):
        way = self.way.split()[0].removesuffix(".yml") + ("-id" if "rollback_backup_id" in self.way else "")
        return f"{self.how}-{self.hook}-{self.drain}-{way}"


def all_cases():
    killed = [Case(h, "killed", d, w) for h in HOOKS for d in DRAINS for w in WAYS]
    failing = [Case(h, "failing", "none", w) for h in HOOKS for w in WAYS]
    return killed + failing


def pairs(cases):
    """Two cases per round, one per host, of the same drain (one drain setting per run); the slice's pairs first."""
    rest = [c for c in cases if not any(c in pair for pair in SLICE)]
    by_drain = {}
    for case in rest:
        by_drain.setdefault(case.drain, []).append(case)
    out = []
    for group in by_drain.values():
        out += [tuple(group[i : i + 2]) for i in range(0, len(group), 2)]
    return out


# The slice make test runs (two cases per round, one per host): the drained host killed mid-run and each way back.
SLICE = [(Case("after_drain", "killed", "stop", WAYS[1]), Case("after_drain", "killed", "stop", WAYS[0]))]


# --------------------------------------------------------------------------- helpers


def playbook_env():
    return dict(
        os.environ,
        ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
        PATH=f"{REPO / '.venv' / 'bin'}:{os.environ['PATH']}",
        **SUMMARY_ENV,
    )


def kill_parked(fleet, node_exec, hooks, extravars, timeout=900):
    """Run upgrade.yml with each host's hook set to hang, SIGKILL ansible-playbook once every such host is parked."""
    nodes = list(hooks)
    args = {
        "gpufleet_batch_size": len(nodes),
        "backup_keep": 30,
        "gpufleet_fault_inject": per_host(hooks, "none"),
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
    log = Path(fleet.inventory).parent / f"killed-run-{int(time.time())}.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            cmd, cwd=REPO, env=playbook_env(), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    deadline = time.time() + timeout
    parked = []
    try:
        while time.time() < deadline and proc.poll() is None:
            parked = [n for n in nodes if sh(node_exec, n, PARKED) == "parked"]
            if len(parked) == len(nodes):
                break
            time.sleep(2)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    for n in nodes:
        sh(node_exec, n, "pkill -f 'sleep [9]00' || true")
    tail = log.read_text(errors="replace")[-3000:]
    assert len(parked) == len(nodes), (
        f"not every host parked at its hook: {parked} of {hooks}; rc {proc.returncode}\n{tail}"
    )


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


def end_checks(fleet, node_exec, node, baseline, drain, balancer=None, records=None):
    """What must hold after a way back: each value True when it does."""
    served = served_stack(node_exec, node, fleet.serving_port(node))
    current = sh(node_exec, node, "readlink -f /opt/gpufleet/serving/current")
    old = served == baseline[node] and current == OLD_VENV
    new = isinstance(served, dict) and served.get("lab-sglang") == NEW_SGLANG and current != OLD_VENV
    drained_out = False
    if drain == "haproxy":
        drained_out = haproxy_admin(balancer, node) != "ready" or any(Path(records).glob("*.json"))
    return {
        "serves one stack": old or new,
        "state terminal": state_of(node_exec, node).get("result") not in (None, "in_progress"),
        "lock released": sh(node_exec, node, "test -e /var/lib/gpufleet/upgrade.lock && echo held || echo free")
        == "free",
        "drain undone": unit_active(node_exec, node) and not drained_out,
        "/usr/local/cuda unchanged": sh(node_exec, node, "readlink /usr/local/cuda") == OLD_TOOLKIT,
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
    # A name per session (two sessions must not recreate each other's nodes); GPUFLEET_LAB_NAME reuses a kept lab.
    return lab_fleet(2, name=os.environ.get("GPUFLEET_LAB_NAME") or f"rm-{os.getpid() % 100000}")


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


def append_matrix(rows):
    """The matrix as a second table of the fault-injection document (replacing an earlier one)."""
    checks = list(rows[0]["checks"])
    lines = [
        MATRIX_HEADING,
        "",
        "Generated by `pytest tests/integration/test_recovery_matrix.py` on lab hosts "
        f"({datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}, {len(rows)} cases). "
        "Do not edit by hand.",
        "",
        "Each row: the interruption (a killed ansible-playbook parked at the hook, or a failing task there, under the "
        "drain named), then the way back; the checks after it; whether the way back's report said what was done "
        "(a restart reported as one). `make integration-long` runs every case; `make test` a slice.",
        "",
        "| interruption | drain | way back | host | way back reported | "
        + " | ".join(checks)
        + " | truthful | verdict |",
        "|---|---|---|---|---|" + "---|" * len(checks) + "---|---|",
    ]
    for row in rows:
        outcome = row["outcome"].replace("|", "/")
        if len(outcome) > 160:
            outcome = outcome[:157] + "..."
        marks = " | ".join("yes" if row["checks"][c] else "**NO**" for c in checks)
        ok = all(row["checks"].values()) and row["truthful"]
        lines.append(
            f"| {row['how']} {row['hook']} | {row['drain']} | {row['way']} | {row['host']} | {outcome} | {marks} | "
            f"{'yes' if row['truthful'] else '**NO**'} | {'serving' if ok else '**NOT SERVING**'} |"
        )
    text = REPORT.read_text(encoding="utf-8") if REPORT.exists() else "# Fault injection\n"
    text = text.split("\n" + MATRIX_HEADING)[0].rstrip("\n") + "\n\n"
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    REPORT.write_text(text + "\n".join(lines) + "\n", encoding="utf-8")
    print(f"recovery matrix: {len(rows)} rows written to {REPORT.relative_to(REPO)}")


# --------------------------------------------------------------------------- the matrix


def run_pair(fleet, run_playbook, node_exec, baseline, first_backup, pair, balancer, records):
    """One round: interrupt each host (one case each), take each case's way back, check, reset."""
    nodes = fleet.nodes[: len(pair)]
    cases = dict(zip(nodes, pair, strict=False))
    drain = pair[0].drain
    extravars = drain_vars(drain, balancer, records)
    killed = {n: c.hook for n, c in cases.items() if c.how == "killed"}
    failing = {n: c.hook for n, c in cases.items() if c.how == "failing"}
    if killed:
        kill_parked(fleet, node_exec, killed, extravars)
    if failing:
        upgrade(
            fleet, run_playbook, limit=",".join(failing), gpufleet_fault_inject=per_host(failing, "none"), **extravars
        )
    before = {n: unit_active(node_exec, n) for n in nodes}
    interrupted = {}
    for n in nodes:
        backup = state_of(node_exec, n).get("backup_id")
        # Every round starts on the old stack: the first backup a run takes or reuses is the old stack's.
        if backup:
            first_backup.setdefault(n, backup)
        interrupted[n] = backup or first_backup.get(n, "")
    reports = {}
    for way in WAYS:
        these = [n for n, c in cases.items() if c.way == way]
        if not these:
            continue
        if way == WAYS[0]:
            result = upgrade(fleet, run_playbook, limit=",".join(these), **extravars)
        elif way == WAYS[1]:
            result = rollback(fleet, run_playbook, these, **extravars)
        else:
            named = per_host({n: interrupted[n] for n in these}, "")
            result = rollback(fleet, run_playbook, these, rollback_backup_id=named, **extravars)
        reports.update({n: report_of(result, n) for n in these})
    outcome = {}
    for node, case in cases.items():
        checks = end_checks(fleet, node_exec, node, baseline, drain, balancer, records)
        ok = truthful(case, before[node], reports[node])
        text = reports[node]["outcome"]
        if case.way == WAYS[0] and reports[node]["phases"].get("recover"):
            text += " (recover: " + reports[node]["phases"]["recover"] + ")"
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
    reset(fleet, run_playbook, node_exec, first_backup, nodes, extravars)
    return outcome


def assert_serving(outcome):
    bad = {n: o for n, o in outcome.items() if not (all(o[0].values()) and o[1])}
    assert not bad, bad


# In make integration-long since CI's budget grew: a killed run recovered by the next run is
# test_fault_injection's (make test); the rest of the matrix is long as well.
@pytest.mark.long
@pytest.mark.parametrize("pair", SLICE, ids=lambda p: "+".join(c.label for c in p))
def test_recovery_slice(fleet, run_playbook, node_exec, baseline, first_backup, balancer, tmp_path_factory, pair):
    records = tmp_path_factory.mktemp("drain-records")
    assert_serving(run_pair(fleet, run_playbook, node_exec, baseline, first_backup, pair, balancer, records))


@pytest.mark.long
@pytest.mark.parametrize(
    "pair",
    pairs(all_cases()),
    ids=lambda p: "+".join(c.label for c in p),
)
def test_recovery_matrix(fleet, run_playbook, node_exec, baseline, first_backup, balancer, tmp_path_factory, pair):
    records = tmp_path_factory.mktemp("drain-records")
    assert_serving(run_pair(fleet, run_playbook, node_exec, baseline, first_backup, pair, balancer, records))


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
    n1, n2 = fleet.nodes
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
