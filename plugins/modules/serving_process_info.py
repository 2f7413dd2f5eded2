#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: serving_process_info
short_description: What a serving unit runs - its effective settings, its main process and that process's tree
description:
  - "Reads a systemd unit as systemd runs it (C(systemctl show): main pid, cgroup, state, ExecStart, Environment,
    EnvironmentFiles, drop-ins, unit file), the unit file and every drop-in, and describes the unit's main process
    from C(/proc): its executable, its command line, its environment, its working folder and the venv its
    interpreter runs from (found from the path it was started by and the site-packages it has mapped, not from
    C(/proc/<pid>/exe), which the kernel resolves to the base interpreter)."
  - Works on any server, SGLang or another; it needs no endpoint of the server.
  - Where there is no systemd (a container, a test machine), give O(main_pid) instead of O(unit).
  - "Environment values are returned only for O(environ_keys); the other variables are named (an environment may
    hold tokens)."
  - With O(expect), judges the process (its venv, its environment) and returns RV(problems); with
    O(fail_on_problems) it fails on them, naming the host, each problem and O(fix) (one task where a check is on the
    host's downtime path).
  - Read-only; never reports changed.
version_added: 0.1.0
author: gpufleet maintainers (@gpufleet)
options:
  unit:
    description: The systemd unit (C(gpufleet-serving) or C(gpufleet-serving.service)).
    type: str
  main_pid:
    description: The server's main pid, where no systemd unit runs it.
    type: int
  environ_keys:
    description: The environment variables whose values are returned (process, unit, environment files).
    type: list
    elements: str
    default: [CUDA_HOME, CUDA_PATH, PATH, LD_LIBRARY_PATH]
  expect:
    description: What the main process must be; RV(problems) lists every difference.
    type: dict
    suboptions:
      venv:
        description: Venv folders the interpreter may run from (a link counts as where it points now).
        type: list
        elements: path
        default: []
      env:
        description: Variables its environment must hold, with their values.
        type: dict
        default: {}
  fail_on_problems:
    description: Fail when the main process differs from O(expect) (or none runs).
    type: bool
    default: false
  fix:
    description: What to do about a failure of O(fail_on_problems), added to its message.
    type: str
    default: restart the unit, and check `systemctl cat <unit>` for a drop-in that overrides its files
  systemctl:
    description: The systemctl command.
    type: str
    default: systemctl
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  platform:
    platforms: posix
notes:
  - Reading another user's process environment needs root (C(become)).
"""

EXAMPLES = r"""
- name: Read what the serving unit runs
  gpufleet.upgrade.serving_process_info:
    unit: gpufleet-serving
  register: serving

- name: Check the restored server runs from the restored venv with its CUDA_HOME
  gpufleet.upgrade.serving_process_info:
    unit: gpufleet-serving
    expect:
      venv: [/opt/gpufleet/serving/venvs/cu128-0123456789ab]
      env: {CUDA_HOME: /usr/local/cuda-12.8}
    fail_on_problems: true
    fix: check the current link and restart the unit

- name: A server started as a plain process tree (no systemd)
  gpufleet.upgrade.serving_process_info:
    main_pid: 4242
"""

RETURN = r"""
main_pid:
  description: The main process's pid (0 when the unit runs none).
  returned: always
  type: int
running:
  description: A main process runs.
  returned: always
  type: bool
process:
  description:
    - The main process, C({pid, running, exe, exe_deleted, cmdline, environ, environ_names, cwd, started_as, venv,
      venv_from, venv_real, errors}). C(venv) is the venv as started (through links such as C(current)),
      C(venv_real) the folder it runs from; a field that could not be read is null, with the reason in C(errors).
  returned: when a main process runs
  type: dict
tree:
  description: The main pid and every descendant that runs now, with the unit cgroup's members (sorted).
  returned: always
  type: list
  elements: int
unit:
  description:
    - The unit as systemd runs it, C({name, main_pid, control_group, active_state, sub_state, exec_start,
      environment, environment_names, environment_files, drop_in_paths, fragment_path, need_daemon_reload}).
  returned: when O(unit) is given
  type: dict
sources:
  description:
    - The unit file and its drop-ins in systemd's merge order, C({path, kind, readable, settings}); C(settings)
      holds what each sets of C(ExecStart), C(Environment) and C(EnvironmentFile) (null when it sets nothing).
  returned: always
  type: list
  elements: dict
problems:
  description: How the main process differs from O(expect), in words.
  returned: when O(expect) is given
  type: list
  elements: str
"""

import socket

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _host_model as hm
from ansible_collections.gpufleet.upgrade.plugins.module_utils import _unit as un


def build_module():
    return AnsibleModule(
        argument_spec={
            "unit": {"type": "str"},
            "main_pid": {"type": "int"},
            "environ_keys": {
                "type": "list",
                "elements": "str",
                # names of variables whose values are returned, never a value itself
                "no_log": False,
                "default": ["CUDA_HOME", "CUDA_PATH", "PATH", "LD_LIBRARY_PATH"],
            },
            "expect": {
                "type": "dict",
                "options": {
                    "venv": {"type": "list", "elements": "path", "default": []},
                    "env": {"type": "dict", "default": {}},
                },
            },
            "fail_on_problems": {"type": "bool", "default": False},
            "fix": {
                "type": "str",
                "default": "restart the unit, and check `systemctl cat <unit>` for a drop-in that overrides its files",
            },
            "systemctl": {"type": "str", "default": "systemctl"},
        },
        required_one_of=[("unit", "main_pid")],
        mutually_exclusive=[("unit", "main_pid")],
        supports_check_mode=True,
    )


def main():
    module = build_module()
    p = module.params
    expect = p["expect"]
    keys = set(p["environ_keys"]) | set((expect or {}).get("env") or {})
    try:
        seen = hm.observe_serving(p["unit"], p["main_pid"], keys, module.run_command, p["systemctl"])
    except un.UnitError as exc:
        module.fail_json(
            msg=f"{socket.gethostname()}: {exc}; on a host without systemd give main_pid (the server's main process)"
        )
    process = seen["process"]
    result = {
        "changed": False,
        "main_pid": process["pid"] if process else 0,
        "running": bool(process and process["running"]),
        "tree": seen["tree"],
        "sources": seen["sources"],
    }
    if process:
        result["process"] = process
    if seen["unit"] is not None:
        result["unit"] = seen["unit"]
    if expect is not None:
        env = {k: str(v) for k, v in expect["env"].items()}
        if process:
            found = hm.process_differences(process, expect["venv"], env, who="expect.env")
            result["problems"] = [words for _kind, words in found]
        else:
            result["problems"] = [f"{p['unit'] or p['main_pid']} runs no main process"]
        if p["fail_on_problems"] and result["problems"]:
            module.fail_json(msg=f"{socket.gethostname()}: {'; '.join(result['problems'])}; fix: {p['fix']}", **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
