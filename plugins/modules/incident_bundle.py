#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: incident_bundle
short_description: Write one archive of what explains a failed or rolled-back host
description:
  - Gathers, on the host, the serving unit's journal since the run began (O(since), else O(run_id)'s time stamp),
    the kernel log's GPU lines (NVRM, Xid; journal of this boot, else C(dmesg)), C(nvidia-smi -q) where it exists, the
    package lists of the venvs of O(venvs) (read from their C(.dist-info) folders, no interpreter run), C(state.json)
    and the newest post-check results under O(state_dir), the unit's environment file and its main process's
    environment, and the members of O(extra) (the run record the controller passes); writes them as one C(.tar.gz) at
    O(dest) (staging name, then renamed), mode C(0600), with C(MANIFEST.json) listing what was collected and, for each
    item that was not, why.
  - Secrets never reach the archive - in the environment file and the process environment, every variable whose name
    holds TOKEN, SECRET, KEY, PASSWORD, AUTH, CREDENTIAL, PRIVATE, COOKIE, SESSION or SIGNATURE reads C(<redacted>), and
    C(user:password@) in any URL reads C(<redacted>@) (module_utils C(_incident)).
  - Each call writes a new archive (changed); check mode collects and reports the members, writes nothing.
version_added: 0.3.0
options:
  dest:
    description: Path of the archive on the host.
    type: path
    required: true
  run_id:
    description: The run's id; its time stamp (C(20261208T001203Z)) bounds the journal.
    type: str
  since:
    description: Start of the journal (journalctl's C(--since) syntax, e.g. C(yesterday)); wins over O(run_id)'s stamp.
    type: str
  unit:
    description: The serving unit (its journal, its main process's environment).
    type: str
  env_file:
    description: The unit's environment file, copied redacted.
    type: path
  venvs:
    description: Label -> venv folder (e.g. C(current), C(previous)); each gives C(venvs/<label>.txt).
    type: dict
    default: {}
  state_dir:
    description: The collection's state folder on the host (C(state.json), C(results/postcheck-*.json)).
    type: path
  postcheck_results:
    description: How many of the newest post-check results to take.
    type: int
    default: 3
  extra:
    description: Archive member name -> content (text, or data written as JSON), e.g. the run record.
    type: dict
    default: {}
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
- name: Bundle what explains the failure
  gpufleet.upgrade.incident_bundle:
    dest: /var/lib/gpufleet/incidents/{{ gpufleet_run_id }}.tar.gz
    run_id: "{{ gpufleet_run_id }}"
    unit: sglang.service
    env_file: /etc/gpufleet/sglang.env
    venvs: {current: /opt/gpufleet/serving/current}
    state_dir: /var/lib/gpufleet
    extra: {run-record.json: {host: gpu-07, outcome: "rolled back: postcheck: ..."}}
"""

RETURN = r"""
path:
  description: The archive on the host (absent in check mode).
  returned: always
  type: str
size:
  description: Its size in bytes (0 in check mode).
  returned: always
  type: int
members:
  description: The members written (in check mode, that would be written), MANIFEST.json included.
  returned: always
  type: list
  elements: str
missing:
  description: Item -> why it is not in the archive (a tool not installed, a file not there, a command's error).
  returned: always
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _incident, _server

ARGUMENT_SPEC = {
    "dest": {"type": "path", "required": True},
    "run_id": {"type": "str"},
    "since": {"type": "str"},
    "unit": {"type": "str"},
    "env_file": {"type": "path"},
    "venvs": {"type": "dict", "default": {}},
    "state_dir": {"type": "path"},
    "postcheck_results": {"type": "int", "default": 3},
    "extra": {"type": "dict", "default": {}},
}


def build_module():
    return AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)


def main_pid(module):
    unit = module.params["unit"]
    if not unit:
        return None
    try:
        return _server.read_unit(unit, module.get_bin_path, module.run_command)["main_pid"] or None
    except _server.ServerUnknown:
        return None


def run(module):
    p = module.params
    collector = _incident.Collector(module.run_command, module.get_bin_path)
    _incident.collect(collector, p, main_pid(module))
    meta = {"run_id": p["run_id"], "since": p["since"] or _incident.run_started(p["run_id"] or ""), "unit": p["unit"]}
    collector.add("MANIFEST.json", collector.manifest(meta))
    members = sorted(collector.members)
    if module.check_mode:
        return {"changed": True, "path": p["dest"], "size": 0, "members": members, "missing": collector.missing}
    size = _incident.write_archive(p["dest"], collector.members)
    return {"changed": True, "path": p["dest"], "size": size, "members": members, "missing": collector.missing}


def main():
    module = build_module()
    module.exit_json(**run(module))


if __name__ == "__main__":
    main()
