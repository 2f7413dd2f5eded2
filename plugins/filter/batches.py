# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters over the rollout's batch plan (plugins/plugin_utils/_batches.py); each is documented in <name>.yml."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _batches


def batch_plan(hosts, serial=None, hostvars=None, batch_by="", group_max=None):
    groups = None
    if batch_by:
        # hostvars is Ansible's lazy mapping: read only the one variable of each host.
        groups = {host: (hostvars[host] or {}).get(batch_by, "") for host in hosts}
        missing = sorted(host for host, group in groups.items() if group in ("", None))
        if len(missing) == len(groups):
            raise AnsibleFilterError(
                f"gpufleet_batch_by={batch_by!r}: no host sets the variable {batch_by!r} (e.g. {missing[0]}); fix: set"
                f" it per serving group in the inventory (group_vars), or leave gpufleet_batch_by unset"
            )
    try:
        return _batches.plan(hosts, serial, groups, group_max)
    except _batches.BatchError as exc:
        raise AnsibleFilterError(f"gpufleet.upgrade.batch_plan: {exc}") from exc


def failure_budget(value, total):
    try:
        return _batches.failure_budget(value, int(total))
    except _batches.BatchError as exc:
        raise AnsibleFilterError(f"gpufleet.upgrade.failure_budget: {exc}") from exc


class FilterModule:
    def filters(self):
        return {"batch_plan": batch_plan, "failure_budget": failure_budget}
