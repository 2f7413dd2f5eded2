#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# The work happens in the action plugin of the same name (plugins/action/run_assumptions.py), on the controller.

from __future__ import annotations

DOCUMENTATION = r"""
module: run_assumptions
short_description: Say what a run assumes for each host and where each value came from
version_added: 0.2.0
description:
  - Prints, once, a line per distinct value of each variable named, with where it came from (C(extra vars),
    C(inventory), or role C(stack)'s default) and the hosts it applies to (the first five, then a count), so that a
    host judged against the default profile or writing its report under the default controller folder is said at
    the start of the run (C(playbooks/upgrade.yml), first play).
  - Changes nothing.
options:
  names:
    description: The variables to say.
    type: list
    elements: str
    required: true
  hosts:
    description: The hosts to say them for (the play's hosts).
    type: list
    elements: str
    required: true
attributes:
  check_mode:
    support: full
    description: Only reads variables; the same in check mode.
  diff_mode:
    support: none
    description: Nothing changes, so there is no diff.
  action:
    support: full
    description: Runs as an action plugin on the controller.
author:
  - gpufleet maintainers (@gpufleet)
"""

EXAMPLES = r"""
- name: Say each host's profile and controller folder and where each came from
  gpufleet.upgrade.run_assumptions:
    names: [gpufleet_stack_profile, gpufleet_controller_dir]
    hosts: "{{ ansible_play_hosts_all }}"
  run_once: true
  delegate_to: localhost
"""

RETURN = r"""
lines:
  description: >-
    The lines printed, e.g. C(gpufleet_stack_profile = cu130 (default of role stack\) for 2 hosts: h2, h3).
  returned: always
  type: list
  elements: str
"""
