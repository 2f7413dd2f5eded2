# Copyright: (c) 2026, gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Fault injection on lab hosts: no failure at any phase boundary leaves a host half-upgraded.

Each round injects one fault per host (a failing task at a phase boundary, a killed ansible-playbook, a corrupted
download, a full disk, a serving unit that will not start on the new venv), then checks on every host: it serves from
the old venv, the old toolkit is byte-for-byte intact, /usr/local/cuda is where it was, no stray files remain at final
paths, the lock is released; then a plain re-run converges to the new stack, and rollback.yml returns the host to its
first backup for the next round. The rows are written to reports/fault-injection.md (ignored) at the end of the
module; `make fault-injection-doc` runs the module with GPUFLEET_UPDATE_DOCS=1 to refresh the committed
docs/fault-injection.md, so a CI run leaves the clone as it found it.
"""

from __future__ import annotations

import datetime
import http.server
import json
import os
import re
import signal
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from lab import nodes as labnodes

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
# The committed table is refreshed on purpose (make fault-injection-doc), never as a side effect of make test.
REPORT = REPO / ("docs" if os.environ.get("GPUFLEET_UPDATE_DOCS") == "1" else "reports") / "fault-injection.md"
SERVING_ROOT = "/opt/gpufleet/serving"
OLD_VENV = f"{SERVING_ROOT}/venvs/lab-cu128-seed"
OLD_TOOLKIT = "/usr/local/cuda-12.8"
NEW_TOOLKIT = "/usr/local/cuda-13.0"
ARCHIVE_DIR = "/usr/local/.gpufleet-redist"  # where cuda_toolkit pushes the redist archives on a host
NEW_SGLANG = "0.5.9"  # lab profile: lab-sglang ==0.5.9
STRAY = (
    r"find /usr/local /opt/gpufleet /var/lib/gpufleet /etc/gpufleet /etc/systemd/system -maxdepth 3 "
    r"\( -name '*.partial*' -o -name '.partial-*' -o -name '*rollback-partial*' -o -name '.current.new' "
    r"-o -name '*.tmp' -o -name '.state.json.*' -o -name '.upgrade.lock.*' \) -print"
)
# Makes the serving unit refuse to start unless `current` is the old venv: "won't start on the new venv".
WONT_START_DROPIN = "/etc/systemd/system/gpufleet-serving.service.d/50-fault-injection.conf"
PARKED = (
    "python3 -c \"import json; s = json.load(open('/var/lib/gpufleet/state.json')); print(s['phase'], s['status'])\" "
    "2>/dev/null | tr -d '\\n'; pgrep -f 'sleep 900' >/dev/null && echo ' parked'"
)
# The lab shares two cores with other work: give SSH room so a busy machine is not an unreachable host.
SUMMARY_ENV = {
    "ANSIBLE_CALLBACKS_ENABLED": "gpufleet.upgrade.upgrade_summary",
    "ANSIBLE_TIMEOUT": "60",
    "ANSIBLE_SSH_RETRIES": "3",
}
ROWS: list[dict] = []


# --------------------------------------------------------------------------- helpers


def sh(node_exec, node, script):
    res = node_exec(node, ["sh", "-c", script])
    return res.stdout.strip()


def toolkit_digest(node_exec, node, root=OLD_TOOLKIT):
    """sha256 over every file's sha256 and every link's target: byte-for-byte identity of a toolkit tree."""
    return sh(
        node_exec,
        node,
        f"cd {root} && {{ find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum; "
        f"find . -type l -printf '%p -> %l\\n' | LC_ALL=C sort; }} | sha256sum | cut -d' ' -f1",
    )


def served_stack(node_exec, node, port):
    """The packages the running server loaded (its sys.prefix is the `current` link, so it cannot tell)."""
    raw = sh(node_exec, node, f"curl -fsS --max-time 10 http://127.0.0.1:{port}/get_server_info || true")
    try:
        return json.loads(raw)["gpufleet_lab"]["distributions"]
    except (ValueError, KeyError):
        return f"not answering ({raw[:80]!r})"


def host_checks(fleet, node_exec, node, baseline):
    """The safety checks after an injection: each value True when it holds."""
    new_toolkit = sh(
        node_exec,
        node,
        f"if [ -e {NEW_TOOLKIT} ]; then test -f {NEW_TOOLKIT}/version.json && {NEW_TOOLKIT}/bin/nvcc --version "
        ">/dev/null && echo complete || echo incomplete; else echo absent; fi",
    )
    strays = sh(node_exec, node, STRAY)
    return {
        "serves old venv": served_stack(node_exec, node, fleet.serving_port(node)) == baseline[node]["served"],
        "current -> old venv": sh(node_exec, node, "readlink -f /opt/gpufleet/serving/current") == OLD_VENV,
        "old toolkit intact": toolkit_digest(node_exec, node) == baseline[node]["toolkit"],
        "/usr/local/cuda unchanged": sh(node_exec, node, "readlink /usr/local/cuda") == OLD_TOOLKIT,
        "no stray files": strays == "" and new_toolkit in ("absent", "complete"),
        "lock released": sh(node_exec, node, "test -e /var/lib/gpufleet/upgrade.lock && echo held || echo free")
        == "free",
    }


def report_of(result, node):
    found = [t for t in result.tasks("Publish the host's report", host=node) if "ansible_facts" in t.res]
    assert found, f"{node} published no report\n{result}"
    return found[-1].res["ansible_facts"]["gpufleet_upgrade_report"]


def per_host(values, default):
    """An extra var that Ansible templates per host: {host: value} with a default."""
    return f"{{{{ {json.dumps(values)}[inventory_hostname] | default({json.dumps(default)}) }}}}"


def upgrade(fleet, run_playbook, limit=None, **extravars):
    extravars.setdefault("gpufleet_batch_size", len(fleet.nodes))
    # Every round adds backups; the first one (old state) is where each round resets to: keep it.
    extravars.setdefault("backup_keep", 30)
    extravars.setdefault("gpufleet_max_fail_percentage", 100)
    return run_playbook("playbooks/upgrade.yml", fleet.inventory, extravars=extravars, envvars=SUMMARY_ENV, limit=limit)


def converge_and_reset(fleet, run_playbook, node_exec, first_backup, nodes=None):
    """Plain re-run must upgrade every host; then roll back to the first backup for the next round."""
    nodes = nodes or fleet.nodes
    result = upgrade(fleet, run_playbook, limit=",".join(nodes))
    converged = {}
    for node in nodes:
        report = report_of(result, node)
        served = served_stack(node_exec, node, fleet.serving_port(node))
        converged[node] = (
            report["outcome"] == "upgraded"
            and isinstance(served, dict)
            and served.get("lab-sglang") == NEW_SGLANG
            and sh(node_exec, node, "readlink -f /opt/gpufleet/serving/current") != OLD_VENV
        )
    for node in nodes:
        back = run_playbook(
            "playbooks/rollback.yml",
            fleet.inventory,
            extravars={"rollback_backup_id": first_backup[node], "rollback_server_info_url": ""},
            envvars=SUMMARY_ENV,
            limit=node,
        )
        assert back.rc == 0, str(back)
    return converged, result


def record(point, how, node, report, checks, converged):
    ROWS.append(
        {
            "point": point,
            "how": how,
            "host": node,
            "outcome": report["outcome"],
            "checks": checks,
            "converged": converged,
            "safe": all(checks.values())
            and converged
            and report["outcome"].startswith(("rolled back", "failed preflight")),
        }
    )


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def fleet(lab_fleet):
    # A name per session: two sessions running this module must not recreate each other's nodes.
    return lab_fleet(2, name="safe-fi")


@pytest.fixture(scope="module")
def baseline(fleet):
    """Each host before any run: digest of its old toolkit, packages its server loaded."""
    return {
        node: {
            "toolkit": toolkit_digest(labnodes.node_exec, node),
            "served": served_stack(labnodes.node_exec, node, fleet.serving_port(node)),
        }
        for node in fleet.nodes
    }


@pytest.fixture(scope="module")
def first_backup(fleet):
    """Id of each host's backup of the old state, taken by the first round that reaches the backup."""
    return {}


