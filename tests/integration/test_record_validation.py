# Copyright: (c) 2026, gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A record the collection cannot act on, or an unfinished run another collection version started, is refused by
the audit, the upgrade and the rollback with nothing changed on an upgraded lab host (issue 42 "records are
validated", issue 44 "version guard"): the serving unit keeps its main process and its start time, the state file its
bytes, the host its links and backups. A rollback refused before it changed anything reads "nothing rolled back",
never "ROLLBACK FAILED"."""

from __future__ import annotations

import json
import shlex

import pytest

from lab.harness import run_playbook as _run_playbook

pytestmark = [pytest.mark.integration, pytest.mark.slow]

STATE = "/var/lib/gpufleet/state.json"
SUMMARY_ENV = {"ANSIBLE_CALLBACKS_ENABLED": "gpufleet.upgrade.upgrade_summary", "ANSIBLE_TIMEOUT": "60"}
# What issue 42 planted: a state file from the future, its schema and its phase unknown to this collection.
FUTURE = {
    "version": 2,
    "collection_version": "9.0.0",
    "run_id": "20991231T000000Z-1",
    "result": "in_progress",
    "phase": "quantum_switch",
    "status": "started",
    "history": [],
}


@pytest.fixture(scope="module")
def host(lab_fleet):
    fleet = lab_fleet(1, name="recval")
    first = _run_playbook("playbooks/upgrade.yml", fleet.inventory, envvars=SUMMARY_ENV)
    assert first.rc == 0, first
    return fleet


def sh(node_exec, node, script):
    return node_exec(node, ["sh", "-c", script], check=True).stdout.strip()


def observed(node_exec, node):
    """What any change would move: the server's main process and start, the links, the backups, the state file."""
    return sh(
        node_exec,
        node,
        "systemctl show -p MainPID -p ActiveEnterTimestamp gpufleet-serving; readlink /opt/gpufleet/serving/current; "
        f"readlink /usr/local/cuda; ls /var/lib/gpufleet/backups; sha256sum {STATE}; "
        "test -e /var/lib/gpufleet/upgrade.lock && echo lock held || true",
    )


def plant(node_exec, node, text):
    sh(node_exec, node, f"printf '%s' {shlex.quote(text)} > {STATE}")


def report_of(result, node):
    found = [t for t in result.tasks("Publish the host's report", host=node) if "ansible_facts" in t.res]
    assert found, f"{node} published no report\n{result}"
    return found[-1].res["ansible_facts"]["gpufleet_upgrade_report"]


@pytest.fixture
def kept_state(host, node_exec):
    """The host's own state file, put back after the test."""
    node = host.nodes[0]
    sh(node_exec, node, f"cp -p {STATE} /root/state.json.kept")
    yield node
    sh(node_exec, node, f"cp -p /root/state.json.kept {STATE}")


def test_a_state_file_from_the_future_is_refused_by_audit_upgrade_and_rollback(
    host, kept_state, run_playbook, node_exec
):
    node = kept_state
    plant(node_exec, node, json.dumps(FUTURE))
    before = observed(node_exec, node)
    problem = f"{STATE} records schema version 2 (key version), this collection reads version 1"

    audit = run_playbook("playbooks/audit.yml", host.inventory, check=True, envvars=SUMMARY_ENV)
    verdict = audit.audit_reports()[node]
    assert not verdict["in_sync"], verdict
    assert [line for line in verdict["drift"] if line.startswith(problem)], verdict["drift"]

    upgrade = run_playbook("playbooks/upgrade.yml", host.inventory, envvars=SUMMARY_ENV)
    report = report_of(upgrade, node)
    assert upgrade.rc != 0 and report["outcome_kind"] == "failed_preflight", report
    assert problem in report["outcome"] and "nothing was changed; fix:" in report["outcome"], report
    assert "rolled back" not in report["outcome"] and "interrupted at phase quantum_switch" not in upgrade.stdout
    assert observed(node_exec, node) == before

    rollback = run_playbook("playbooks/rollback.yml", host.inventory, envvars=SUMMARY_ENV)
    report = report_of(rollback, node)
    assert rollback.rc != 0 and report["outcome_kind"] == "rollback_refused", report
    assert report["outcome"].startswith("nothing rolled back: Read the host's run record: " + problem), report
    assert "ROLLBACK FAILED" not in rollback.stdout
    assert observed(node_exec, node) == before


def test_a_rollback_of_a_host_whose_state_is_not_json_changed_nothing_and_says_so(
    host, kept_state, run_playbook, node_exec
):
    node = kept_state
    plant(node_exec, node, "{half a record")
    before = observed(node_exec, node)
    rollback = run_playbook("playbooks/rollback.yml", host.inventory, envvars=SUMMARY_ENV)
    report = report_of(rollback, node)
    assert report["outcome_kind"] == "rollback_refused", report
    assert report["outcome"].startswith(
        f"nothing rolled back: Read the host's run record: state file unusable: {STATE} is not valid JSON"
    ), report
    assert "ROLLBACK FAILED" not in rollback.stdout and "ROLLBACK FAILED" not in report["outcome"]
    assert observed(node_exec, node) == before


def test_an_interrupted_run_of_another_version_is_refused_until_the_operator_accepts(
    host, kept_state, run_playbook, node_exec
):
    node = kept_state
    backup = sh(node_exec, node, "ls /var/lib/gpufleet/backups | tail -1")
    interrupted = dict(
        FUTURE, version=1, collection_version="0.1.9", phase="drain", backup_id=backup, run_id="20261201T000000Z-1"
    )
    plant(node_exec, node, json.dumps(interrupted))
    before = observed(node_exec, node)
    guard = "run 20261201T000000Z-1 was interrupted at phase drain (started) under gpufleet.upgrade 0.1.9; this is"

    upgrade = run_playbook("playbooks/upgrade.yml", host.inventory, envvars=SUMMARY_ENV)
    report = report_of(upgrade, node)
    assert upgrade.rc != 0 and report["outcome_kind"] == "failed_preflight", report
    assert guard in report["outcome"] and "-e gpufleet_accept_version_change=true" in report["outcome"], report
    # The refusal leaves the record as it was: a second run is refused the same way.
    assert observed(node_exec, node) == before

    rollback = run_playbook("playbooks/rollback.yml", host.inventory, envvars=SUMMARY_ENV)
    report = report_of(rollback, node)
    assert report["outcome_kind"] == "rollback_refused" and guard in report["outcome"], report
    assert observed(node_exec, node) == before

    accepted = run_playbook(
        "playbooks/rollback.yml",
        host.inventory,
        extravars={"gpufleet_accept_version_change": True},
        envvars=SUMMARY_ENV,
    )
    report = report_of(accepted, node)
    assert accepted.rc == 0 and report["outcome_kind"] == "restored", report
    assert report["outcome"].startswith(f"rolled back to backup {backup} (run 20261201T000000Z-1 was interrupted"), (
        report
    )
    assert "(started by gpufleet.upgrade 0.1.9, taken over by" in report["outcome"], report
    state = json.loads(sh(node_exec, node, f"cat {STATE}"))
    assert state["result"] == "rolled_back" and state["collection_version"] != "0.1.9", state
