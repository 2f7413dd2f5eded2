#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: cuda_toolkit_info
short_description: Report the CUDA toolkits of a host, the C(/usr/local/cuda) link and the alternatives choice
description:
  - Lists every toolkit directory C(cuda-X.Y) under O(root) with its release (from C(version.json), else
    C(nvcc --version)) and the components C(version.json) names.
  - Reports where the C(cuda) link points, the C(update-alternatives) choice for O(alternatives_name),
    and which toolkit a given O(cuda_home) resolves to.
  - Given O(release) and O(components), judges the target directory C(<root>/cuda-<version>) (O(version)) as one of
    C(absent), C(present), C(incomplete) (installed by this collection, components missing),
    C(other_release) (installed by this collection, another patch release), C(foreign) (a toolkit
    installed otherwise that does not match), or C(not_a_toolkit).
  - Read only; never reports changed.
version_added: 0.1.0
options:
  root:
    description: Folder holding the side-by-side toolkits and the C(cuda) link.
    type: path
    default: /usr/local
  link:
    description: The global link; defaults to C(<root>/cuda).
    type: path
  alternatives_name:
    description: Name of the C(update-alternatives) group NVIDIA's packages register.
    type: str
    default: cuda
  cuda_home:
    description: A C(CUDA_HOME) value to resolve to a toolkit.
    type: path
  version:
    description: Target toolkit C(major.minor); with it the result has RV(target).
    type: str
  release:
    description: Target release C(X.Y.Z) the target's C(version.json) must name.
    type: str
  components:
    description: Components the target must hold (keys of C(version.json)).
    type: list
    elements: str
    default: []
  run_nvcc:
    description: Run each toolkit's C(bin/nvcc --version) and report its result.
    type: bool
    default: true
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  platform:
    platforms: posix
author:
  - gpufleet maintainers (@gpufleet)
"""

EXAMPLES = r"""
- name: Read the toolkits of the host
  gpufleet.upgrade.cuda_toolkit_info:
    cuda_home: /usr/local/cuda-13.0
  register: toolkits

- name: Judge the 13.0 target
  gpufleet.upgrade.cuda_toolkit_info:
    version: "13.0"
    release: 13.0.2
    components: [cuda_nvcc, cuda_cudart]
  register: target
"""

RETURN = r"""
toolkits:
  description: Toolkits under O(root).
  returned: always
  type: list
  elements: dict
  contains:
    path:
      description: Toolkit directory.
      type: str
    version:
      description: Release from C(version.json) (C(13.0.2)) or, without it, from nvcc.
      type: str
    components:
      description: Component name to version, from C(version.json).
      type: dict
    nvcc:
      description: C(release)/C(version) that C(nvcc --version) printed, C(ok) whether it ran, C(missing) if absent.
      type: dict
    managed:
      description: Installed by this collection (it left its marker file).
      type: bool
link:
  description: The C(cuda) link, with C(path), C(exists), C(is_link), C(target) (one hop), C(resolved) (final path).
  returned: always
  type: dict
alternatives:
  description: C(update-alternatives --query) of O(alternatives_name) (C(mode), C(value), C(choices)), null if none.
  returned: always
  type: dict
cuda_home:
  description: C(path) given, C(resolved) real path, C(toolkit) the toolkit it lands in (null if none).
  returned: when O(cuda_home) is given
  type: dict
target:
  description: "Judgement of C(<root>/cuda-<version>): C(path), C(status), C(missing) components, C(release) found,
    C(link_before) (the link's state before this collection installed it, from its marker; null without one)."
  returned: when O(version) is given
  type: dict
platform:
  description: C(uname -m) of the host.
  returned: always
  type: str
redist_platform:
  description: The host's platform key in NVIDIA's redist manifests (C(linux-x86_64), C(linux-sbsa)); null if none.
  returned: always
  type: str
free_bytes:
  description: Free bytes on the file system of O(root).
  returned: always
  type: int
writable:
  description: Whether the module's user may create directories in O(root).
  returned: always
  type: bool
root_exists:
  description: Whether O(root) is an existing directory.
  returned: always
  type: bool
user:
  description: The user the module ran as.
  returned: always
  type: str
"""

import os
import pwd

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _redist as rd
from ansible_collections.gpufleet.upgrade.plugins.module_utils import _toolkit as tk


def describe(module, path, run_nvcc):
    release, components = tk.summarize_version_json(tk.read_version_json(path))
    item = {"path": path, "version": release, "components": components, "managed": tk.read_marker(path) is not None}
    nvcc = os.path.join(path, "bin", "nvcc")
    if run_nvcc and os.access(nvcc, os.X_OK):
        rc, out, err = module.run_command([nvcc, "--version"])
        parsed = tk.parse_nvcc_version(out) or {}
        item["nvcc"] = {"ok": rc == 0 and bool(parsed), "missing": False, **parsed}
        if not release and parsed:
            item["version"] = parsed["version"]
    else:
        item["nvcc"] = {"ok": False, "missing": not os.path.exists(nvcc)}
    return item


def alternatives(module, name):
    tool = module.get_bin_path("update-alternatives")
    if not tool:
        return None
    rc, out, dummy = module.run_command([tool, "--query", name])
    return tk.parse_alternatives(out) if rc == 0 else None


def user_name():
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return str(os.geteuid())


def main():
    module = AnsibleModule(
        argument_spec={
            "root": {"type": "path", "default": "/usr/local"},
            "link": {"type": "path"},
            "alternatives_name": {"type": "str", "default": "cuda"},
            "cuda_home": {"type": "path"},
            "version": {"type": "str"},
            "release": {"type": "str"},
            "components": {"type": "list", "elements": "str", "default": []},
            "run_nvcc": {"type": "bool", "default": True},
        },
        required_by={"release": ["version"]},
        supports_check_mode=True,
    )
    p = module.params
    root = p["root"]
    paths = tk.find_toolkits(root)
    stat = os.statvfs(root) if os.path.isdir(root) else None
    result = {
        "changed": False,
        "toolkits": [describe(module, path, p["run_nvcc"]) for path in paths],
        "link": tk.link_state(p["link"] or os.path.join(root, "cuda")),
        "alternatives": alternatives(module, p["alternatives_name"]),
        "platform": os.uname().machine,
        "redist_platform": rd.PLATFORM_BY_MACHINE.get(os.uname().machine),
        "free_bytes": stat.f_bavail * stat.f_frsize if stat else 0,
        "writable": os.access(root, os.W_OK | os.X_OK),
        "root_exists": os.path.isdir(root),
        "user": user_name(),
    }
    if p["cuda_home"]:
        result["cuda_home"] = {
            "path": p["cuda_home"],
            "resolved": os.path.realpath(p["cuda_home"]),
            "toolkit": tk.resolve_home(p["cuda_home"], paths),
        }
    if p["version"]:
        path = os.path.join(root, f"cuda-{p['version']}")
        judged = tk.target_status(path, p["release"] or "", p["components"]) if p["release"] else None
        result["target"] = {"path": path, **(judged or {"status": "present" if tk.is_toolkit(path) else "absent"})}
        # The link's state before this collection installed the target (its marker), for link policy keep.
        marker = tk.read_marker(path) if os.path.isdir(path) else None
        result["target"]["link_before"] = (marker or {}).get("link_before")
    module.exit_json(**result)


if __name__ == "__main__":
    main()