@pytest.fixture(scope="module", autouse=True)
def write_report():
    yield
    if ROWS:
        write_markdown(ROWS)


def write_markdown(rows):
    checks = list(rows[0]["checks"])
    lines = [
        "# Fault injection: injection point -> outcome",
        "",
        "Generated by `pytest tests/integration/test_fault_injection.py` on lab hosts "
        f"({datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}). Do not edit by hand.",
        "",
        "A row is **safe** when, after the injected failure, the host serves from the old venv (the running server "
        "loaded exactly the old packages), the old toolkit is byte-for-byte intact (sha256 over the tree), "
        "`/usr/local/cuda` points where it did, no partial file is left at a final path (and a `/usr/local/cuda-13.0` "
        "that exists is complete), the host lock is released, the run reported the host as rolled back / failed "
        "preflight with a reason, and a plain re-run then upgraded the host.",
        "The test-only hook is `gpufleet_fault_inject` (`after_preflight`, `after_backup`, `after_toolkit`, "
        "`after_venv`, `after_postcheck`; `gpufleet_fault_action=hang` parks the run there so the test can kill it).",
        "",
        "| injection point | how | host | outcome reported | " + " | ".join(checks) + " | re-run converges | verdict |",
        "|---|---|---|---|" + "---|" * len(checks) + "---|---|",
    ]
    for row in rows:
        outcome = row["outcome"].replace("|", "/")
        if len(outcome) > 140:
            outcome = outcome[:137] + "..."
        marks = " | ".join("yes" if row["checks"][c] else "**NO**" for c in checks)
        lines.append(
            f"| {row['point']} | {row['how']} | {row['host']} | {outcome} | {marks} | "
            f"{'yes' if row['converged'] else '**NO**'} | {'safe' if row['safe'] else '**UNSAFE**'} |"
        )
    # The file's later sections (the recovery matrix of test_recovery_matrix.py) are kept: this module owns its table.
    previous = REPORT.read_text(encoding="utf-8") if REPORT.exists() else ""
    later = previous[previous.index("\n## ") :] if "\n## " in previous else ""
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    REPORT.write_text("\n".join(lines) + "\n" + later, encoding="utf-8")
    print(f"fault injection: {len(rows)} rows written to {REPORT.relative_to(REPO)}")


