# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The phase filters as Ansible loads them (FilterModule), with the arguments upgrade_hosts.yml passes."""

from __future__ import annotations

from pathlib import Path

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.upgrade.plugins.filter.phases import FilterModule
from ansible_collections.gpufleet.upgrade.plugins.module_utils import _state

FILTERS = FilterModule().filters()
IN_SYNC = {"in_sync": True}
DRIFTED = {"in_sync": False, "on_profile": False, "drift": ["serving venv: cu128 is not the lock's"]}


def test_every_filter_has_its_doc_file():
    folder = Path(__file__).resolve().parents[4] / "plugins" / "filter"
    for name in FILTERS:
        assert (folder / f"{name}.yml").is_file(), name


def test_upgrade_phases_gives_the_table_as_lists():
    got = FILTERS["upgrade_phases"]("")
    assert [p["name"] for p in got] == list(_state.PHASES)
    backup = got[_state.PHASES.index("backup")]
    assert backup == {
        "name": "backup",
        "steps": ["postcheck:baseline", "backup"],
        "hook": "after_backup",
        "record": ["started", "completed"],
        "changes_host": True,
        "drained": False,
        "fails_as": ["failed_before_change", "rolled_back"],
    }
    drain = got[_state.PHASES.index("drain")]
    assert drain["record"] == ["started"] and drain["drained"]


def test_upgrade_phases_stops_after_prepare():
    got = FILTERS["upgrade_phases"]("prepare", "node1")
    assert [p["name"] for p in got][-2:] == ["cuda_toolkit", "prepare"]
    assert not any(p["drained"] for p in got)


def test_a_bad_stop_after_names_the_host_the_value_and_the_stop_points():
    with pytest.raises(AnsibleFilterError, match=r"^node1: gpufleet_stop_after is 'drain', .*\(preflight, .*prepare\)"):
        FILTERS["upgrade_phases"]("drain", "node1")


@pytest.mark.parametrize(
    "assess, stop_after, check_mode, kind, text",
    [
        (DRIFTED, "prepare", False, "prepared", "prepared for lab (not switched)"),
        (DRIFTED, "prepare", True, "would_prepare", "would prepare for lab (check mode: nothing changed)"),
        (DRIFTED, "cuda_toolkit", False, "stopped", "stopped after cuda_toolkit of the upgrade to lab (not switched)"),
        (
            {},
            "preflight",
            True,
            "would_stop",
            "would stop after preflight of the upgrade to lab (check mode: nothing changed)",
        ),
        # Nothing ran after the host model: a host in sync says so whatever the stop point.
        (IN_SYNC, "prepare", False, "in_sync", "already at lab (in sync)"),
    ],
)
def test_stopped_outcome(assess, stop_after, check_mode, kind, text):
    got = FILTERS["stopped_outcome"](assess, "lab", stop_after, check_mode)
    assert got["text"].startswith(text), got
    assert (got["kind"], got["ok"], got["counts_as_failure"]) == (kind, True, False)
    assert got["state_result"] == {"prepared": "prepared", "stopped": "stopped"}.get(kind)


def test_stopped_outcome_refuses_a_bad_stop_point():
    with pytest.raises(AnsibleFilterError, match=r"node2: gpufleet_stop_after is 'postcheck'"):
        FILTERS["stopped_outcome"](DRIFTED, "lab", "postcheck", host="node2")
