#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: venv_build
short_description: Pull the locked wheels, build a serving venv beside the current one and verify it
version_added: 0.2.0
description:
  - The host side of role C(venv_rebuild)'s build step, in one call. It fetches the wheels the host lacks from the fleet
    cache (each checked against the lock's sha256 while it streams; a wrong or cut file is refused and never
    installed), writes the lock's requirements, installs the locked uv in the tools venv when it differs, removes an
    unverified venv of this lock (what a failed build left), creates the venv with the host's Python, installs exactly
    the lock with C(uv pip sync --require-hashes --no-index) through the build's own cache, runs the verifier inside
    the new venv (imports, the CUDA torch was built for, local tags, same-version groups, C(uv pip check)) and marks
    the venv verified.
  - A build that fails removes the venv it began (never the one C(current) points at), so that nothing half built
    stays on the host; one that ran out of space says where, how much the new venv needs (the estimate of role
    C(preflight)'s disk gate, from the lock's installed sizes) and how much is free, and the fix.
  - Never touches the C(current) link or the venv it points at; the switch is a later step of the role.
  - The role calls it only when the lock's venv is not built and verified yet; a verified venv is never rebuilt
    unless the role asks for a repair.
author:
  - gpufleet maintainers (@gpufleet)
attributes:
  check_mode:
    support: full
    description: Reports the steps it would run (RV(steps)) and the wheels it would fetch (RV(fetched)).
  diff_mode:
    support: full
    description: The venv before (absent, or not verified) and after (verified for the lock), with the steps.
options:
  venv:
    description: The new venv's path (C(<serving_root>/venvs/<venv_name>)).
    type: path
    required: true
  current:
    description: Where C(current) points now; a venv at O(venv) that is not it and not verified is removed first.
    type: str
    default: ""
  python:
    description: The host's Python the venv is created with.
    type: str
    required: true
  tools_root:
    description: The tools venv holding the locked uv.
    type: path
    required: true
  serving_root:
    description: The serving root (C(venvs/), C(locks/), the build's own uv cache).
    type: path
    required: true
  wheelhouse:
    description: The host's wheelhouse, where fetched or pushed wheels lie.
    type: path
    required: true
  lock_file:
    description: Where the lock's requirements (pins with hashes) are written.
    type: path
    required: true
  lock_text:
    description: The lock's requirements text.
    type: str
    required: true
  tools_file:
    description: Where the tools' requirements are written.
    type: path
    required: true
  tools_text:
    description: The tools' requirements text (uv with its hash).
    type: str
    required: true
  uv_version:
    description: The uv version the lock pins; the tools venv is reinstalled when it holds another.
    type: str
    default: ""
  wheels:
    description: Every wheel of the lock, packages and tools (C(filename), C(sha256), C(size) where known).
    type: list
    elements: dict
    required: true
  pull_base:
    description: The fleet cache's C(/wheels) URL the host pulls from; empty when the controller pushed the wheels.
    type: str
    default: ""
  timeout:
    description: Seconds a wheel's download may stall.
    type: int
    default: 600
  sync_timeout:
    description: Seconds C(uv pip sync) may take before the build fails naming the step and the limit.
    type: int
    default: 3600
  compile_bytecode:
    description: Compile the venv's bytecode during the sync (while the old venv still serves).
    type: bool
    default: false
  mark:
    description: The lock's hash, written into the venv's verified mark once the checks passed.
    type: str
    required: true
  verifier:
    description: The verifier's source (role C(venv_rebuild)'s C(files/verify_venv.py)), run with the new venv's Python.
    type: str
    required: true
  verify:
    description: The verifier's spec (C(packages), C(imports), C(torch_like), C(cuda_version), C(local_tags),
      C(same_version), C(gpu_required), C(overrides)).
    type: dict
    required: true
  host:
    description: The host's name in messages (the inventory's); empty - the host's own name.
    type: str
    default: ""
  space_factor:
    description: The margin the need of a full disk is given with, times the lock's installed size (as role
      C(preflight)'s C(preflight_space_factor)).
    type: float
    default: 1.5
notes:
  - The role's inspect and locate steps run the same host code (C(plugins/module_utils/_venv_host.py)) as a script
    through C(ansible.builtin.raw), which costs a host no module wrapper.
"""

EXAMPLES = r"""
- name: Pull the locked wheels, build the new venv and verify it
  gpufleet.upgrade.venv_build:
    venv: /opt/gpufleet/serving/venvs/cu130-3f2a
    current: /opt/gpufleet/serving/venvs/cu128-91c0
    python: /usr/bin/python3
    tools_root: /opt/gpufleet/tools
    serving_root: /opt/gpufleet/serving
    wheelhouse: /var/cache/gpufleet/wheels
    lock_file: /opt/gpufleet/serving/locks/cu130-3f2a.txt
    lock_text: "{{ lock_requirements }}"
    tools_file: /opt/gpufleet/serving/locks/tools.txt
    tools_text: "{{ tools_requirements }}"
    wheels: "{{ gpufleet_wheel_lock.packages + gpufleet_wheel_lock.tools }}"
    pull_base: "{{ gpufleet_fleet_cache_base }}/wheels"
    mark: "{{ gpufleet_wheel_lock.hash }}"
    verifier: "{{ lookup('ansible.builtin.file', 'verify_venv.py') }}"
    verify: {packages: {torch: 2.9.1+cu130}, imports: [torch], torch_like: [torch], cuda_version: "13.0"}
  register: built
