# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

import json
import os

import pytest

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _state as st

NOW = "2026-12-02T13:00:00+00:00"
# Records of runs this collection version started (an unfinished run of another version is refused: TestVersionGuard).
CV = st.COLLECTION_VERSION
KILLED_AT = {"run_id": "r1", "result": "in_progress", "collection_version": CV}


def lock(run_id="r1", pid=4242, controller="ctl"):
    return st.new_lock(run_id, pid, "100", controller, NOW)


class TestLockJudge:
    def test_free_host(self):
        assert st.judge_lock(None, "r2", "ctl")[0] == "free"

    def test_own_lock_is_kept(self):
        assert st.judge_lock(lock("r2"), "r2", "ctl")[0] == "ours"

    def test_dead_holder_on_this_controller_is_taken_over_and_named(self):
        verdict, msg = st.judge_lock(lock(), "r2", "ctl", holder_alive=lambda pid, start: False)
        assert verdict == "takeover"
        assert "stale lock of dead run r1" in msg and "pid 4242" in msg

    def test_dead_holder_without_takeover_names_the_fix(self):
        verdict, msg = st.judge_lock(lock(), "r2", "ctl", holder_alive=lambda p, s: False, takeover_dead=False)
        assert verdict == "held"
        assert "gpufleet_lock_break=r1" in msg

    def test_live_holder_refuses(self):
        verdict, msg = st.judge_lock(lock(), "r2", "ctl", holder_alive=lambda p, s: True)
        assert verdict == "held"
        assert "running run r1" in msg

    def test_other_controller_cannot_be_checked(self):
        verdict, msg = st.judge_lock(lock(controller="other"), "r2", "ctl", holder_alive=lambda p, s: False)
        assert verdict == "held"
        assert "cannot be checked from controller ctl" in msg and "gpufleet_lock_break=r1" in msg

    def test_operator_break_of_the_named_run_only(self):
        assert st.judge_lock(lock(controller="other"), "r2", "ctl", break_run_id="r1")[0] == "takeover"
        assert st.judge_lock(lock(controller="other"), "r2", "ctl", break_run_id="r9")[0] == "held"

    def test_corrupt_lock_is_rejected(self):
        with pytest.raises(st.StateError, match="lacks"):
            st.check_lock({"run_id": "r1"})
        with pytest.raises(st.StateError, match="not a number"):
            st.check_lock({"run_id": "r1", "pid": "x", "controller": "c", "started": NOW})


class TestProcess:
    def test_own_process_is_alive_and_a_reused_pid_is_not(self):
        start = st.process_start(os.getpid())
        assert start is not None
        assert st.process_alive(os.getpid(), start)
        assert not st.process_alive(os.getpid(), str(int(start) + 1))

    def test_stat_with_parentheses_in_the_name(self, tmp_path):
        (tmp_path / "7").mkdir()
        fields = " ".join(str(i) for i in range(3, 30))
        (tmp_path / "7" / "stat").write_text(f"7 (a) b) {fields}")
        assert st.process_start(7, proc=str(tmp_path)) == "22"
        assert st.process_start(8, proc=str(tmp_path)) is None


class TestFiles:
    def test_atomic_write_and_read(self, tmp_path):
        path = str(tmp_path / "sub" / "state.json")
        st.write_json_atomic(path, {"a": 1})
        assert st.read_json(path) == {"a": 1}
        assert os.listdir(tmp_path / "sub") == ["state.json"]

    def test_exclusive_create_has_one_winner(self, tmp_path):
        path = str(tmp_path / "upgrade.lock")
        assert st.create_exclusive(path, lock("r1"))
        assert not st.create_exclusive(path, lock("r2"))
        assert st.read_json(path)["run_id"] == "r1"
        assert sorted(os.listdir(tmp_path)) == ["upgrade.lock"]

    def test_non_json_and_non_object(self, tmp_path):
        (tmp_path / "bad").write_text("{half")
        (tmp_path / "list").write_text("[1]")
        with pytest.raises(st.StateError, match="not valid JSON"):
            st.read_json(str(tmp_path / "bad"))
        with pytest.raises(st.StateError, match="list"):
            st.read_json(str(tmp_path / "list"))
        assert st.read_json(str(tmp_path / "absent")) is None


