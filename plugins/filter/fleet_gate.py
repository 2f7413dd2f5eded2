# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filter fleet_gate: a batch's post-check benchmarks against the fleet's pre-upgrade ones (plugin_utils/_fleet_gate.py,
documented in fleet_gate.yml)."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _fleet_gate


def fleet_gate(batch, hostvars, batch_by="", limit_pct=None, fleet_runs=None, batch_number=1):
    # hostvars is Ansible's lazy mapping: read only the facts the gate needs of the batch's hosts.
    fleet = dict(fleet_runs or {})
    groups, post = {}, {}
    for host in batch:
        facts = hostvars[host] or {}
        groups[host] = facts.get(batch_by, "") if batch_by else ""
        baseline = _fleet_gate.runs_by_concurrency(facts.get("postcheck_baseline"))
        if baseline:
            fleet[host] = baseline
        result = facts.get("postcheck_result") or {}
        if result.get("passed"):
            post[host] = _fleet_gate.runs_by_concurrency(result.get("bench"))
    for host in fleet:
        if host not in groups:
            groups[host] = (hostvars[host] or {}).get(batch_by, "") if batch_by else ""
    try:
        verdict = _fleet_gate.judge(int(batch_number), list(batch), groups, fleet, post, limit_pct)
    except (TypeError, ValueError) as exc:
        raise AnsibleFilterError(
            f"gpufleet.upgrade.fleet_gate: postcheck.bench.fleet_max_regression_pct={limit_pct!r} cannot be read: "
            f"{exc}; fix: set it to a number of percent, e.g. 3"
        ) from exc
    return {"fleet_runs": fleet, "verdict": verdict}


class FilterModule:
    def filters(self):
        return {"fleet_gate": fleet_gate}