# --------------------------------------------------------------------------- rounds


def run_round(fleet, run_playbook, node_exec, baseline, first_backup, faults, how, **extravars):
    result = upgrade(fleet, run_playbook, gpufleet_fault_inject=per_host(faults, "none"), **extravars)
    nodes = list(faults)
    outcomes = {}
    for node in nodes:
        report = report_of(result, node)
        first_backup.setdefault(node, report["backup_id"])
        outcomes[node] = (report, host_checks(fleet, node_exec, node, baseline))
    converged, _result = converge_and_reset(fleet, run_playbook, node_exec, first_backup, nodes)
    for node in nodes:
        report, checks = outcomes[node]
        record(faults[node], how[node], node, report, checks, converged[node])
    return outcomes, converged


def assert_safe(outcomes, converged, expect):
    for node, (report, checks) in outcomes.items():
        assert report["outcome"].startswith(expect[node]), report
        assert all(checks.values()), (node, checks)
        assert converged[node], (node, "plain re-run did not converge")


# CI's budget: the rounds before the drain and the damaged downloads run in make integration-long (and in
# make fault-injection-doc); make test keeps the failures after the switch, the unit that will not start on the
# new venv with a refused preflight, and the killed run. The toolkit's bad downloads are test_cuda_toolkit's
# and a wheel cut short is test_recovery_matrix's, both in make test.
@pytest.mark.long
def test_failing_task_after_backup_and_after_toolkit(fleet, run_playbook, node_exec, baseline, first_backup):
    n1, n2 = fleet.nodes
    outcomes, converged = run_round(
        fleet,
        run_playbook,
        node_exec,
        baseline,
        first_backup,
        {n1: "after_backup", n2: "after_toolkit"},
        {n1: "failing task", n2: "failing task"},
    )
    assert_safe(outcomes, converged, {n1: "rolled back", n2: "rolled back"})
    assert "cuda_toolkit" in outcomes[n2][0]["phases"]


def test_failing_task_after_switch_and_after_postcheck(fleet, run_playbook, node_exec, baseline, first_backup):
    n1, n2 = fleet.nodes
    outcomes, converged = run_round(
        fleet,
        run_playbook,
        node_exec,
        baseline,
        first_backup,
        {n1: "after_venv", n2: "after_postcheck"},
        {n1: "failing task (new venv serving)", n2: "failing task (post-check passed)"},
    )
    assert_safe(outcomes, converged, {n1: "rolled back", n2: "rolled back"})
    assert "rolled back to backup" in outcomes[n1][0]["phases"]["rollback"]


