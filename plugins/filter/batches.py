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


def batch_admit(batch, hostvars, hosts, batch_by="", group_max=None, out_of_service=None, name_var=""):
    """``{admitted, deferred, out}``: the batch as the serving groups' budget allows it now (_batches.admit)."""
    if not batch_by:
        return {"admitted": list(batch), "deferred": {}, "out": {}}
    groups = {host: (hostvars[host] or {}).get(batch_by, "") for host in hosts}
    seen = out_of_service or {}
    out = {}
    for host in hosts:
        # The provider names a host by its server or node name (gpufleet_haproxy_server, gpufleet_slurm_node), by
        # default the inventory name or its short form.
        name = ((hostvars[host] or {}).get(name_var) if name_var else None) or host
        why = seen.get(name) or seen.get(str(name).split(".", maxsplit=1)[0])
        if why:
            out[host] = why
    try:
        admitted, deferred = _batches.admit(batch, groups, _batches.group_caps(groups, hosts, group_max), out)
    except _batches.BatchError as exc:
        raise AnsibleFilterError(f"gpufleet.upgrade.batch_admit: {exc}") from exc
    return {"admitted": admitted, "deferred": deferred, "out": out}


class FilterModule:
    def filters(self):
        return {"batch_plan": batch_plan, "failure_budget": failure_budget, "batch_admit": batch_admit}
