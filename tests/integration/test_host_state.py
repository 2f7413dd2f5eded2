# Copyright: (c) 2026, gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One model of a host's state (role assess, module host_state) on two lab hosts: a converged host is left alone
(check, apply, check and apply again change nothing), every kind of damage shows in the audit in words, fails the
audit with gpufleet_audit_fail_on_drift, and a re-run repairs exactly it."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SITE = "$(readlink -f /opt/gpufleet/serving/current)/lib/python3.11/site-packages"
ENV_FILE = "/etc/gpufleet/gpufleet-serving.env"
UNIT_FILE = "/etc/systemd/system/gpufleet-serving.service"
HEADER = "/usr/local/cuda-13.0/include/cuda_runtime.h"
# Damage of the serving venv (node 1) and of the files around it (node 2), each independent of the others.
DAMAGE = {
    0: (
        f"SP={SITE}; rm -rf $SP/six-*.dist-info $SP/six.py; "
        "mkdir -p $SP/extra_tool-1.0.dist-info; "
        "printf 'Metadata-Version: 2.1\\nName: extra-tool\\nVersion: 1.0\\n' > $SP/extra_tool-1.0.dist-info/METADATA; "
        "echo '# edited' >> $SP/lab_sglang/__init__.py"
    ),
    1: (
        f"sed -i 's#^CUDA_HOME=.*#CUDA_HOME=\"/usr/local/cuda-12.8\"#' {ENV_FILE}; "
        f"sed -i 's#^Restart=.*#Restart=no#' {UNIT_FILE}; echo '// edited' >> {HEADER}; "
        # Link policy keep: the link belongs where it was before the toolkit came (recorded in its marker).
        "ln -sfn /usr/local/cuda-13.0 /usr/local/cuda"
    ),
}
EXPECTED = {
    0: [
        "serving venv: extra-tool 1.0 not in the lock",
        "serving venv: lab-sglang 0.5.9: lab_sglang/__init__.py edited",
        "serving venv: six 1.17.0 missing",
    ],
    1: [
        "CUDA 13.0.2 toolkit: include/cuda_runtime.h edited",
        "cuda link: /usr/local/cuda resolves to /usr/local/cuda-13.0, the profile wants /usr/local/cuda-12.8",
        "gpufleet-serving.service: line 12 is 'Restart=no', the template has 'Restart=on-failure'",
        "gpufleet-serving.env: CUDA_HOME is /usr/local/cuda-12.8, profile wants /usr/local/cuda-13.0",
    ],
}


@pytest.fixture(scope="module")
def fleet(lab_fleet):
    return lab_fleet(2, name="state")


def sh(node_exec, node, script):
    return node_exec(node, ["sh", "-c", script], check=True).stdout.strip()


def audits(result):
    return result.audit_reports()


def reports(result):
    found = {}
    for r in result.tasks("Publish the host's report"):
        if "ansible_facts" in r.res:
            found[r.host] = r.res["ansible_facts"]["gpufleet_upgrade_report"]
    return found


def upgrade(fleet, run_playbook, **kw):
    return run_playbook("playbooks/upgrade.yml", fleet.inventory, extravars={"gpufleet_batch_size": 2}, **kw)


def test_a_converged_host_is_left_alone(fleet, run_playbook):
    first = upgrade(fleet, run_playbook)
    assert first.rc == 0, first
    assert {r["outcome"] for r in reports(first).values()} == {"upgraded"}, reports(first)
    # The four steps: check, apply, check, apply. Nothing changes and every host says it is at the profile.
    for check in (True, False, True, False):
        again = upgrade(fleet, run_playbook, check=check, diff=check)
        assert again.rc == 0, again
        changed = [f"{r.host}: {r.task}" for r in again.changed_tasks()]
        assert changed == [], changed
        assert {r["outcome"] for r in reports(again).values()} == {"already at lab (in sync)"}, reports(again)
        assert all(set(r["phases"]) == {"preflight", "assess"} for r in reports(again).values()), reports(again)
    audit = run_playbook("playbooks/audit.yml", fleet.inventory, check=True, diff=True)
    assert audit.rc == 0 and audit.changed_tasks() == [], audit
    assert all(r["in_sync"] for r in audits(audit).values()), audits(audit)


