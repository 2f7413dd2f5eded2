#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# The work happens in the action plugin of the same name (plugins/action/stack_profile.py), on the controller.

from __future__ import annotations

DOCUMENTATION = r"""
module: stack_profile
short_description: Load and validate a stack profile and publish it as C(gpufleet_stack)
description:
  - Finds a stack profile by name (in O(search_dirs), then the collection's C(stacks/) folder) or by path,
    validates it against the collection's JSON Schema, and sets the fact C(gpufleet_stack).
  - Also sets the host's settings derived from it, C(gpufleet_serving_port) (O(serving_port), else the profile's
    C(serving.port)) and C(gpufleet_gpu_required) (O(gpu_required), else the profile's C(gpu.required)).
  - Errors name the host and the profile field's path, for example C(wheels.packages[2].spec).
  - Runs on the controller; needs the Python package C(jsonschema) there.
version_added: 0.1.0
options:
  name:
    description: Profile name, e.g. C(cu130). Mutually exclusive with O(path).
    type: str
  path:
    description: Path of a profile file on the controller.
    type: path
  search_dirs:
    description: Extra folders searched for C(<name>.yml) before the collection's own C(stacks/).
    type: list
    elements: path
    default: []
  index_urls:
    description: Site mirrors, index name to URL; replaces the profile's URL for that index.
    type: dict
    default: {}
  redist_url:
    description: Site mirror of the CUDA redistributable tree; replaces C(cuda.sources.redist.url).
    type: str
  serving_port:
    description:
      - The host's serving port (its inventory's C(gpufleet_serving_port)), published as the fact
        C(gpufleet_serving_port) (an int). Unset or empty, the profile's C(serving.port).
    type: raw
  gpu_required:
    description:
      - Whether the host must have a GPU (its inventory's C(gpufleet_gpu_required)), published as the fact
        C(gpufleet_gpu_required) (a bool). Unset or empty, the profile's C(gpu.required).
    type: raw
attributes:
  check_mode:
    support: full
    description: Reads and validates only; the same result in check mode.
  diff_mode:
    support: none
    description: Nothing on the host changes, so there is no diff.
  action:
    support: full
    description: Runs as an action plugin on the controller.
author:
  - gpufleet maintainers (@gpufleet)
"""

EXAMPLES = r"""
- name: Load the cu130 stack profile with a site mirror
  gpufleet.upgrade.stack_profile:
    name: cu130
    index_urls:
      pytorch-cu130: https://mirror.example.com/pytorch/cu130
"""

RETURN = r"""
profile:
  description: The validated profile, with overrides applied and C(source.path)/C(source.sha256) added.
  returned: success
  type: dict
"""