"""

RETURN = r"""
ok:
  description: Whether the venv was built and passed its checks (in check mode, whether the steps could be planned).
  type: bool
  returned: always
steps:
  description: The steps run (or, in check mode, to run), in order, e.g. C(fetch), C(lock file), C(tools),
    C(remove unverified), C(venv), C(sync), C(verify), C(mark).
  type: list
  elements: str
  returned: always
fetched:
  description: File names of the wheels fetched (or to fetch) from the fleet cache.
  type: list
  elements: str
  returned: always
failed_step:
  description: The step that failed.
  type: str
  returned: failure
error:
  description: >-
    What the failed step saw (a truncated download names the bytes received against the expected size; a tool that
    failed, its error lines; a full disk, C(no space left on <mount> on <host>: need N GiB, free M GiB)).
  type: str
  returned: failure
fix:
  description: What to do about it, the end of the failure's message.
  type: str
  returned: failure
removed:
  description: The venv the failed build began and removed.
  type: str
  returned: failure, when a venv was begun
no_space:
  description: Where a build that ran out of space could not write (C(seen)), the mount holding it (C(mount)) and
    its free bytes after the partial venv was removed (C(free_bytes)).
  type: dict
  returned: failure, when the disk was full
output:
  description: The last 4,000 characters of the failed tool's output.
  type: str
  returned: failure
verify:
  description: The verifier's answer (C(ok), C(failures), C(checks)).
  type: dict
  returned: when the verify step ran
not_judged:
  description: Imports the verifier could not judge on this host (they need the NVIDIA driver and the host serves
    without a GPU), by name with the reason.
  type: dict
  returned: when the verify step ran
seconds:
  description: Wall seconds of each step run (the fetch, the sync, the verifier ...).
  type: dict
  returned: success, not in check mode
"""

import os
import platform

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.urls import open_url

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _disk, _venv_host

ARGUMENT_SPEC = {
    "venv": {"type": "path", "required": True},
    "current": {"type": "str", "default": ""},
    "python": {"type": "str", "required": True},
    "tools_root": {"type": "path", "required": True},
    "serving_root": {"type": "path", "required": True},
    "wheelhouse": {"type": "path", "required": True},
    "lock_file": {"type": "path", "required": True},
    "lock_text": {"type": "str", "required": True},
    "tools_file": {"type": "path", "required": True},
    "tools_text": {"type": "str", "required": True},
    "uv_version": {"type": "str", "default": ""},
    "wheels": {"type": "list", "elements": "dict", "required": True},
    "pull_base": {"type": "str", "default": ""},
    "timeout": {"type": "int", "default": 600},
    "sync_timeout": {"type": "int", "default": 3600},
    "compile_bytecode": {"type": "bool", "default": False},
    "mark": {"type": "str", "required": True},
    "verifier": {"type": "str", "required": True},
    "verify": {"type": "dict", "required": True},
    "host": {"type": "str", "default": ""},
    "space_factor": {"type": "float", "default": 1.5},
}
# A full disk's fix names the variable that moves the folder it happened in (the deepest folder that holds it).
MOVED_BY = (
    ("wheelhouse", "venv_rebuild_wheelhouse"),
    ("tools_root", "gpufleet_tools_root"),
    ("serving_root", "gpufleet_serving_root"),
)


def venv_state(venv):
    """One line for the diff: what is at the venv's path now."""
    if not os.path.lexists(venv):
        return "absent"
    mark = os.path.join(venv, _venv_host.MARK)
    if os.path.isfile(mark):
        with open(mark, encoding="utf-8") as handle:
            return f"verified for lock {handle.read().strip()}"
    return "present, not verified"


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    spec = dict(module.params, check=module.check_mode)
    before = venv_state(spec["venv"])
    answer = _venv_host.build(spec, open_url)
    result = dict(answer)
    result["changed"] = bool(answer.get("changed"))
    if module._diff:
        after = f"verified for lock {spec['mark']}" if answer.get("ok") else before
        result["diff"] = {
            "before_header": spec["venv"],
            "after_header": spec["venv"],
            "before": f"{spec['venv']}: {before}\n",
            "after": f"{spec['venv']}: {after}\nsteps: {', '.join(answer.get('steps') or [])}\n",
        }
    if not answer.get("ok"):
        # A build that failed had written its folders, lock file or partial venv: never "nothing changed".
        result["changed"] = not module.check_mode
        result.update(failure(spec, answer))
        module.fail_json(**result)
    module.exit_json(**result)


def failure(spec, answer):
    """{error, fix, msg} of a failed build: the cause first, then what was left, then the fix."""
    error, fix = answer.get("error", "no answer"), "check the profile, the indexes or the fleet cache"
    if answer.get("no_space"):
        lock = {"packages": spec["wheels"], "venv_name": os.path.basename(spec["venv"])}
        moved_by = sorted(((spec[option], name) for option, name in MOVED_BY), key=lambda pair: -len(pair[0]))
        host = spec["host"] or platform.node()
        error, fix = _disk.no_space(host, answer["no_space"], lock, spec["current"], spec["space_factor"], moved_by)
    removed = "the partial venv was removed, " if answer.get("removed") else ""
    msg = (
        f"the new venv {spec['venv']} failed at step {answer.get('failed_step', 'build')}: {error}; {removed}"
        f"current was not switched, the old venv keeps serving; fix: {fix}, then run again"
    )
    return {"error": error, "fix": fix, "msg": msg}


if __name__ == "__main__":
    main()
