#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: drain_slurm
short_description: Drain a serving host's Slurm node until its jobs ended, and resume it
version_added: 0.2.0
description:
  - Runs C(scontrol), C(sinfo) and C(squeue) where they reach slurmctld (C(delegate_to) a login or controller host).
  - O(state=drained) runs C(scontrol update nodename=NODE state=drain reason="gpufleet RUN_ID"); Slurm starts no new
    job there, the running ones go on (DRAINING). The module waits until the node is DRAINED; a wait that runs out
    fails with the host and the jobs still running.
  - O(state=resumed) runs C(scontrol update nodename=NODE state=resume), only for a node gpufleet drained (its reason
    starts with C(gpufleet )). A node drained by someone else before the run (another reason) stays drained, and the
    module says so; a node drained by an earlier gpufleet run that never resumed it (a killed run) is resumed.
author:
  - gpufleet maintainers (@gpufleet)
attributes:
  check_mode:
    support: full
    description: Reads the node's state and reports what would change; runs no C(scontrol update) and does not wait.
  diff_mode:
    support: full
    description: Shows the node's state and reason before and after.
options:
  node:
    description: The node's name in Slurm (C(NodeName) in C(slurm.conf)); required unless O(state=query).
    type: str
  nodes:
    description: With O(state=query), the nodes to look at (one C(sinfo)); empty, every node.
    type: list
    elements: str
    default: []
  host:
    description: Inventory name of the host the node stands for, named in messages (default O(node)).
    type: str
  state:
    description:
      - V(drained) drains the node and waits until its jobs ended; V(resumed) puts it back.
      - V(query) changes nothing and returns RV(out_of_service) for each of O(nodes).
    type: str
    choices: [drained, resumed, query]
    default: drained
  run_id:
    description: Id of the run; the drain's reason is C(gpufleet RUN_ID).
    type: str
    default: manual
  found_drained:
    description:
      - What O(state=drained) does with a node found out of service before the run, not by gpufleet
        (draining, drained, down or failed with a reason other than C(gpufleet ...)).
      - V(upgrade) leaves it so and goes on (the host is upgraded and stays out of service); V(refuse) fails, naming
        it, and changes nothing. Role serving passes V(refuse) unless C(gpufleet_upgrade_drained_hosts) is true.
    type: str
    choices: [refuse, upgrade]
    default: upgrade
notes:
  - O(wait) waits until the node is DRAINED after O(state=drained); O(state=resumed) does not wait.
extends_documentation_fragment:
  - gpufleet.upgrade.drain_wait
"""

EXAMPLES = r"""
- name: Drain the host's Slurm node and wait until its jobs ended
  gpufleet.upgrade.drain_slurm:
    node: "{{ inventory_hostname_short }}"
    run_id: "{{ gpufleet_run_id }}"
    timeout_s: 3600
  delegate_to: slurm-login1

- name: Resume the node (only if gpufleet drained it)
  gpufleet.upgrade.drain_slurm:
    node: "{{ inventory_hostname_short }}"
    state: resumed
  delegate_to: slurm-login1
