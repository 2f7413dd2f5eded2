# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters over the upgrade's phase table (plugins/module_utils/_state.py PHASE_TABLE): the phases a host runs and
how a run told to stop after one of them ends; each is documented in <name>.yml."""

from __future__ import annotations

from dataclasses import asdict

from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _state
from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _outcome


def _phases(stop_after, host):
    try:
        return _state.phases_until(stop_after)
    except _state.StateError as exc:
        raise AnsibleFilterError(f"{host}: {exc}" if host else str(exc)) from exc


def upgrade_phases(stop_after="", host=""):
    # Lists, not tuples: what a playbook loops over and compares.
    return [
        {key: list(value) if isinstance(value, tuple) else value for key, value in asdict(phase).items()}
        for phase in _phases(stop_after, host)
    ]


def stopped_outcome(assess, profile, stop_after, check_mode=False, host=""):
    _phases(stop_after, host)
    return _outcome.stopped_outcome(assess, profile, stop_after, check_mode)


class FilterModule:
    def filters(self):
        return {"upgrade_phases": upgrade_phases, "stopped_outcome": stopped_outcome}
