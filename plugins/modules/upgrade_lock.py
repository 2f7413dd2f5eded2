#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: upgrade_lock
short_description: Take or release the per-host upgrade lock
version_added: 0.1.0
description:
  - Keeps two runs off one host. The lock file (C(/var/lib/gpufleet/upgrade.lock)) holds the run id, the pid of the
    C(ansible-playbook) process and its start time, the controller's host name and the time the lock was taken.
  - An action plugin runs first on the controller; it fills in the holder (pid, controller) and checks whether the
    process that holds an existing lock still runs. A lock of a dead run of the same controller is taken over and
    reported; a lock held by another controller is refused with the fix (C(gpufleet_lock_break=<run id>)).
  - The lock is created with an atomic test-and-set (C(link)), so two runs racing for a free host cannot both win.
  - O(state=absent) removes the lock only when this run holds it.
author:
  - gpufleet maintainers (@gpufleet)
attributes:
  check_mode:
    support: full
    description: >-
      Reports whether the lock would be taken or released without writing. Taking a free lock is no change (the run
      releases it at its end); taking over a dead or broken run's lock is a change whose diff shows that lock removed.
  diff_mode:
    support: full
    description: Shows the lock before and after.
options:
  path:
    description: The lock file.
    type: path
    default: /var/lib/gpufleet/upgrade.lock
  state:
    description: C(present) takes the lock, C(absent) releases it, C(query) reads it.
    type: str
    choices: [present, absent, query]
    default: present
  run_id:
    description: Id of this run.
    type: str
  break_run_id:
    description: Run id whose lock may be replaced (an operator's decision that this run is dead).
    type: str
  takeover_dead:
    description: Take over a lock whose holder is a dead process of this controller.
    type: bool
    default: true
  holder:
    description: Filled in by the action plugin (pid, pid_start, controller, started, alive); not for playbooks.
    type: dict
"""

EXAMPLES = r"""
- name: Take the upgrade lock of this host
  gpufleet.upgrade.upgrade_lock:
    run_id: "{{ gpufleet_run_id }}"
    break_run_id: "{{ gpufleet_lock_break | default(omit) }}"

- name: Release the upgrade lock
  gpufleet.upgrade.upgrade_lock:
    run_id: "{{ gpufleet_run_id }}"
    state: absent
"""

RETURN = r"""
lock:
  description: The lock after this call (as it would be in check mode); empty when there is none.
  returned: always
  type: dict
previous:
  description: The lock found before this call.
  returned: always
  type: dict
verdict:
  description: free, ours, takeover, held (for O(state=present)), or denied when the user cannot write the lock.
  returned: when state is present
  type: str
msg:
  description: What happened, naming the previous holder when there was one.
  returned: always
  type: str
"""

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _state as st
from ansible_collections.gpufleet.upgrade.plugins.module_utils._privilege import current_user


def read_lock(module):
    try:
        doc = st.read_json(module.params["path"])
        return None if doc is None else st.check_lock(doc)
    except st.StateError as exc:
        module.fail_json(
            msg=f"lock {module.params['path']} is unreadable: {exc}; fix: make sure no upgrade runs on this host, "
            "then remove the file"
        )


def denied_message(path, exc):
    user, uid = current_user()
    return (
        f"the upgrade lock {path} cannot be written by user {user} (uid {uid}): {exc.strerror or exc}; no other run "
        f"holds it. Fix: set ansible_become: true for this host, or give {user} write access to "
        f"{os.path.dirname(path)}. Nothing was changed."
    )


def acquire(module, previous):
    p = module.params
    holder = p["holder"] or {}
    alive = holder.get("alive")

    def holder_alive(_pid, _start):
        return bool(alive)

    verdict, message = st.judge_lock(
        previous,
        p["run_id"],
        holder.get("controller"),
        holder_alive=None if alive is None else holder_alive,
        break_run_id=p["break_run_id"],
        takeover_dead=p["takeover_dead"],
    )
    if verdict == "held":
        module.fail_json(msg=message, previous=previous, verdict=verdict)
    if verdict == "ours":
        return {"changed": False, "lock": previous, "verdict": verdict, "msg": message}
    lock = st.new_lock(p["run_id"], holder["pid"], holder.get("pid_start"), holder["controller"], holder["started"])
    result = {"changed": True, "lock": lock, "verdict": verdict, "msg": message}
    if module.check_mode:
        # A real run takes the lock and releases it at its end. From a free lock that leaves the host as it was; a
        # dead or broken run's lock is taken over and then removed, so the host ends without it: that is a change.
        if verdict == "takeover":
            result.update(
                msg=f"check mode: {message}; the run would take it over and remove it at its end", after_run={}
            )
        else:
            result.update(changed=False, msg=f"check mode: {message}; the lock would be taken for the run")
        return result
    try:
        if verdict == "free":
            if not st.create_exclusive(p["path"], lock):
                module.fail_json(
                    msg="another run took the lock at the same moment; fix: wait for it to finish", verdict="held"
                )
        else:
            # Replace only the lock that was judged; a third run that slipped in meanwhile keeps its lock.
            if st.read_json(p["path"]) != previous:
                module.fail_json(msg="the lock changed while it was taken over; fix: re-run", verdict="held")
            st.write_json_atomic(p["path"], lock)
    except PermissionError as exc:
        # No other run holds it: the user cannot write here. gpufleet_lock_break would not help.
        module.fail_json(msg=denied_message(p["path"], exc), verdict="denied")
    if verdict == "takeover":
        module.warn(message)
    return result


def release(module, previous):
    p = module.params
    if previous is None:
        return {"changed": False, "lock": {}, "msg": "no lock to release"}
    if previous.get("run_id") != p["run_id"]:
        return {
            "changed": False,
            "lock": previous,
            "msg": f"lock belongs to {st.describe_lock(previous)}; left in place",
        }
    if not module.check_mode:
        os.unlink(p["path"])
    return {"changed": True, "lock": {}, "msg": f"lock of run {p['run_id']} released"}


def main():
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "default": "/var/lib/gpufleet/upgrade.lock"},
            "state": {"type": "str", "choices": ["present", "absent", "query"], "default": "present"},
            "run_id": {"type": "str"},
            "break_run_id": {"type": "str"},
            "takeover_dead": {"type": "bool", "default": True},
            "holder": {"type": "dict"},
        },
        required_if=[("state", "present", ("run_id", "holder")), ("state", "absent", ("run_id",))],
        supports_check_mode=True,
    )
    previous = read_lock(module)
    state = module.params["state"]
    if state == "query":
        result = {
            "changed": False,
            "lock": previous or {},
            "msg": st.describe_lock(previous) if previous else "no lock",
        }
    elif state == "present":
        result = acquire(module, previous)
    else:
        result = release(module, previous)
    result["previous"] = previous or {}
    after = result.pop("after_run", result["lock"])
    if module._diff and result["changed"]:
        result["diff"] = {"before": st.dumps(previous) if previous else "", "after": st.dumps(after) if after else ""}
    module.exit_json(**result)


if __name__ == "__main__":
    main()
