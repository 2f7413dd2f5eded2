#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: preflight_probe
short_description: Read on a host, in one call, what the preflight gates judge
version_added: 0.2.0
description:
  - Role C(preflight) asks the host once for everything its gates read after the lock is taken, instead of a task
    per gate; filter C(gpufleet.upgrade.preflight_gates) judges the answers on the controller.
  - The host's state file (as module C(gpufleet.upgrade.upgrade_state) with C(state=query) reads it, with the same
    C(recovery)), the Python the venv is built with (C(command -v) in the SSH user's shell), the paths the free space
    gate sizes (C(du -sb)) and the free space under the toolkit root and the serving root (C(df -B1)), the drained
    check's exit status, and, when asked, the mirrors as the host reaches them.
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
  state_path:
    description: The host state file.
    type: path
    required: true
  run_id:
    description: Id of this run (the recovery rule compares it with the recorded run).
    type: str
    required: true
  python:
    description: The Python the venv is built with, looked up on the SSH user's PATH; empty to skip the gate.
    type: str
    default: ""
  serving_root:
    description: The serving root (its C(current) link is the serving venv).
    type: path
    required: true
  toolkit_root:
    description: Where CUDA toolkits are installed side by side (its C(cuda) link is the global toolkit).
    type: path
    required: true
  toolkit_version:
    description: The target toolkit's version (C(cuda-VERSION/bin/nvcc) says whether it is installed).
    type: str
    required: true
  drained_check_cmd:
    description: A shell command that exits 0 when the host is drained; empty to skip the gate.
    type: str
    default: ""
  mirror_urls:
    description: URLs to GET from the host (the mirror gate as the host reaches them); empty to skip.
    type: list
    elements: str
    default: []
  mirror_timeout:
    description: Seconds for each mirror request.
    type: int
    default: 10
  accept_version_change:
    description:
      - Let this collection version recover an unfinished run that another version started (as module
        C(upgrade_state) takes it); otherwise C(recovery) refuses the host.
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: Probe the host for every gate in one call
  gpufleet.upgrade.preflight_probe:
    state_path: /var/lib/gpufleet/state.json
    run_id: "{{ gpufleet_run_id }}"
    python: python3.12
    serving_root: /opt/gpufleet/serving
    toolkit_root: /usr/local
    toolkit_version: "13.0"
  register: probe
"""

RETURN = r"""
state:
  description: C(previous) (the state file, {} when absent) and C(recovery), as module C(upgrade_state) returns them.
  returned: always
  type: dict
python:
  description: C(rc) and C(path) of C(command -v), or C(skipped) when no Python is asked for.
  returned: always
  type: dict
disk:
  description: >-
    C(paths) (the current link, the CUDA link, the target nvcc, the serving root: each C(path), C(exists),
    C(lnk_source)), C(du) (the lines of C(du -sb) over the current venv and toolkit), C(df) (the lines of
    C(df -B1 --output=target,avail)).
  returned: always
  type: dict
drained:
  description: C(rc) and C(stderr) of the drained check, or C(skipped).
  returned: always
  type: dict
mirrors:
  description: One C(url), C(status) (-1 when no answer) and C(msg) per URL of O(mirror_urls).
  returned: always
  type: list
  elements: dict
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.urls import open_url

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _state as st


def _path(path: str) -> dict:
    """What module stat (follow: false) says of a path that the gates read: exists and, for a link, its target."""
    return {
        "path": path,
        "exists": os.path.lexists(path),
        "lnk_source": os.path.realpath(path) if os.path.islink(path) else None,
    }


def disk(module, serving_root: str, toolkit_root: str, toolkit_version: str) -> dict:
    paths = [
        _path(os.path.join(serving_root, "current")),
        _path(os.path.join(toolkit_root, "cuda")),
        _path(os.path.join(toolkit_root, f"cuda-{toolkit_version}", "bin", "nvcc")),
        _path(serving_root),
    ]
    measure = [p["lnk_source"] for p in paths[:2] if p["exists"] and p["lnk_source"]]
    du = []
    if measure:
        rc, out, err = module.run_command(["du", "-sb", "--", *measure])
        if rc != 0:
            module.fail_json(msg=f"du -sb {' '.join(measure)} exited {rc}: {err.strip()[-300:]}")
        du = out.splitlines()
    where = serving_root if paths[3]["exists"] else "/"
    rc, out, err = module.run_command(["df", "-B1", "--output=target,avail", toolkit_root, where])
    if rc != 0:
        module.fail_json(
            msg=f"df {toolkit_root} {where} exited {rc}: {err.strip()[-300:]}; fix: create {toolkit_root} or set the"
            " profile's cuda.root to a folder that exists"
        )
    return {"paths": paths, "du": du, "df": out.splitlines()}


def mirrors(urls: list, timeout: int) -> list:
    answers = []
    for url in urls:
        try:
            with open_url(url, method="GET", timeout=timeout) as resp:
                answers.append({"url": url, "status": resp.status, "msg": "OK"})
        except Exception as exc:  # pylint: disable=broad-exception-caught  # any failure is the gate's answer
            answers.append({"url": url, "status": getattr(exc, "code", -1), "msg": str(exc)[:300]})
    return answers


def run(module) -> dict:
    p = module.params
    try:
        previous = st.read_previous(p["state_path"])
    except st.StateError as exc:
        module.fail_json(msg=str(exc))
    state = {
        "previous": previous,
        "recovery": st.decide_recovery(previous, p["run_id"], accept_version_change=p["accept_version_change"]),
    }
    python = {"skipped": True}
    if p["python"]:
        rc, out, _err = module.run_command(["sh", "-c", 'command -v "$1"', "sh", p["python"]])
        python = {"rc": rc, "path": out.strip()}
    drained = {"skipped": True}
    if p["drained_check_cmd"]:
        rc, _out, err = module.run_command(["sh", "-c", p["drained_check_cmd"]])
        drained = {"rc": rc, "stderr": err}
    return {
        "changed": False,
        "state": state,
        "python": python,
        "disk": disk(module, p["serving_root"], p["toolkit_root"], p["toolkit_version"]),
        "drained": drained,
        "mirrors": mirrors(p["mirror_urls"], p["mirror_timeout"]),
    }


def main():
    module = AnsibleModule(
        argument_spec={
            "state_path": {"type": "path", "required": True},
            "run_id": {"type": "str", "required": True},
            "python": {"type": "str", "default": ""},
            "serving_root": {"type": "path", "required": True},
            "toolkit_root": {"type": "path", "required": True},
            "toolkit_version": {"type": "str", "required": True},
            "drained_check_cmd": {"type": "str", "default": ""},
            "mirror_urls": {"type": "list", "elements": "str", "default": []},
            "mirror_timeout": {"type": "int", "default": 10},
            "accept_version_change": {"type": "bool", "default": False},
        },
        supports_check_mode=True,
    )
    module.exit_json(**run(module))


if __name__ == "__main__":
    main()
