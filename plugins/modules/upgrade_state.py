#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: upgrade_state
short_description: Record how far an upgrade run got on a host
version_added: 0.1.0
description:
  - Reads and writes the host state file C(/var/lib/gpufleet/state.json) with the run id, the phase reached, whether
    it completed, the backup id, the result and its reason, and a short history.
  - Always returns RV(recovery), what this run must do first about the run recorded before it (none, restart, rollback
    or refuse). The rule is in docs/safety.md.
  - A state file this collection cannot act on (not JSON, an unknown schema version, phase, status or result) fails
    the call, naming the file, the value and the fix; it is never written over.
  - The state file records the collection version that wrote it. An unfinished run (interrupted, or its rollback
    failed) that another version started is refused by RV(recovery) and RV(rollback) unless
    O(accept_version_change).
  - Writes atomically; writing the same facts again is no change.
author:
  - gpufleet maintainers (@gpufleet)
attributes:
  check_mode:
    support: full
    description: Returns the state it would write without writing.
  diff_mode:
    support: full
    description: Shows the state file before and after.
options:
  path:
    description: The state file.
    type: path
    default: /var/lib/gpufleet/state.json
  state:
    description: C(query) only reads; C(present) records the given facts.
    type: str
    choices: [present, query]
    default: present
  run_id:
    description: Id of this run.
    type: str
    required: true
  phase:
    description: Phase reached.
    type: str
    choices: [preflight, recover, assess, backup, cuda_toolkit, prepare, drain, venv_rebuild, postcheck, undrain]
  status:
    description: Whether O(phase) has started or completed.
    type: str
    choices: [started, completed]
  backup_id:
    description: Backup this run took (set once the backup is complete and verified).
    type: str
  profile:
    description: Target profile of this run.
    type: str
  result:
    description: Outcome of the run so far.
    type: str
    choices:
      [in_progress, upgraded, repaired, prepared, stopped, rolled_back, rollback_failed, failed_preflight, failed]
  reason:
    description: Why the run ended as it did.
    type: str
  accept_version_change:
    description:
      - Let this collection version resume or roll back an unfinished run that another version started (the
        operator's C(gpufleet_accept_version_change)).
    type: bool
    default: false
  lock:
    description:
      - The wheel lock the run applied (C(venv_name), C(hash), C(profile), C(file) the controller took it from),
        recorded with the run's result. Kept across later runs until another one records a lock; an audit without a
        lock file judges the host against it (with C(<serving_root>/locks/<venv_name>.txt)).
    type: dict
"""

EXAMPLES = r"""
- name: Record that the toolkit phase starts
  gpufleet.upgrade.upgrade_state:
    run_id: "{{ gpufleet_run_id }}"
    phase: cuda_toolkit
    status: started
"""

RETURN = r"""
state:
  description: The state after this call (as it would be written in check mode).
  returned: always
  type: dict
previous:
  description: The state found before this call (empty when none).
  returned: always
  type: dict
recovery:
  description: What this run must do first about the previous run; C(action) is none, restart, rollback or refuse.
  returned: always
  type: dict
  sample: {"action": "rollback", "backup_id": "20261202T130501Z-1a2b3c4d", "reason": "run X was interrupted ..."}
record:
  description: The host's run record in one line (the last run, its result and backup), or that the file is missing.
  returned: always
  type: str
  sample: "the host's run record /var/lib/gpufleet/state.json is missing"
recorded_backup_id:
  description:
    - The backup the last run moved the host away from (a run that upgraded, repaired or was interrupted after its
      backup); null when the record names none. The way back when the host's backups folder is gone.
  returned: always
  type: str
rollback:
  description:
    - What a rollback without a named backup restores, C(backup_id) and C(why). An interrupted run is undone to its
      backup; otherwise C(backup_id) is null and the rollback picks the newest backup unlike the host.
    - C(refuse), when not empty, says why this collection version must not roll back the unfinished run the record
      names (another version started it, and O(accept_version_change) is false).
  returned: always
  type: dict
"""

import datetime

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _state as st


def run(module):
    p = module.params
    try:
        previous = st.read_previous(p["path"])
    except st.StateError as exc:
        module.fail_json(msg=str(exc))
    accept = p["accept_version_change"]
    recovery = st.decide_recovery(previous, p["run_id"], accept_version_change=accept)
    result = {
        "changed": False,
        "previous": previous,
        "state": previous,
        "recovery": recovery,
        "record": st.describe_record(previous, p["path"]),
        "recorded_backup_id": st.recorded_backup(previous),
        "rollback": st.rollback_target(previous, p["run_id"], accept_version_change=accept),
    }
    if p["state"] == "query":
        return result
    now = datetime.datetime.now(datetime.timezone.utc).isoformat()
    changes = {key: p[key] for key in ("phase", "status", "backup_id", "profile", "result", "reason", "lock")}
    try:
        new = st.update_state(previous, p["run_id"], now, **changes)
    except st.StateError as exc:
        module.fail_json(msg=str(exc))
    if st.same_state(previous, new):
        return result
    result.update(changed=True, state=new)
    if module._diff:
        result["diff"] = {"before": st.dumps(previous) if previous else "", "after": st.dumps(new)}
    if not module.check_mode:
        st.write_json_atomic(p["path"], new)
    return result


def main():
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "default": "/var/lib/gpufleet/state.json"},
            "state": {"type": "str", "choices": ["present", "query"], "default": "present"},
            "run_id": {"type": "str", "required": True},
            "phase": {"type": "str", "choices": list(st.PHASES)},
            "status": {"type": "str", "choices": ["started", "completed"]},
            "backup_id": {"type": "str"},
            "profile": {"type": "str"},
            "result": {"type": "str", "choices": list(st.RESULTS)},
            "reason": {"type": "str"},
            "lock": {"type": "dict"},
            "accept_version_change": {"type": "bool", "default": False},
        },
        supports_check_mode=True,
    )
    module.exit_json(**run(module))


if __name__ == "__main__":
    main()
