# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The lock a host last applied stays in its state file until a run applies another (the audit's reference)."""

from __future__ import annotations

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _state as st

LOCK_A = {"venv_name": "lab-aaaaaaaaaaaa", "hash": "a" * 64, "profile": "lab", "file": "/c/locks/a.lock.yml"}
LOCK_B = {"venv_name": "lab-bbbbbbbbbbbb", "hash": "b" * 64, "profile": "lab", "file": "/c/fleet.lock.yml"}


def test_lock_recorded_with_the_result_is_kept_by_a_later_run_that_records_none():
    upgraded = st.update_state(None, "run-1", "t1", result="upgraded", profile="lab", lock=LOCK_A)
    assert upgraded["lock"] == LOCK_A
    refused = st.update_state(upgraded, "run-2", "t2", result="failed_preflight", reason="disk")
    assert refused["lock"] == LOCK_A
    assert refused["last_run"]["result"] == "upgraded"


def test_a_run_that_applies_another_lock_replaces_the_record():
    upgraded = st.update_state(None, "run-1", "t1", result="upgraded", lock=LOCK_A)
    started = st.update_state(upgraded, "run-2", "t2", phase="backup", status="started")
    assert started["lock"] == LOCK_A
    done = st.update_state(started, "run-2", "t3", result="upgraded", lock=LOCK_B)
    assert done["lock"] == LOCK_B


def test_no_lock_before_any_run_recorded_one():
    state = st.update_state(
        {"run_id": "old", "result": "failed", "history": []}, "run-2", "t", result="failed_preflight"
    )
    assert "lock" not in state
