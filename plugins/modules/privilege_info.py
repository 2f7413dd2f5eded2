#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: privilege_info
short_description: Say whether the connecting user can write the paths an upgrade writes on a host
version_added: 0.2.0
description:
  - Role C(preflight) asks it first, once, before any other gate, so that a run without the privilege it needs is
    refused naming the user, the paths and C(ansible_become), not at the lock or the report.
  - A missing path counts as writable when its nearest existing parent is (the run creates it there).
  - Changes nothing on the host.
author:
  - gpufleet maintainers (@gpufleet)
attributes:
  check_mode:
    support: full
    description: Only reads; runs the same in check mode.
  diff_mode:
    support: none
    description: Reads only; there is nothing to show.
options:
  paths:
    description: What the run writes, label -> path; an empty path is left out.
    type: dict
    required: true
  host:
    description: The host's inventory name, for the message.
    type: str
    required: true
  become:
    description: Whether the task runs with become (said in the message); unset says nothing of it.
    type: bool
"""

EXAMPLES = r"""
- name: Check the run can write what it must on the host
  gpufleet.upgrade.privilege_info:
    host: "{{ inventory_hostname }}"
    become: "{{ ansible_become | default(false) }}"
    paths:
      state folder (gpufleet_state_dir): /var/lib/gpufleet
  register: privilege
"""

RETURN = r"""
user:
  description: The user the module ran as.
  returned: always
  type: str
uid:
  description: Its uid.
  returned: always
  type: int
unwritable:
  description: Each path it cannot write, with the existing folder where permission is denied.
  returned: always
  type: list
  elements: dict
msg:
  description: The refusal naming user, paths and fix; empty when every path can be written.
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _privilege


def main():
    module = AnsibleModule(
        argument_spec={
            "paths": {"type": "dict", "required": True},
            "host": {"type": "str", "required": True},
            "become": {"type": "bool"},
        },
        supports_check_mode=True,
    )
    user, uid = _privilege.current_user()
    denied = _privilege.unwritable({k: str(v or "") for k, v in module.params["paths"].items()})
    msg = _privilege.refusal(module.params["host"], user, uid, module.params["become"], denied)
    module.exit_json(changed=False, user=user, uid=uid, unwritable=denied, msg=msg)


if __name__ == "__main__":
    main()