def test_every_damage_is_named_and_repaired(fleet, run_playbook, node_exec):
    for index, script in DAMAGE.items():
        sh(node_exec, fleet.nodes[index], script)
    audit = run_playbook("playbooks/audit.yml", fleet.inventory, check=True, diff=True)
    assert audit.rc == 0, audit
    for index, lines in EXPECTED.items():
        node = fleet.nodes[index]
        assert audits(audit)[node]["drift"] == lines, audits(audit)[node]
        # A drifted host counts as changed (the audit's one changed task), an in-sync host would not.
        changed = [r.task for r in audit.changed_tasks(node)]
        assert len(changed) == 1 and changed[0].endswith("Compare the host with the profile"), changed
    strict = run_playbook(
        "playbooks/audit.yml", fleet.inventory, check=True, extravars={"gpufleet_audit_fail_on_drift": True}
    )
    assert strict.rc != 0, strict

    check = upgrade(fleet, run_playbook, check=True, diff=True)
    assert check.rc == 0, check
    for index, lines in EXPECTED.items():
        outcome = reports(check)[fleet.nodes[index]]["outcome"]
        assert outcome == "would repair (check mode: nothing changed): " + "; ".join(lines), outcome

    repair = upgrade(fleet, run_playbook)
    assert repair.rc == 0, repair
    for index, lines in EXPECTED.items():
        node = fleet.nodes[index]
        assert reports(repair)[node]["outcome"] == "repaired: " + "; ".join(lines), reports(repair)[node]
    # The damaged venv is never changed: node 1 runs a venv built beside it.
    assert ".repair-" in sh(node_exec, fleet.nodes[0], "readlink -f /opt/gpufleet/serving/current")
    assert "cuda-13.0" in sh(node_exec, fleet.nodes[1], f"grep ^CUDA_HOME= {ENV_FILE}")
    assert sh(node_exec, fleet.nodes[1], "readlink -f /usr/local/cuda") == "/usr/local/cuda-12.8"
    assert sh(node_exec, fleet.nodes[1], "systemctl is-active gpufleet-serving") == "active"

    after = run_playbook("playbooks/audit.yml", fleet.inventory, check=True, diff=True)
    assert all(r["in_sync"] for r in audits(after).values()), audits(after)
    silent = upgrade(fleet, run_playbook)
    assert silent.rc == 0 and silent.changed_tasks() == [], [r.task for r in silent.changed_tasks()]


def test_audit_of_one_host_under_limit(fleet, run_playbook):
    one = run_playbook("playbooks/audit.yml", fleet.inventory, check=True, limit=fleet.nodes[1])
    assert one.rc == 0, one
    assert set(audits(one)) == {fleet.nodes[1]}


def test_rollback_after_a_repair_lands_on_the_consistent_old_stack(fleet, run_playbook, node_exec):
    """After the repair, "roll back" means the host before its upgrade: never the backup of the drifted state
    (node 2's, taken with the cu130 venv and CUDA_HOME of 12.8, is recorded inconsistent), and the restored host is
    checked with the model: the backed-up venv, links and files, CUDA_HOME fitting the venv's CUDA builds, and the
    server running with it."""
    import json

    newest = sh(node_exec, fleet.nodes[1], "ls /var/lib/gpufleet/backups | tail -1")
    drifted = json.loads(sh(node_exec, fleet.nodes[1], f"cat /var/lib/gpufleet/backups/{newest}/manifest.json"))
    assert drifted["state"]["model"]["on_profile"] is True and drifted["state"]["model"]["in_sync"] is False
    assert drifted["state"]["consistent"] is False
    assert any("built for CUDA 13.0, CUDA_HOME /usr/local/cuda-12.8" in p for p in drifted["state"]["problems"])

    back = run_playbook("playbooks/rollback.yml", fleet.inventory, extravars={"gpufleet_rollback_all": True})
    assert back.rc == 0, back
    # What the restored server runs is read from its main process (/proc), as on any server.
    running = {
        r.host: r.res
        for r in back.tasks("Check that the server runs from the restored venv with the restored CUDA_HOME")
    }
    assert set(running) == set(fleet.nodes) and all(r["problems"] == [] for r in running.values()), running
    chosen = {node: back.task("Read the backup", host=node).res for node in fleet.nodes}
    judged = {r.host: r.res["ansible_facts"]["rollback_check"] for r in back.tasks("Judge the restored host")}
    for node in fleet.nodes:
        assert chosen[node]["passed_over"], chosen[node]
        assert newest not in chosen[node]["backup_id"] or node != fleet.nodes[1]
        assert chosen[node]["manifest"]["state"]["consistent"] is True, chosen[node]["manifest"]["state"]
        assert judged[node]["differences"] == [] and judged[node]["consistent"], judged[node]
        assert judged[node]["cuda_home"] == "/usr/local/cuda-12.8", judged[node]
        venv = sh(node_exec, node, "readlink -f /opt/gpufleet/serving/current")
        torch = sh(
            node_exec, node, f"{venv}/bin/python -c 'import importlib.metadata as m; print(m.version(\"lab-torch\"))'"
        )
        assert torch.endswith("+cu128"), (node, venv, torch)
        port = fleet.serving_port(node)
        info = json.loads(sh(node_exec, node, f"curl -s http://127.0.0.1:{port}/get_server_info"))
        assert info["gpufleet_lab"]["cuda_home"] == "/usr/local/cuda-12.8", info["gpufleet_lab"]


