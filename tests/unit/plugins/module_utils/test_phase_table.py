# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The upgrade's one phase table (_state.PHASE_TABLE): what the playbook runs, the state file records and a failure
is judged by, and where a run may stop (gpufleet_stop_after)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _state as st
from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _outcome

REPO = Path(__file__).resolve().parents[4]
NOW = "2026-12-07T03:00:00+00:00"


def test_phase_names_are_unique_and_in_run_order():
    assert st.PHASES == (
        "preflight",
        "recover",
        "assess",
        "backup",
        "cuda_toolkit",
        "prepare",
        "drain",
        "venv_rebuild",
        "postcheck",
        "undrain",
    )
    assert len(set(st.PHASES)) == len(st.PHASES)


def test_the_phases_that_change_the_host_all_follow_the_host_model():
    # upgrade_hosts.yml runs the unchanging phases in one loop and the rest, on a drifted host only, in a second one.
    changing = [p.changes_host for p in st.PHASE_TABLE]
    first = changing.index(True)
    assert st.PHASES[first - 1] == "assess" and all(changing[first:]), changing


def test_the_host_is_drained_from_the_drain_to_the_undrain_only():
    drained = [p.name for p in st.PHASE_TABLE if p.drained]
    assert drained == ["drain", "venv_rebuild", "postcheck"]
    assert st.STOP_POINTS == ("preflight", "recover", "assess", "backup", "cuda_toolkit", "prepare")


def test_every_step_is_an_entry_point_of_a_role_of_the_collection():
    for phase in st.PHASE_TABLE:
        assert phase.steps, phase.name
        for step in phase.steps:
            parts = step.partition(":")
            role, entry = parts[0], parts[2]
            assert (REPO / "roles" / role / "tasks" / f"{entry or 'main'}.yml").is_file(), (phase.name, step)


def test_records_are_started_or_completed_and_unchanging_phases_record_nothing():
    for phase in st.PHASE_TABLE:
        assert set(phase.record) <= {"started", "completed"}, phase.name
        if not phase.changes_host:
            assert phase.record == (), phase.name


def test_the_fault_hooks_are_the_ones_upgrade_yml_documents():
    header = (REPO / "playbooks" / "upgrade.yml").read_text()
    # The variable's lines, up to the next variable (gpufleet_fault_action).
    entry = re.split(r"\n#   gpufleet_", header.split("#   gpufleet_fault_inject", 1)[1], maxsplit=1)[0]
    documented = set(re.findall(r"\bafter_[a-z]+\b", entry))
    hooks = {p.hook for p in st.PHASE_TABLE if p.hook}
    assert hooks == documented
    assert len(hooks) == len([p for p in st.PHASE_TABLE if p.hook])


def test_every_failure_kind_is_an_outcome_with_an_answer():
    for phase in st.PHASE_TABLE:
        assert len(phase.fails_as) == 2, phase.name
        for kind in phase.fails_as:
            assert kind in _outcome.KINDS and kind in _outcome.FAILURE_ACTIONS, (phase.name, kind)


def test_the_state_module_accepts_exactly_the_table_s_phases():
    doc = (REPO / "plugins" / "modules" / "upgrade_state.py").read_text()
    options = yaml.safe_load(doc.split('DOCUMENTATION = r"""', 1)[1].split('"""', 1)[0])["options"]
    assert tuple(options["phase"]["choices"]) == st.PHASES


def test_the_playbook_keeps_no_phase_list_of_its_own():
    play = (REPO / "playbooks" / "plays" / "upgrade_hosts.yml").read_text()
    assert "gpufleet.upgrade.upgrade_phases" in play
    assert not re.search(r"^\s*-\s*\{?\s*name:\s*(cuda_toolkit|venv_rebuild)\b", play, re.M)


class TestStopAfter:
    @pytest.mark.parametrize("value", ["", None])
    def test_unset_runs_every_phase(self, value):
        assert st.phases_until(value) == st.PHASE_TABLE

    def test_prepare_runs_up_to_prepare_and_drains_nothing(self):
        names = [p.name for p in st.phases_until("prepare")]
        assert names == ["preflight", "recover", "assess", "backup", "cuda_toolkit", "prepare"]
        assert not any(p.drained for p in st.phases_until("prepare"))
        assert st.stop_result("prepare") == "prepared"

    def test_an_earlier_stop_point_is_stopped(self):
        assert [p.name for p in st.phases_until("backup")][-1] == "backup"
        assert st.stop_result("cuda_toolkit") == "stopped"

    @pytest.mark.parametrize("value", ["drain", "venv_rebuild", "undrain", "prepar", "PREPARE", 3, ["prepare"]])
    def test_a_value_that_would_leave_the_host_drained_or_names_no_phase_is_refused(self, value):
        with pytest.raises(st.StateError) as err:
            st.phases_until(value)
        text = str(err.value)
        assert repr(value) in text and ", ".join(st.STOP_POINTS) in text
        assert "nothing was changed" in text and "fix:" in text
        with pytest.raises(st.StateError):
            st.stop_result(value)


class TestPreparedRecord:
    def prepared(self):
        state = st.update_state(
            {"run_id": "r0", "result": "upgraded", "backup_id": "b0", "history": []},
            "r1",
            NOW,
            phase="prepare",
            status="completed",
            backup_id="b1",
        )
        return st.update_state(state, "r1", NOW, result="prepared", reason="prepared for lab (not switched)")

    def test_a_prepared_host_is_no_interrupted_run(self):
        state = self.prepared()
        assert state["result"] == "prepared"
        assert st.decide_recovery(state, "r2")["action"] == "none"
        assert st.rollback_target(state, "r2")["backup_id"] is None

    def test_the_way_back_of_a_prepared_host_is_the_run_before_it(self):
        # The prepared run's backup is the host as it still is; the backup the upgrade before it took is the way back.
        assert st.recorded_backup(self.prepared()) == "b0"

    def test_the_next_run_starts_a_record_of_its_own(self):
        state = st.update_state(self.prepared(), "r2", NOW, phase="backup", status="started")
        assert state["last_run"]["result"] == "prepared" and "backup_id" not in state