def test_serving_unit_wont_start_and_failing_preflight(fleet, run_playbook, node_exec, baseline, first_backup):
    n1, n2 = fleet.nodes
    sh(
        node_exec,
        n2,
        f"mkdir -p $(dirname {WONT_START_DROPIN}) && printf '[Service]\\nExecStartPre=/bin/sh -c "
        f'"test $(readlink -f /opt/gpufleet/serving/current) = {OLD_VENV}"\\n\' > {WONT_START_DROPIN} '
        "&& systemctl daemon-reload && systemctl restart gpufleet-serving",
    )
    try:
        # One run per host: a host refused early must not change what the other host's run does.
        refused = upgrade(fleet, run_playbook, limit=n1, gpufleet_fault_inject="after_preflight")
        wont_start = upgrade(fleet, run_playbook, limit=n2)
        outcomes = {
            n1: (report_of(refused, n1), host_checks(fleet, node_exec, n1, baseline)),
            n2: (report_of(wont_start, n2), host_checks(fleet, node_exec, n2, baseline)),
        }
    finally:
        sh(node_exec, n2, f"rm -f {WONT_START_DROPIN} && systemctl daemon-reload && systemctl restart gpufleet-serving")
    converged, _result = converge_and_reset(fleet, run_playbook, node_exec, first_backup)
    record("after_preflight", "failing task", n1, outcomes[n1][0], outcomes[n1][1], converged[n1])
    record(
        "venv_rebuild (restart)",
        "serving unit won't start on the new venv",
        n2,
        outcomes[n2][0],
        outcomes[n2][1],
        converged[n2],
    )
    assert_safe(outcomes, converged, {n1: "failed preflight", n2: "rolled back"})


def test_killed_run_is_rolled_back_by_the_next_run(fleet, run_playbook, node_exec, baseline, first_backup):
    """ansible-playbook is killed while parked after the switch; the next run finds the stale lock and the
    interrupted state, rolls back first (checked by stopping it right after recovery), and a plain run converges."""
    env = dict(
        os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), PATH=f"{REPO / '.venv' / 'bin'}:{os.environ['PATH']}"
    )
    cmd = [
        str(REPO / ".venv" / "bin" / "ansible-playbook"),
        "-i",
        str(fleet.inventory),
        str(REPO / "playbooks" / "upgrade.yml"),
        "-e",
        json.dumps({"gpufleet_batch_size": 2, "gpufleet_fault_inject": "after_venv", "gpufleet_fault_action": "hang"}),
    ]
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True
    )
    deadline = time.time() + 540
    try:
        while time.time() < deadline:
            parked = [n for n in fleet.nodes if sh(node_exec, n, PARKED) == "venv_rebuild completed parked"]
            if len(parked) == len(fleet.nodes) or proc.poll() is not None:
                break
            time.sleep(3)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    for n in fleet.nodes:
        sh(node_exec, n, "pkill -f 'sleep 900' || true")
        assert sh(node_exec, n, "test -e /var/lib/gpufleet/upgrade.lock && echo held") == "held", (
            "the killed run held no lock"
        )
        assert sh(node_exec, n, "readlink -f /opt/gpufleet/serving/current") != OLD_VENV, "killed before the switch"
    result = upgrade(fleet, run_playbook, gpufleet_fault_inject="after_preflight")
    outcomes = {}
    for n in fleet.nodes:
        report = report_of(result, n)
        outcomes[n] = (report, host_checks(fleet, node_exec, n, baseline))
        assert "interrupted at phase venv_rebuild" in report["phases"].get("recover", ""), report
        lock_task = result.task("Take the upgrade lock", host=n)
        assert "stale lock of dead run" in lock_task.msg, lock_task.msg
    converged, _result = converge_and_reset(fleet, run_playbook, node_exec, first_backup)
    for n in fleet.nodes:
        report, checks = outcomes[n]
        report = dict(report, outcome="rolled back by the next run: " + report["phases"]["recover"])
        record("after_venv", "ansible-playbook killed (SIGKILL)", n, report, checks, converged[n])
        assert all(checks.values()), (n, checks)
        assert converged[n]


class CorruptingProxy(http.server.BaseHTTPRequestHandler):
    """Forwards to the lab redist mirror and flips bytes in every archive it serves."""

    upstream = ""

    def do_GET(self):
        with urllib.request.urlopen(self.upstream + self.path, timeout=60) as resp:
            body = bytearray(resp.read())
        if self.path.endswith(".tar.xz") and len(body) > 4096:
            body[2048:2064] = b"\x00" * 16
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(bytes(body))

    def log_message(self, *args):
        pass


