# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Prepare ahead, then roll, on one lab node: ``gpufleet_stop_after: prepare`` builds and verifies the new venv
beside the old one and drains nothing (the serving unit keeps its process, ``current`` keeps its venv, the report
says "prepared for lab (not switched)", state.json says prepared); the rollout that follows reuses that venv and only
drains, switches, checks and undrains; the audit then finds the host in sync. A value that would leave the host
drained is refused before any host changes."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

STATE = "/var/lib/gpufleet/state.json"
CURRENT = "/opt/gpufleet/serving/current"
UNIT = "gpufleet-serving"
BUILD_TASK = "Pull the locked wheels, build the new venv and verify it"
# gpufleet_drain stop: a drain that ran would stop the unit, so its process id tells whether one did.
EXTRA = {"gpufleet_drain": "stop", "gpufleet_batch_size": 1}


@pytest.fixture(scope="module")
def fleet(lab_fleet):
    return lab_fleet(1, name="pa")


def sh(node_exec, node, script):
    return node_exec(node, ["sh", "-c", script], check=True).stdout.strip()


def serving(node_exec, node):
    """The serving unit's main process and the venv current points at."""
    return (
        sh(node_exec, node, f"systemctl show -p MainPID --value {UNIT}"),
        sh(node_exec, node, f"readlink -f {CURRENT}"),
    )


def report_of(result, node):
    return result.task("Publish the host's report", node).res["ansible_facts"]["gpufleet_upgrade_report"]


def fleet_record(result, node):
    facts = result.task("Publish the host's report", node).res["ansible_facts"]
    doc = json.loads((Path(facts["gpufleet_run_dir"]) / "report.json").read_text())
    return next(h for h in doc["hosts"] if h["host"] == node)


def timed_upgrade(fleet, run_playbook, **extra):
    started = time.monotonic()
    result = run_playbook("playbooks/upgrade.yml", fleet.inventory, extravars={**EXTRA, **extra})
    return result, round(time.monotonic() - started, 1)


def test_a_stop_point_that_would_leave_the_host_drained_is_refused(fleet, run_playbook, node_exec):
    node = fleet.nodes[0]
    before = serving(node_exec, node)
    refused = timed_upgrade(fleet, run_playbook, gpufleet_stop_after="drain")[0]
    assert refused.rc != 0, refused
    assert f"{node}: gpufleet_stop_after is 'drain'" in refused.stdout and "cuda_toolkit, prepare)" in refused.stdout
    # Refused on the controller: no task reached the host.
    assert "Run the phases up to the host model" not in refused.stdout, refused
    assert serving(node_exec, node) == before


def test_prepare_ahead_then_roll_out(fleet, run_playbook, node_exec):
    node = fleet.nodes[0]
    pid, old_venv = serving(node_exec, node)
    assert pid not in ("", "0"), pid

    prepared, prepare_s = timed_upgrade(fleet, run_playbook, gpufleet_stop_after="prepare")
    assert prepared.rc == 0, prepared
    report = report_of(prepared, node)
    assert (report["outcome"], report["outcome_kind"]) == ("prepared for lab (not switched)", "prepared"), report
    assert "drain" not in report["phases"] and "venv_rebuild" not in report["phases"], report["phases"]
    assert serving(node_exec, node) == (pid, old_venv), "the prepare-ahead run touched the serving unit or current"
    # The note names the venv it built and verified: "ok: <path> built and verified (lock ...), the host still serving".
    new_venv = report["phases"]["prepare"].split()[1]
    assert new_venv != old_venv and "the host still serving" in report["phases"]["prepare"], report["phases"]
    assert sh(node_exec, node, f"cat {new_venv}/.gpufleet-verified"), f"{new_venv} is not marked verified"
    built = prepared.tasks(BUILD_TASK, node)
    assert built and built[0].changed, built
    state = json.loads(sh(node_exec, node, f"cat {STATE}"))
    assert (state["result"], state["phase"]) == ("prepared", "prepare"), state

    rolled, roll_s = timed_upgrade(fleet, run_playbook)
    assert rolled.rc == 0, rolled
    assert report_of(rolled, node)["outcome"] == "upgraded", report_of(rolled, node)
    # The verified venv of the same lock is reused: the build step does not run.
    assert all(r.status == "skipped" for r in rolled.tasks(BUILD_TASK, node)), rolled.tasks(BUILD_TASK, node)
    new_pid, current = serving(node_exec, node)
    assert current == new_venv and new_pid != pid, (new_pid, current)
    assert json.loads(sh(node_exec, node, f"cat {STATE}"))["result"] == "upgraded"

    audit = run_playbook("playbooks/audit.yml", fleet.inventory, check=True)
    assert audit.rc == 0 and audit.audit_reports()[node]["in_sync"], audit.audit_reports()

    durations = {p["name"]: p["duration_s"] for p in fleet_record(rolled, node)["phases"]}
    print(
        f"\nprepare-ahead run {prepare_s} s; rollout {roll_s} s (its cuda_toolkit {durations.get('cuda_toolkit')} s,"
        f" prepare {durations.get('prepare')} s; downtime {fleet_record(rolled, node)['downtime_s']} s)"
    )