"""

RETURN = r"""
previous:
  description: The node before this call, C(state) (sinfo's extended state without flags), C(flags), C(reason).
  returned: always
  type: dict
  sample: {node: gpu01, state: mixed, flags: "", reason: ""}
node_state:
  description: The node after this call (in check mode, as it was).
  returned: always
  type: dict
jobs:
  description: Jobs on the node at the end (id, user, name, state, time).
  returned: always
  type: list
  elements: dict
out_of_service:
  description: With O(state=query), per node Slurm listed why it runs no job (C(Slurm drained (reason)),
    C(Slurm down (reason)), C(Slurm not responding)), empty when it is in service.
  returned: state is query
  type: dict
drained_by:
  description:
    - Who has the node out of service after O(state=drained) (empty after O(state=resumed)), as in
      M(gpufleet.upgrade.drain_haproxy); C(other) is a node found draining, drained, down or failed with another
      reason, which O(state=resumed) leaves as it is.
  returned: always
  type: str
waited_s:
  description: Seconds waited.
  returned: always
  type: float
msg:
  description: What was done, in words; says when a node was left drained by someone else.
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _drain as dr
from ansible_collections.gpufleet.upgrade.plugins.module_utils import _drain_slurm as sl


def build_module():
    return AnsibleModule(
        argument_spec=dr.argument_spec(
            node=dict(type="str"),
            nodes=dict(type="list", elements="str", default=[]),
            host=dict(type="str"),
            state=dict(type="str", choices=["drained", "resumed", "query"], default="drained"),
            run_id=dict(type="str", default="manual"),
            found_drained=dict(type="str", choices=list(dr.FOUND_DRAINED), default="upgrade"),
        ),
        required_if=[("state", "drained", ["node"]), ("state", "resumed", ["node"])],
        supports_check_mode=True,
    )


def slurm(module, argv):
    rc, out, err = module.run_command(argv)
    if rc != 0:
        raise dr.DrainError(f"`{' '.join(argv)}` exited {rc}: {(err or out).strip()[:300]}")
    return out


def look(module):
    return sl.parse_sinfo(slurm(module, sl.sinfo_argv(module.params["node"])), module.params["node"])


def jobs(module):
    return sl.parse_squeue(slurm(module, sl.squeue_argv(module.params["node"])))


def run(module):
    p = module.params
    if p["state"] == "query":
        # One sinfo for every node: the rollout's budget reads the whole serving group before each batch.
        out = sl.nodes_view(slurm(module, sl.sinfo_all_argv(p["nodes"])))
        return {"changed": False, "out_of_service": out, "msg": f"{sum(1 for w in out.values() if w)} out of service"}
    host = p["host"] or p["node"]
    view = look(module)
    action, why = sl.plan(p["state"], view)
    result = {"changed": action is not None, "previous": view, "node_state": view, "waited_s": 0.0, "jobs": []}
    result["drained_by"] = dr.drained_by(action, sl.is_ours(view), sl.is_out(view)) if p["state"] == "drained" else ""
    if result["drained_by"] == "other" and p["found_drained"] == "refuse":
        what = f"Slurm node {view['node']} was {view['state']} (reason {view['reason']!r})"
        module.fail_json(msg=dr.found_drained_message(host, what), **result)
    if module._diff:
        after = {"drain": "draining", "resume": "in service"}.get(action, view["state"])
        reason = sl.reason_for(p["run_id"]) if action == "drain" else "" if action == "resume" else view["reason"]
        result["diff"] = {
            "before": f"{view['node']}: {view['state']} {view['reason']}\n".replace(" \n", "\n"),
            "after": f"{view['node']}: {after} {reason}\n".replace(" \n", "\n"),
        }
    if module.check_mode:
        result["msg"] = f"{host}: node {view['node']} would be {why}" if action else f"{host}: {why}"
        return result
    if action == "drain":
        slurm(module, sl.drain_argv(p["node"], sl.reason_for(p["run_id"])))
    elif action == "resume":
        slurm(module, sl.resume_argv(p["node"]))
    # Only a drain of gpufleet's is waited for; someone else's drain may wait for anything.
    if p["state"] == "drained" and p["wait"] and (action or sl.is_ours(view)):
        try:
            view, result["waited_s"] = dr.poll_until(lambda: look(module), sl.idle, p["timeout_s"], p["interval_s"])
        except dr.DrainTimeout as exc:
            module.fail_json(
                msg=sl.timeout_message(host, exc.last, jobs(module), exc.waited_s),
                changed=action is not None,
                previous=result["previous"],
                node_state=exc.last,
                waited_s=exc.waited_s,
            )
    else:
        view = look(module)
    if p["state"] == "resumed" and action == "resume" and sl.is_drained(view):
        raise dr.DrainError(f"node {view['node']} is still {view['state']} after `scontrol update ... state=resume`")
    result.update(node_state=view, jobs=jobs(module), msg=f"{host}: node {view['node']} {why}")
    return result


def main():
    module = build_module()
    try:
        module.exit_json(**run(module))
    except dr.DrainError as exc:
        module.fail_json(msg=f"{module.params['host'] or module.params['node']}: {exc}")


if __name__ == "__main__":
    main()