@pytest.mark.long
def test_corrupted_download_and_full_disk(
    fleet, run_playbook, node_exec, baseline, first_backup, tmp_path, lab_mirrors
):
    n1, n2 = fleet.nodes
    for n in fleet.nodes:  # a host that never had the new toolkit, so the download really happens
        sh(node_exec, n, f"rm -rf {NEW_TOOLKIT} /usr/local/.gpufleet-redist")
    CorruptingProxy.upstream = f"http://127.0.0.1:{lab_mirrors.ports['redist']}"
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), CorruptingProxy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        corrupt = upgrade(
            fleet,
            run_playbook,
            limit=n1,
            gpufleet_redist_url=f"http://127.0.0.1:{server.server_port}/redist",
            cuda_toolkit_cache_dir=str(tmp_path / "redist-cache"),
        )
    finally:
        server.shutdown()
    out1 = (report_of(corrupt, n1), host_checks(fleet, node_exec, n1, baseline))

    def mount_tmpfs(node, size, folder):
        pid = subprocess.run(
            ["podman", "inspect", "-f", "{{.State.Pid}}", node], capture_output=True, text=True, check=True
        ).stdout.strip()
        mount = ["nsenter", "-t", pid, "-m", "sh", "-c"]
        subprocess.run([*mount, f"mkdir -p {folder} && mount -t tmpfs -o size={size} tmpfs {folder}"], check=True)
        return [*mount, f"umount {folder}; rmdir {folder} || true"]

    # One run, two full disks: n2 cannot hold the toolkit's archives; n1 gets the toolkit, then its venv build finds
    # no room (one page of tmpfs over the build's uv cache under the serving root, which uv fills at once). An earlier
    # round's verified venv of the lock would be reused without a build: n1 keeps only the old one.
    sh(node_exec, n1, f"find {SERVING_ROOT}/venvs -mindepth 1 -maxdepth 1 ! -path {OLD_VENV} -exec rm -rf {{}} +")
    unmounts = [
        mount_tmpfs(n2, "256k", "/usr/local/.gpufleet-redist"),
        mount_tmpfs(n1, "4k", f"{SERVING_ROOT}/.uv-build-cache"),
    ]
    try:
        full = upgrade(fleet, run_playbook, limit=f"{n1},{n2}", cuda_toolkit_cache_dir=str(tmp_path / "redist-cache-2"))
        out2 = (report_of(full, n2), host_checks(fleet, node_exec, n2, baseline))
        out3 = (report_of(full, n1), host_checks(fleet, node_exec, n1, baseline))
    finally:
        for unmount in unmounts:
            subprocess.run(unmount, check=False)
    # The cause, the need and the fix reach the run's report whole; the venv the build began is gone in the same run.
    venv_full = out3[0]["outcome"]
    cause = re.search(
        rf"the new venv (\S+) failed at step sync: (no space left on {SERVING_ROOT}/.uv-build-cache "
        rf"on {n1}: need \d+\.\d\d GiB, free 0\.00 GiB); the partial venv was removed",
        venv_full,
    )
    assert cause and venv_full.endswith("or move gpufleet_serving_root to a larger disk, then run again"), venv_full
    assert sh(node_exec, n1, f"test -e {cause.group(1)} && echo left || echo removed") == "removed", cause.group(1)
    for node, (report, _checks) in ((n1, out1), (n2, out2)):  # the backup of the old state, when run on its own
        first_backup.setdefault(node, report["backup_id"])
    converged, _result = converge_and_reset(fleet, run_playbook, node_exec, first_backup)
    record("cuda_toolkit (download)", "corrupted archive from the mirror", n1, out1[0], out1[1], converged[n1])
    record(
        "cuda_toolkit (archives to the host)",
        "full disk (256 KiB tmpfs under the archive dir)",
        n2,
        out2[0],
        out2[1],
        converged[n2],
    )
    # The table keeps 140 characters of a row's outcome: this row shows the outcome from the cause on.
    shown = dict(out3[0], outcome=f"{venv_full.split(':')[0]}: ... {cause.group(2)}; the partial venv was removed")
    record(
        "venv_rebuild (build)",
        "full disk (4 KiB tmpfs over the build's uv cache; partial venv removed)",
        n1,
        shown,
        out3[1],
        converged[n1],
    )
    assert_safe({n1: out1, n2: out2}, converged, {n1: "rolled back", n2: "rolled back"})
    assert_safe({n1: out3}, converged, {n1: "rolled back"})


def test_every_row_is_safe():
    assert ROWS, "no fault was injected"
    unsafe = [row for row in ROWS if not row["safe"]]
    assert not unsafe, unsafe
