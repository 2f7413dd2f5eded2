# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

import re
from pathlib import Path

from ansible_collections.gpufleet.upgrade.plugins.callback import upgrade_summary as us
from ansible_collections.gpufleet.upgrade.plugins.callback.upgrade_summary import render


def test_render_orders_phases_and_counts_outcomes():
    reports = {
        "n2": {
            "outcome": "rolled back: after cuda_toolkit: injected",
            "outcome_kind": "rolled_back",
            "phases": {"rollback": "rolled back to b1", "preflight": "ok"},
        },
        "n1": {
            "outcome": "upgraded",
            "outcome_kind": "upgraded",
            "phases": {"postcheck": "ok", "backup": "ok: b0 (new)", "preflight": "ok"},
        },
    }
    text = render(reports, unreachable={"n3"}).splitlines()
    assert text[1].startswith("GPUFLEET SUMMARY")
    assert text[2:6] == [
        "n1: upgraded",
        "    preflight     ok",
        "    backup        ok: b0 (new)",
        "    postcheck     ok",
    ]
    assert text[6] == "n2: rolled back: after cuda_toolkit: injected"
    assert text[7:9] == ["    preflight     ok", "    rollback      rolled back to b1"]
    assert text[9] == "n3: unreachable: no report"
    assert text[10] == "totals: rolled back 1, upgraded 1"


def test_totals_group_outcomes_by_kind():
    reports = {
        "a": {"outcome": "rolled back to backup b1: host already matched it", "outcome_kind": "restored"},
        "b": {"outcome": "rolled back: after venv_rebuild: boom", "outcome_kind": "rolled_back"},
        "c": {"outcome": "failed preflight: c: 1.00 GiB free", "outcome_kind": "failed_preflight"},
        # Text alone is never trusted: without its kind a report counts as unknown.
        "d": {"outcome": "upgraded"},
    }
    assert render(reports).splitlines()[-1] == "totals: failed preflight 1, rolled back 2, unknown 1"


def test_nothing_to_say():
    assert render({}) == ""


def test_the_callback_reads_the_names_the_playbook_and_role_serving_set():
    repo = Path(__file__).resolve().parents[4]

    def sets(path, name, how):
        return re.search(rf"^\s+{how}{name}\b", (repo / path).read_text(), re.M) is not None

    assert sets("playbooks/tasks/phase.yml", us.PHASE_FACT, "")
    assert sets("playbooks/plays/upgrade_hosts.yml", us.PHASE_FACT, "")
    assert not us.PHASE_FACT.startswith("_")  # published: docs/design.md lists it
    assert f"`{us.PHASE_FACT}`" in (repo / "docs/design.md").read_text()
    assert sets("roles/serving/tasks/wait.yml", us.HEALTH_WAIT_REGISTER, "register: ")