class TestStateAndRecovery:
    def test_new_run_starts_clean_and_records_history(self):
        s1 = st.update_state({}, "r1", NOW, phase="preflight", status="started", profile="lab")
        assert s1["result"] == "in_progress" and s1["history"] == [
            {"phase": "preflight", "status": "started", "at": NOW}
        ]
        s2 = st.update_state(s1, "r1", "later", phase="preflight", status="completed")
        assert len(s2["history"]) == 2 and s2["profile"] == "lab"

    def test_repeating_a_write_is_no_change(self):
        s1 = st.update_state({}, "r1", NOW, phase="backup", status="completed", backup_id="b1")
        s2 = st.update_state(
            json.loads(json.dumps(s1)), "r1", "later", phase="backup", status="completed", backup_id="b1"
        )
        assert st.same_state(s1, s2)
        s3 = st.update_state(s2, "r1", "later", result="upgraded")
        assert not st.same_state(s2, s3)

    def test_bad_values_are_refused(self):
        with pytest.raises(st.StateError):
            st.update_state({}, "r1", NOW, phase="compile")
        with pytest.raises(st.StateError):
            st.update_state({}, "r1", NOW, result="maybe")

    @pytest.mark.parametrize(
        ("state", "action"),
        [
            ({}, "none"),
            ({"run_id": "r1", "result": "upgraded"}, "none"),
            ({"run_id": "r1", "result": "rolled_back"}, "none"),
            (
                {
                    "run_id": "r1",
                    "result": "in_progress",
                    "phase": "backup",
                    "status": "started",
                    "collection_version": CV,
                },
                "restart",
            ),
            (
                {
                    "run_id": "r1",
                    "result": "in_progress",
                    "phase": "cuda_toolkit",
                    "backup_id": "b1",
                    "collection_version": CV,
                },
                "rollback",
            ),
            ({"run_id": "r1", "result": "rollback_failed", "backup_id": "b1", "reason": "x"}, "refuse"),
            ({"run_id": "r2", "result": "in_progress", "phase": "venv_rebuild", "backup_id": "b1"}, "none"),
        ],
    )
    def test_recovery_rule(self, state, action):
        assert st.decide_recovery(state, "r2")["action"] == action

    def test_rollback_names_the_backup_and_the_phase(self):
        decision = st.decide_recovery(
            {
                "run_id": "r1",
                "result": "in_progress",
                "phase": "venv_rebuild",
                "backup_id": "b1",
                "collection_version": CV,
            },
            "r2",
        )
        assert decision["backup_id"] == "b1"
        assert "run r1 was interrupted at phase venv_rebuild" in decision["reason"]

    def test_a_run_killed_before_its_own_backup_still_owes_the_old_rollback(self):
        interrupted = {
            "run_id": "r1",
            "result": "in_progress",
            "phase": "venv_rebuild",
            "backup_id": "b1",
            "collection_version": CV,
        }
        r2 = st.update_state(interrupted, "r2", NOW, phase="preflight", status="started")
        assert r2["last_run"]["run_id"] == "r1"
        assert st.decide_recovery(r2, "r3") == {
            "action": "rollback",
            "backup_id": "b1",
            "reason": "run r2 was interrupted at phase preflight (started): rolling back first",
        }


class TestRollbackTarget:
    UPGRADED = {"run_id": "r1", "result": "upgraded", "backup_id": "b1", "phase": "undrain", "status": "completed"}
    KILLED = {
        "run_id": "r2",
        "result": "in_progress",
        "backup_id": "b2",
        "phase": "drain",
        "status": "started",
        "collection_version": CV,
    }

    def test_the_named_backup_wins(self):
        assert st.rollback_target(self.KILLED, "rb", requested="b0") == {
            "backup_id": "b0",
            "why": "named by the operator",
            "refuse": "",
        }

    def test_an_interrupted_run_is_undone_to_its_backup(self):
        target = st.rollback_target(self.KILLED, "rb")
        assert target["backup_id"] == "b2"
        assert "run r2 was interrupted at phase drain (started)" in target["why"]

    @pytest.mark.parametrize(
        "state", [None, {}, UPGRADED, {"run_id": "r3", "result": "rolled_back", "backup_id": "b1"}]
    )
    def test_an_ended_run_leaves_the_choice_to_the_host(self, state):
        assert st.rollback_target(state, "rb")["backup_id"] is None

    def test_the_run_holding_the_record_is_not_interrupted(self):
        assert st.rollback_target(self.KILLED, "r2")["backup_id"] is None

    @pytest.mark.parametrize(
        ("state", "backup"),
        [
            (UPGRADED, "b1"),
            (KILLED, "b2"),
            ({"run_id": "r4", "result": "repaired", "backup_id": "b4"}, "b4"),
            # A rollback's record names the backup the host is at now: no way back from it.
            ({"run_id": "r3", "result": "rolled_back", "backup_id": "b1"}, None),
            ({"run_id": "r5", "result": "in_progress", "phase": "backup"}, None),
            ({"run_id": "r6", "result": "failed_preflight", "last_run": UPGRADED}, "b1"),
            ({"run_id": "r7", "result": "failed", "backup_id": "b7", "last_run": None}, None),
            (None, None),
        ],
    )
    def test_recorded_backup(self, state, backup):
        assert st.recorded_backup(state) == backup

    def test_describe_record(self):
        assert st.describe_record({}, "/s.json") == "the host's run record /s.json is missing"
        assert st.describe_record(self.UPGRADED, "/s.json") == "run r1 upgraded, backup b1"
        assert st.describe_record(self.KILLED, "/s.json") == "run r2 in_progress at phase drain (started), backup b2"
