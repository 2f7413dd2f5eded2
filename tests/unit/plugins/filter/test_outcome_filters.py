# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The outcome filters as Ansible loads them (FilterModule), with the arguments a playbook passes."""

from __future__ import annotations

from pathlib import Path

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.upgrade.plugins.filter.outcome import FilterModule

FILTERS = FilterModule().filters()


def test_every_filter_has_its_doc_file():
    folder = Path(__file__).resolve().parents[4] / "plugins" / "filter"
    for name in FILTERS:
        assert (folder / f"{name}.yml").is_file(), name


def test_outcome():
    got = FILTERS["upgrade_outcome"]("rolled_back", "after venv_rebuild: boom")
    assert got["text"] == "rolled back: after venv_rebuild: boom" and got["state_result"] == "rolled_back"


def test_bad_kind_names_the_value_and_the_fix():
    with pytest.raises(AnsibleFilterError, match=r"'upgradd' is not one of.*fix: use one of the kinds"):
        FILTERS["upgrade_outcome"]("upgradd")


def test_failure_reason_takes_the_failed_task_dict():
    got = FILTERS["failure_reason"](
        {"name": "Install the toolkit", "action": "command"}, {"msg": "non-zero return code", "stderr": "no space left"}
    )
    assert got == "Install the toolkit: non-zero return code no space left"


def test_failed_hosts_reads_hostvars_reports():
    hostvars = {
        "a": {"gpufleet_upgrade_report": {"outcome_kind": "upgraded"}},
        "b": {"gpufleet_upgrade_report": {"outcome_kind": "rolled_back"}},
        "c": {},
    }
    assert FILTERS["failed_hosts"](["a", "b", "c"], hostvars) == ["b", "c"]
