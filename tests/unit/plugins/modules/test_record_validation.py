# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The readers of the host's records refuse what this collection cannot act on, and an unfinished run another
collection version started (issue 42 "records are validated", issue 44 "version guard"): modules upgrade_state,
preflight_probe, host_state and backup_info, and the outcome of a rollback that changed nothing."""

from __future__ import annotations

import json

import pytest
from ansible.module_utils.testing import patch_module_args
from module_harness import Exit, Fail

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _backup as bk
from ansible_collections.gpufleet.upgrade.plugins.module_utils._version import COLLECTION_VERSION
from ansible_collections.gpufleet.upgrade.plugins.modules import backup_info, host_state, preflight_probe, upgrade_state
from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _outcome as o

FUTURE = {"version": 2, "run_id": "r9", "result": "in_progress", "phase": "quantum_switch", "backup_id": "b9"}
KILLED = {
    "version": 1,
    "run_id": "r1",
    "result": "in_progress",
    "phase": "drain",
    "status": "started",
    "backup_id": "b1",
    "collection_version": "0.1.9",
}


def call(module, args):
    with patch_module_args(dict(args, _ansible_check_mode=False)), pytest.raises((Exit, Fail)) as info:
        module.main()
    return info.type is Exit, info.value.args[0]


@pytest.fixture
def state(tmp_path):
    return tmp_path / "state.json"


def test_upgrade_state_refuses_a_future_record_and_never_writes_over_it(state):
    state.write_text(json.dumps(FUTURE))
    before = state.read_bytes()
    ok, res = call(upgrade_state, {"path": str(state), "run_id": "r2", "state": "query"})
    assert not ok and res["msg"].startswith(f"{state} records schema version 2 (key version)"), res
    assert "nothing was changed; fix:" in res["msg"]
    ok, res = call(upgrade_state, {"path": str(state), "run_id": "r2", "result": "failed_preflight", "reason": "x"})
    assert not ok and state.read_bytes() == before


def test_upgrade_state_refuses_an_unknown_phase_of_a_known_schema(state):
    state.write_text(json.dumps(dict(FUTURE, version=1)))
    ok, res = call(upgrade_state, {"path": str(state), "run_id": "r2", "state": "query"})
    assert not ok and res["msg"].startswith(f"{state} records phase 'quantum_switch', not a phase of the phase table")


def test_upgrade_state_query_refuses_another_versions_interrupted_run_unless_accepted(state):
    state.write_text(json.dumps(KILLED))
    ok, res = call(upgrade_state, {"path": str(state), "run_id": "rb", "state": "query"})
    assert ok and res["recovery"]["action"] == "refuse"
    assert res["rollback"]["refuse"].startswith(
        "run r1 was interrupted at phase drain (started) under gpufleet.upgrade"
    )
    assert f"this is gpufleet.upgrade {COLLECTION_VERSION}" in res["rollback"]["refuse"]
    assert "-e gpufleet_accept_version_change=true" in res["rollback"]["refuse"]
    ok, res = call(upgrade_state, {"path": str(state), "run_id": "rb", "state": "query", "accept_version_change": True})
    assert (
        ok
        and res["recovery"]["action"] == "rollback"
        and res["rollback"]
        == {
            "backup_id": "b1",
            "why": "run r1 was interrupted at phase drain (started) (started by gpufleet.upgrade 0.1.9, taken over by "
            f"{COLLECTION_VERSION}: gpufleet_accept_version_change)",
            "refuse": "",
        }
    )


def test_upgrade_state_records_its_collection_version(state):
    ok, res = call(upgrade_state, {"path": str(state), "run_id": "r1", "phase": "backup", "status": "started"})
    assert ok and json.loads(state.read_text())["collection_version"] == COLLECTION_VERSION


def probe_args(tmp_path, state):
    (tmp_path / "serving").mkdir()
    (tmp_path / "local").mkdir()
    return {
        "state_path": str(state),
        "run_id": "r2",
        "serving_root": str(tmp_path / "serving"),
        "toolkit_root": str(tmp_path / "local"),
        "toolkit_version": "13.0",
    }


def test_the_preflight_probe_refuses_a_future_record(tmp_path, state):
    state.write_text(json.dumps(FUTURE))
    ok, res = call(preflight_probe, probe_args(tmp_path, state))
    assert not ok and res["msg"].startswith(f"{state} records schema version 2"), res


def test_the_preflight_probe_refuses_another_versions_interrupted_run_unless_accepted(tmp_path, state):
    state.write_text(json.dumps(KILLED))
    args = probe_args(tmp_path, state)
    ok, res = call(preflight_probe, args)
    assert ok and res["state"]["recovery"]["action"] == "refuse"
    assert "under gpufleet.upgrade 0.1.9; this is gpufleet.upgrade" in res["state"]["recovery"]["reason"]
    ok, res = call(preflight_probe, dict(args, accept_version_change=True))
    assert ok and res["state"]["recovery"]["action"] == "rollback"
    assert "gpufleet_accept_version_change" in res["state"]["recovery"]["reason"]


def test_the_host_model_names_a_future_record_and_is_not_in_sync(state):
    state.write_text(json.dumps(FUTURE))
    ok, res = call(host_state, {"state_path": str(state)})
    assert ok and not res["in_sync"] and res["drifted"] == ["run record"] and res["last_run"] == {}, res
    assert res["drift"][0].startswith(f"{state} records schema version 2 (key version)")


def test_backup_info_refuses_a_future_manifest_naming_it(tmp_path):
    folder = tmp_path / "backups" / "20261202T130000Z-aaaaaaaa"
    (folder / "files").mkdir(parents=True)
    snapshot = {"venv": {}, "cuda": {}, "files": [], "results": []}
    manifest = bk.build_manifest(folder.name, "t", {"name": "node1"}, "lab", "r1", snapshot, {})
    bk.write_manifest(str(folder), dict(manifest, format=2, collection_version="9.0.0"))
    ok, res = call(backup_info, {"state_dir": str(tmp_path), "host": "node1"})
    assert not ok and res["msg"].startswith(
        f"node1: backup {folder.name} is unusable: {folder}/manifest.json records format 2 (key format)"
    )
    assert "written by gpufleet.upgrade 9.0.0, restore it with that version; nothing was changed; fix:" in res["msg"]


def test_a_rollback_that_changed_nothing_says_so_and_is_no_failed_rollback():
    refused = o.outcome("rollback_refused", "Read the host's run record: state file unusable", "n1", "b1")
    assert refused["text"] == "nothing rolled back: Read the host's run record: state file unusable"
    assert not refused["ok"] and not refused["counts_as_failure"] and refused["state_result"] is None
    assert o.KINDS["rollback_refused"].label != o.KINDS["rollback_failed"].label
