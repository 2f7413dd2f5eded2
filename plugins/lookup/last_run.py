# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
name: last_run
short_description: What the controller last knew of a host, for a host that lost its run record
version_added: 0.1.0
description:
  - Reads the controller's reports of the host's runs (C(<controller_dir>/runs/<run id>/<host>.json); check-mode runs
    left out) and the backups it holds copies of (C(<controller_dir>/backups/<host>/)), and returns the newest run's
    id, outcome, backup id and profile, the backup ids, and C(note), the line reports use when the host's
    C(state.json) is gone (empty when the controller never saw the host).
  - Reads local files only; changes nothing.
  - A report this collection cannot act on (not JSON, an unknown C(schema) or C(outcome_kind)) fails the lookup,
    naming the file, the value and the fix.
options:
  _terms:
    description: The host names (inventory names).
    type: list
    elements: str
    required: true
  controller_dir:
    description: The controller folder (C(gpufleet_controller_dir)).
    type: path
    required: true
  state_path:
    description: The host's state file, named in C(note).
    type: str
    default: /var/lib/gpufleet/state.json
author:
  - gpufleet maintainers (@gpufleet)
"""

EXAMPLES = r"""
- name: Say what the controller knows of a host whose state.json is gone
  ansible.builtin.debug:
    msg: "{{ lookup('gpufleet.upgrade.last_run', inventory_hostname, controller_dir=gpufleet_controller_dir).note }}"
"""

RETURN = r"""
_raw:
  description: One dict per host.
  type: list
  elements: dict
  contains:
    run_id:
      description: The newest run that reported the host; null when none.
      type: str
    outcome:
      description: That run's outcome for the host.
      type: str
    backup_id:
      description: The backup that run reported.
      type: str
    profile:
      description: The profile of that run.
      type: str
    path:
      description: The report read.
      type: str
    backups:
      description: Ids of the backups the controller holds copies of, oldest first.
      type: list
      elements: str
    note:
      description: The report line for a host that lost its run record; empty when the controller never saw the host.
      type: str
"""

from ansible.errors import AnsibleLookupError  # noqa: E402
from ansible.plugins.lookup import LookupBase  # noqa: E402

from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _run_record  # noqa: E402


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        # Read from the call itself: the answer depends on nothing but its two options.
        controller_dir = kwargs.get("controller_dir")
        if not controller_dir:
            raise AnsibleLookupError("gpufleet.upgrade.last_run needs controller_dir= (gpufleet_controller_dir)")
        state_path = kwargs.get("state_path") or "/var/lib/gpufleet/state.json"
        out = []
        for host in terms:
            try:
                known = _run_record.last_known(controller_dir, str(host))
            except _run_record.RunRecordError as exc:
                raise AnsibleLookupError(f"{host}: {exc}") from None
            known["note"] = _run_record.missing_record_note(state_path, known)
            out.append(known)
        return out
