#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: cuda_link
short_description: Hold the global C(/usr/local/cuda) link to a policy, through update-alternatives if it owns it
description:
  - O(policy=keep) makes the link resolve where it resolved before the install (O(recorded), from
    M(gpufleet.upgrade.cuda_toolkit_info) run before it); O(policy=target) makes it resolve to O(home).
  - NVIDIA's packages and runfile move the link (their scripts run
    C(update-alternatives --install /usr/local/cuda cuda ...), which replaces a plain link). When the link is
    an alternatives link, the wanted toolkit is registered if needed and chosen with C(update-alternatives --set),
    which also pins the group to manual mode so later package upgrades leave it alone.
  - A plain link is replaced atomically (new link renamed over the old one).
version_added: 0.1.0
options:
  link:
    description: The global link.
    type: path
    default: /usr/local/cuda
  policy:
    description: C(keep) the recorded target, or point at the new C(target) toolkit.
    type: str
    choices: [keep, target]
    default: keep
  home:
    description: The new toolkit; required for O(policy=target).
    type: path
  recorded:
    description:
      - The link as it was before the install (RV(gpufleet.upgrade.cuda_toolkit_info#module:link)),
        with C(exists), C(target) (one hop) and C(resolved). Required for O(policy=keep).
    type: dict
  alternatives_name:
    description: The alternatives group NVIDIA's packages use.
    type: str
    default: cuda
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
  platform:
    platforms: posix
author:
  - gpufleet maintainers (@gpufleet)
"""

EXAMPLES = r"""
- name: Keep /usr/local/cuda where it was
  gpufleet.upgrade.cuda_link:
    policy: keep
    recorded: "{{ before.link }}"
"""

RETURN = r"""
resolved:
  description: Where the link resolves after the run (null when there is none).
  returned: success
  type: str
via_alternatives:
  description: Whether the link is managed through update-alternatives.
  returned: success
  type: bool
commands:
  description: The update-alternatives commands run (would be, in check mode).
  returned: success
  type: list
  elements: list
"""

import os
import re

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _toolkit as tk


def priority_of(path):
    """cuda-12.8 -> 128, as NVIDIA's packages number their alternatives."""
    match = re.search(r"cuda-([0-9]+)\.([0-9]+)$", path.rstrip("/"))
    return int(match.group(1)) * 10 + int(match.group(2)) if match else 1


def plan_alternatives(name, link, want, query):
    """Commands that make the alternatives group resolve to want (None: drop the group and its link)."""
    if want is None:
        return [["--remove-all", name]]
    commands = []
    if want not in [c["path"] for c in query["choices"]]:
        commands.append(["--install", link, name, want, str(priority_of(want))])
    if query["value"] != want or query["mode"] != "manual":
        commands.append(["--set", name, want])
    return commands


def replace_link(link, value):
    tmp = f"{link}.gpufleet-new"
    if os.path.lexists(tmp):
        os.unlink(tmp)
    os.symlink(value, tmp)
    os.replace(tmp, link)


def main():
    module = AnsibleModule(
        argument_spec={
            "link": {"type": "path", "default": "/usr/local/cuda"},
            "policy": {"type": "str", "choices": ["keep", "target"], "default": "keep"},
            "home": {"type": "path"},
            "recorded": {"type": "dict"},
            "alternatives_name": {"type": "str", "default": "cuda"},
        },
        required_if=[("policy", "target", ["home"]), ("policy", "keep", ["recorded"])],
        supports_check_mode=True,
    )
    p = module.params
    link, name = p["link"], p["alternatives_name"]
    recorded = p["recorded"] or {}
    want = tk.link_plan(p["policy"], recorded.get("resolved") if recorded.get("exists") else None, p["home"])
    now = tk.link_state(link)
    if now["exists"] and not now.get("is_link"):
        module.fail_json(
            msg=f"{link} is a real directory or file, not a link; move it away so the link policy can apply"
        )
    tool = module.get_bin_path("update-alternatives")
    query = None
    if tool and now.get("target") and now["target"].startswith("/etc/alternatives/"):
        rc, out, dummy = module.run_command([tool, "--query", name])
        query = tk.parse_alternatives(out) if rc == 0 else None
    result = {"changed": False, "via_alternatives": query is not None, "commands": [], "resolved": now["resolved"]}
    if query is not None:
        result["commands"] = plan_alternatives(name, link, want, query)
        changed = bool(result["commands"])
    else:
        changed = now["resolved"] != want
    if not changed:
        module.exit_json(**result)
    result.update(changed=True, resolved=want)
    if module._diff:
        result["diff"] = {"before": f"{link} -> {now['resolved']}\n", "after": f"{link} -> {want}\n"}
    if module.check_mode:
        module.exit_json(**result)
    if query is not None:
        for args in result["commands"]:
            module.run_command([tool, *args], check_rc=True)
    elif want is None:
        os.unlink(link)
    else:
        value = recorded.get("target") if p["policy"] == "keep" else want
        replace_link(link, value)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
