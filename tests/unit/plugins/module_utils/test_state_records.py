# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A state file is validated before it is acted on, and an unfinished run is recovered only by the collection
version that started it (module_utils/_state.py validate_state, version_refusal)."""

from __future__ import annotations

import json

import pytest

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _state as st

NOW = "2026-12-08T00:00:00+00:00"
CV = st.COLLECTION_VERSION
# What issue 42 found believed: a record from the future, its schema and phase unknown here.
FUTURE = {
    "version": 2,
    "collection_version": "9.0.0",
    "run_id": "r9",
    "result": "in_progress",
    "phase": "quantum_switch",
    "status": "started",
    "backup_id": "b9",
}
KILLED = {
    "version": 1,
    "collection_version": CV,
    "run_id": "r1",
    "result": "in_progress",
    "phase": "drain",
    "status": "started",
    "backup_id": "b1",
}


class TestValidateState:
    def test_a_record_of_this_version_is_read(self):
        assert st.validate_state(KILLED, "/s.json") is KILLED
        # Written before the collection recorded its version: the schema is the same, so it is read.
        keyless = {k: v for k, v in KILLED.items() if k != "collection_version"}
        assert st.validate_state(dict(keyless, result="upgraded"), "/s.json")

    @pytest.mark.parametrize(
        ("change", "words"),
        [
            ({"version": 2}, "records schema version 2 (key version), this collection reads version 1"),
            ({"version": None}, "records schema version None (key version)"),
            ({"version": True}, "records schema version True"),
            ({"phase": "quantum_switch"}, "records phase 'quantum_switch', not a phase of the phase table (preflight,"),
            ({"result": "teleported"}, "records result 'teleported', not one of in_progress,"),
            ({"status": "half"}, "records status 'half', not one of started, completed"),
            ({"last_run": {"result": "teleported"}}, "records last_run.result 'teleported'"),
            ({"last_run": {"result": "upgraded", "phase": "warp"}}, "records last_run.phase 'warp'"),
            ({"last_run": ["r0"]}, "records last_run ['r0'], expected a JSON object"),
            ({"collection_version": 3}, "records collection_version 3, expected a version string"),
        ],
    )
    def test_an_unknown_value_is_refused_naming_the_file_the_value_and_the_fix(self, change, words):
        with pytest.raises(st.StateError) as err:
            st.validate_state(dict(KILLED, **change), "/var/lib/gpufleet/state.json")
        msg = str(err.value)
        assert msg.startswith(f"/var/lib/gpufleet/state.json {words}"), msg
        assert "nothing was changed; fix: run this host with the collection version that wrote it" in msg
        assert "move it aside" in msg and "playbooks/rollback.yml" in msg

    def test_the_future_record_names_its_writer(self):
        with pytest.raises(st.StateError, match=r"written by gpufleet.upgrade 9.0.0\); nothing was changed"):
            st.validate_state(FUTURE, "/s.json")

    def test_every_reader_gets_it_through_read_previous(self, tmp_path):
        path = tmp_path / "state.json"
        path.write_text(json.dumps(FUTURE))
        with pytest.raises(st.StateError, match=f"^{path} records schema version 2"):
            st.read_previous(str(path))
        path.write_text("{half")
        with pytest.raises(st.StateError, match=r"^state file unusable: .* is not valid JSON"):
            st.read_previous(str(path))
        path.unlink()
        assert st.read_previous(str(path)) == {}

    def test_a_run_never_writes_over_a_record_it_cannot_read(self):
        with pytest.raises(st.StateError):
            st.update_state(FUTURE, "r2", NOW, result="failed_preflight", reason="refused")


class TestVersionGuard:
    def test_this_version_resumes_its_own_interrupted_run(self):
        assert st.decide_recovery(KILLED, "r2")["action"] == "rollback"
        assert st.rollback_target(KILLED, "rb")["refuse"] == ""

    def test_another_version_refuses_with_both_versions_and_the_fix(self):
        killed = dict(KILLED, collection_version="0.1.9")
        decision = st.decide_recovery(killed, "r2", running="0.2.0")
        assert decision["action"] == "refuse" and decision["backup_id"] == "b1"
        assert decision["reason"] == (
            "run r1 was interrupted at phase drain (started) under gpufleet.upgrade 0.1.9; this is gpufleet.upgrade "
            "0.2.0, and only the version that started a run resumes or rolls it back; nothing was changed; fix: "
            "finish it with gpufleet.upgrade 0.1.9 (upgrade.yml resumes it, rollback.yml undoes it), or let 0.2.0 "
            "take it over to backup b1 with -e gpufleet_accept_version_change=true"
        )
        assert st.rollback_target(killed, "rb", running="0.2.0")["refuse"] == decision["reason"]
        assert st.rollback_target(killed, "rb", requested="b0", running="0.2.0")["refuse"] == decision["reason"]

    def test_the_operator_accepts_the_change_and_the_reason_says_so(self):
        killed = dict(KILLED, collection_version="0.1.9")
        decision = st.decide_recovery(killed, "r2", running="0.2.0", accept_version_change=True)
        assert decision["action"] == "rollback" and decision["backup_id"] == "b1"
        assert decision["reason"].endswith(
            "(started by gpufleet.upgrade 0.1.9, taken over by 0.2.0: gpufleet_accept_version_change)"
        )
        assert st.rollback_target(killed, "rb", running="0.2.0", accept_version_change=True) == {
            "backup_id": "b1",
            "why": "run r1 was interrupted at phase drain (started) (started by gpufleet.upgrade 0.1.9, taken over by "
            "0.2.0: gpufleet_accept_version_change)",
            "refuse": "",
        }

    def test_a_record_without_a_version_counts_as_another_version(self):
        keyless = {k: v for k, v in KILLED.items() if k != "collection_version"}
        decision = st.decide_recovery(keyless, "r2")
        assert decision["action"] == "refuse"
        assert (
            "under a gpufleet.upgrade that recorded no version (state.json has no collection_version"
            in (decision["reason"])
        )
        assert "finish it with the version that started it, if you know it" in decision["reason"]

    def test_a_failed_rollback_of_another_version_names_the_version(self):
        failed = dict(KILLED, result="rollback_failed", collection_version="0.1.9", reason="x")
        reason = st.decide_recovery(failed, "r2", running="0.2.0")["reason"]
        assert reason.startswith("the rollback of run r1 failed under gpufleet.upgrade 0.1.9")

    @pytest.mark.parametrize("result", ["upgraded", "repaired", "rolled_back", "failed_preflight", "prepared"])
    def test_an_ended_run_of_another_version_is_no_concern(self, result):
        ended = dict(KILLED, result=result, collection_version="0.1.9")
        assert st.decide_recovery(ended, "r2", running="0.2.0")["action"] == "none"
        assert st.rollback_target(ended, "rb", running="0.2.0")["refuse"] == ""

    def test_a_new_record_names_the_version_that_writes_it(self):
        state = st.update_state(dict(KILLED, result="upgraded"), "r2", NOW, phase="backup", status="started")
        assert state["collection_version"] == CV and state["version"] == st.STATE_VERSION
        assert state["last_run"]["collection_version"] == CV


class TestRefusalKeepsTheRecord:
    """A run refused before it changed anything does not end the unfinished run's record: the next run still has to
    recover the host, or refuse it."""

    @pytest.mark.parametrize(
        "unfinished",
        [
            dict(KILLED, collection_version="0.1.9"),
            dict(KILLED, result="rollback_failed", reason="restart failed"),
            KILLED,
            {k: v for k, v in KILLED.items() if k != "backup_id"},
        ],
    )
    def test_the_next_run_sees_the_unfinished_run(self, unfinished):
        before = st.decide_recovery(unfinished, "r2")
        refused = st.update_state(unfinished, "r2", NOW, result="failed_preflight", reason="failed preflight: ...")
        assert refused == unfinished
        assert st.decide_recovery(refused, "r3") == before and before["action"] != "none"

    def test_a_refusal_after_an_ended_run_is_recorded(self):
        refused = st.update_state(dict(KILLED, result="upgraded"), "r2", NOW, result="failed_preflight", reason="x")
        assert refused["run_id"] == "r2" and refused["result"] == "failed_preflight"
