# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters over the upgrade's outcome logic (plugins/plugin_utils/_outcome.py); each is documented in <name>.yml."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _outcome


def upgrade_outcome(kind, detail="", host="", backup_id=""):
    try:
        return _outcome.outcome(kind, detail, host=host, backup_id=backup_id)
    except _outcome.OutcomeError as exc:
        raise AnsibleFilterError(
            f"gpufleet.upgrade.upgrade_outcome: {exc}; fix: use one of the kinds it names"
        ) from exc


def run_outcome(assess, profile, check_mode=False):
    return _outcome.run_outcome(assess, profile, check_mode)


def failure_reason(failed_task, failed_result):
    name = failed_task.get("name") if isinstance(failed_task, dict) else failed_task
    return _outcome.failure_reason(name, failed_result)


def classify_failure(phase, completed=False, check_mode=False):
    return _outcome.classify_failure(phase, completed, check_mode)


def phase_note(phase, facts):
    return _outcome.phase_note(phase, facts)


def host_report(result, host, run_id, profile, backup_id="", phases=None, check_mode=False):
    return _outcome.host_report(result, host, run_id, profile, backup_id, phases, check_mode)


def failed_hosts(batch, hostvars):
    # hostvars is Ansible's lazy mapping: read only the one fact of the batch's hosts.
    reports = {host: (hostvars[host] or {}).get("gpufleet_upgrade_report") for host in batch}
    return _outcome.failed_hosts(batch, reports)


class FilterModule:
    def filters(self):
        return {
            "upgrade_outcome": upgrade_outcome,
            "run_outcome": run_outcome,
            "failure_reason": failure_reason,
            "classify_failure": classify_failure,
            "phase_note": phase_note,
            "host_report": host_report,
            "failed_hosts": failed_hosts,
        }