# --------------------------------------------------------------------------- what runs, not only what was written

DROP_IN_DIR = "/etc/systemd/system/gpufleet-serving.service.d"
OLD_ENV = "/etc/gpufleet/old-cuda.env"


@pytest.fixture(scope="module")
def one_node(lab_fleet):
    return lab_fleet(1, name="runs")


def test_a_drop_in_is_named_refused_and_a_stale_server_restarted(one_node, run_playbook, node_exec):
    """A drop-in someone else wrote sets CUDA_HOME through its own environment file: the audit names it, the
    upgrade refuses before changing anything and says how to fix it. Once removed (systemd reloaded, the unit not
    restarted) the server still runs with the old CUDA_HOME: the audit says so, and a re-run restarts the unit."""
    node = one_node.nodes[0]
    first = upgrade(one_node, run_playbook)
    assert first.rc == 0 and reports(first)[node]["outcome"] == "upgraded", reports(first)
    sh(
        node_exec,
        node,
        f"mkdir -p {DROP_IN_DIR} && echo CUDA_HOME=/usr/local/cuda-12.8 > {OLD_ENV} && "
        f"printf '[Service]\\nEnvironmentFile={OLD_ENV}\\n' > {DROP_IN_DIR}/override.conf && "
        "systemctl daemon-reload && systemctl restart gpufleet-serving",
    )
    pid = sh(node_exec, node, "systemctl show -p MainPID --value gpufleet-serving")
    line = (
        f"serving unit: drop-in {DROP_IN_DIR}/override.conf adds EnvironmentFile={OLD_ENV}, which sets "
        "CUDA_HOME=/usr/local/cuda-12.8, the profile wants /usr/local/cuda-13.0"
    )
    audit = run_playbook("playbooks/audit.yml", one_node.inventory, check=True, diff=True)
    assert audit.rc == 0, audit
    assert audits(audit)[node]["drift"] == [line], audits(audit)[node]

    refused = upgrade(one_node, run_playbook)
    assert refused.rc != 0 and node in reports(refused), refused
    report = reports(refused)[node]
    assert report["outcome_kind"] == "failed_preflight", report
    assert f"{DROP_IN_DIR}/override.conf" in report["outcome"] and "daemon-reload" in report["outcome"], report
    # Nothing was changed: the same server runs on.
    assert sh(node_exec, node, "systemctl show -p MainPID --value gpufleet-serving") == pid

    sh(node_exec, node, f"rm -rf {DROP_IN_DIR} {OLD_ENV} && systemctl daemon-reload")
    stale = run_playbook("playbooks/audit.yml", one_node.inventory, check=True)
    assert audits(stale)[node]["drift"] == [
        f"serving process: the running server (pid {pid}) runs with CUDA_HOME=/usr/local/cuda-12.8, the unit gives "
        "CUDA_HOME=/usr/local/cuda-13.0: restart the unit"
    ], audits(stale)[node]

    repair = upgrade(one_node, run_playbook)
    assert repair.rc == 0, repair
    assert reports(repair)[node]["outcome"] == "repaired: " + audits(stale)[node]["drift"][0], reports(repair)[node]
    assert sh(node_exec, node, "systemctl show -p MainPID --value gpufleet-serving") != pid
    after = run_playbook("playbooks/audit.yml", one_node.inventory, check=True)
    assert audits(after)[node]["in_sync"], audits(after)[node]
