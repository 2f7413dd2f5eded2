#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: host_state
short_description: Compare a serving host with the desired state of a stack profile, item by item
description:
  - "The one model of a host's state that the audit, the upgrade (converge or repair) and the rollback use
    (C(module_utils/_host_model.py)). Lists every managed item with its expected and observed value and, where they
    differ, the drift in words (C(serving venv: six 1.17.0 missing),
    C(gpufleet-serving.env: CUDA_HOME is /usr/local/cuda-12.8, profile wants /usr/local/cuda-13.0))."
  - "Items: the target toolkit (present, complete, every installed file against the sha256 its install marker
    recorded), the global CUDA link (policy C(target)), the C(current) link, the serving venv (the lock's
    distributions and versions, each installed file against its RECORD hash), each managed file against its rendered
    template, the GPUs as M(gpufleet.upgrade.nvml_info) judged them."
  - "With O(serving), also what runs (the code of M(gpufleet.upgrade.serving_process_info)): the C(serving unit)
    as systemd runs it (its unit file, every drop-in, its ExecStart and environment against the rendered unit and
    environment file: a drop-in that overrides what the profile sets is named; a stopped unit whose port another
    process holds names that process) and the C(serving process), the
    unit's main process (its command line, its environment, the venv its interpreter runs from, against the unit
    and C(current)). Each drifted item of these says how a re-run repairs it (RV(repair)). The processes of the
    server's tree are the server's own in the C(gpus) judgement."
  - Read only. Reports changed only with O(drift_is_change) on a drifted host (the audit counts what an upgrade would
    change so). With C(--diff), returns the difference of every drifted file and the drift lines of the others.
version_added: 0.1.0
options:
  toolkit:
    description:
      - The target toolkit, C({home, release, components, link, link_policy, verify}); omitted, not judged.
      - C(verify) is C(stat) (default; a file whose size, mtime, ctime and inode are those its install recorded is
        the installed file, any other is hashed - a write changes ctime and nothing sets it back) or C(sha256)
        (every file hashed against the sha256 its install recorded).
    type: dict
  venv:
    description:
      - The serving venv, C({link, expected_path, venv_name, packages, verify}); C(packages) are the lock's
        C({name, version}); C(verify) is C(record) (sha256 of every file, default), C(size) or C(none).
      - C(no_lock) (a reason) instead says there is no lock to judge the venv against (an audit without a lock file
        of a host that records none); the venv link item then names what current points at and that reason.
    type: dict
  files:
    description: Managed files, each C({label, path, content, kind}); C(kind=env) compares variable by variable.
    type: list
    elements: dict
    default: []
  gpus:
    description:
      - The result of M(gpufleet.upgrade.nvml_info) on this host, judged as the C(gpus) item; omitted (and no
        O(gpu_health)), the GPUs are not judged.
    type: dict
  gpu_health:
    description:
      - Read the GPUs through NVML here and judge them as M(gpufleet.upgrade.nvml_info) would (the same code), so the
        model needs no second round trip; the result is returned as RV(gpu_health). Ignored when O(gpus) is given.
    type: dict
    suboptions:
      required:
        description: A host without NVML or without GPUs fails (as M(gpufleet.upgrade.nvml_info) with gpu_required).
        type: bool
        default: true
      thresholds:
        description:
          - The health thresholds, as O(gpufleet.upgrade.nvml_info#module:thresholds) of nvml_info (the same spec).
          - Keys not given take the defaults below.
        type: dict
        default: {}
        suboptions:
          max_uncorrectable_ecc:
            description: Most uncorrectable ECC errors (volatile or aggregate counter) a healthy GPU may show.
            type: int
            default: 0
          max_pending_row_remaps:
            description: Most pending row remaps (NVML reports 0 or 1) a healthy GPU may show.
            type: int
            default: 0
          allow_row_remap_failure:
            description: Whether a failed row remap is tolerated.
            type: bool
            default: false
          allow_pcie_downgrade:
            description: Whether a PCIe link narrower or slower than its maximum while the GPU is busy is tolerated.
            type: bool
            default: false
          max_temperature_c:
            description: Highest GPU temperature in degrees Celsius a healthy GPU may show.
            type: int
            default: 87
          forbid_processes:
            description: Whether running compute processes make a GPU unhealthy (the host should be drained).
            type: bool
            default: true
          fail_on_clock_events:
            description: Clock event reasons that make a GPU unhealthy.
            type: list
            elements: str
            default: [hw_slowdown, hw_thermal_slowdown, hw_power_brake_slowdown, sw_thermal_slowdown]
      expected_gpu_count:
        description: The number of GPUs the host must have.
        type: int
  serving:
    description:
      - What runs, judged as the C(serving unit) and C(serving process) items; omitted, not judged.
      - The rendered unit and environment file are those of O(files) at O(serving.unit_path) and O(serving.env_path).
    type: dict
    suboptions:
      unit:
        description: The systemd unit.
        type: str
      main_pid:
        description: The server's main pid where no systemd unit runs it (judged against the profile directly).
        type: int
      unit_path:
        description: Where the collection writes the unit (an item of O(files)).
        type: path
        required: true
      env_path:
        description: Where the collection writes the unit's environment file (an item of O(files)).
        type: path
        required: true
      venv_link:
        description: The C(current) link; the server must run from where it points. Defaults to the C(link) of O(venv).
        type: path
  state_path:
    description:
      - The host's state file (C(state.json)) to read and return as RV(last_run), so the audit reads what the last run
        left in the same call. Absent file, empty RV(last_run).
      - "Also judged as item C(run record): a missing file while the state folder holds gpufleet backups is drift (the
        record was lost), named with the fix; so is a file this collection cannot act on (not JSON, an unknown
        schema version, phase, status or result), whose RV(last_run) is then empty."
    type: path
  drift_is_change:
    description:
      - Report a drifted host as changed (what an audit counts); otherwise the module never reports changed.
    type: bool
    default: false
  fact:
    description:
      - Also publish the verdict (RV(in_sync), RV(drift), RV(drifted), RV(items), RV(on_profile), RV(last_run)) as a
        fact of this name, so a role needs no task of its own to keep it (role assess publishes C(assess_result)).
    type: str
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
- name: Compare the host with the profile
  gpufleet.upgrade.host_state:
    toolkit:
      home: /usr/local/cuda-13.0
      release: 13.0.2
      components: [cuda_nvcc, cuda_cudart]
      link: /usr/local/cuda
      link_policy: keep
    venv:
      link: /opt/gpufleet/serving/current
      expected_path: /opt/gpufleet/serving/venvs/cu130-0123456789ab
      venv_name: cu130-0123456789ab
      packages: "{{ gpufleet_wheel_lock.packages }}"
    files:
      - label: gpufleet-serving.env
        path: /etc/gpufleet/gpufleet-serving.env
        content: "{{ lookup('ansible.builtin.template', 'serving.env.j2') }}"
        kind: env
  register: state
"""

RETURN = r"""
in_sync:
  description: Every item matches.
  returned: always
  type: bool
drift:
  description: Every drift line, in item order.
  returned: always
  type: list
  elements: str
drifted:
  description:
    - Names of the items that drifted (C(toolkit), C(cuda link), C(serving venv link), C(serving venv), a file's
      label, C(gpus)).
  returned: always
  type: list
  elements: str
gpu_health:
  description: What O(gpu_health) read and judged, in M(gpufleet.upgrade.nvml_info)'s return format.
  returned: when O(gpu_health) is given and O(gpus) is not
  type: dict
last_run:
  description: The state file of O(state_path) as the last run left it.
  returned: when O(state_path) is given
  type: dict
items:
  description: Every item, C({item, ok, expected, observed, drift}).
  returned: always
  type: list
  elements: dict
repair:
  description:
    - How a re-run of the upgrade repairs what runs, C({restart, refuse}); C(restart) is true when the unit must be
      restarted (it runs other than its files say), C(refuse) lists the fix of each override the collection does
      not remove (a drop-in it did not write, a unit file that overrides its own).
  returned: always
  type: dict
on_profile:
  description:
    - The C(serving venv link) item matches (C(current) is a venv of the lock), or there is no such item. A drifted
      host on its profile is repaired rather than upgraded.
  returned: always
  type: bool
"""

import os
import socket

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _backup as bk
from ansible_collections.gpufleet.upgrade.plugins.module_utils import _host_model as hm
from ansible_collections.gpufleet.upgrade.plugins.module_utils import _nvml
from ansible_collections.gpufleet.upgrade.plugins.module_utils import _state as st
from ansible_collections.gpufleet.upgrade.plugins.module_utils import _toolkit as tk
from ansible_collections.gpufleet.upgrade.plugins.module_utils import _unit as un

# What option fact publishes: the verdict and the last run, not the module's own keys (changed, diff).
FACT_KEYS = ("in_sync", "drift", "drifted", "items", "on_profile", "last_run", "repair")


def toolkit_items(spec):
    home, release = spec["home"], spec["release"]
    status = tk.target_status(home, release, spec.get("components") or [])
    marker = tk.read_marker(home) if os.path.isdir(home) else None
    items = [hm.toolkit_item(home, release, status, marker, spec.get("verify") or "stat")]
    if spec.get("link"):
        before = (marker or {}).get("link_before") or {}
        recorded = before.get("resolved") if before.get("exists") else None
        items.append(hm.link_item(tk.link_state(spec["link"]), spec.get("link_policy") or "keep", home, recorded))
    return items


def venv_items(spec):
    link = spec["link"]
    target = os.path.realpath(link) if os.path.islink(link) else None
    if spec.get("no_lock"):
        # No lock to judge by: the host is not known to run any, which is drift whatever its venv holds.
        seen = f"current is {os.path.basename(target)}" if target else f"{link} is missing"
        return [hm.item(hm.VENV_LINK, None, target, [f"{hm.VENV_LINK}: {seen}; {spec['no_lock']}"])]
    items = [hm.venv_link_item(link, target, spec["expected_path"], spec.get("venv_name") or "")]
    observed = hm.read_venv(target or spec["expected_path"], spec.get("verify") or "record")
    items.append(hm.venv_item(observed, spec.get("packages") or []))
    return items


def serving_items(spec, files, venv_spec, run):
    """The ``serving unit`` and ``serving process`` items, and the server's pids (for the GPU judgement)."""
    texts = {os.path.normpath(f["path"]): f.get("content") or "" for f in files}
    missing = [key for key in ("unit_path", "env_path") if os.path.normpath(spec[key]) not in texts]
    if missing:
        raise ValueError(f"serving.{' and serving.'.join(missing)} name no file of option files")
    env_text = texts[os.path.normpath(spec["env_path"])]
    keys = set(un.parse_env_file(env_text))
    unit_text = texts[os.path.normpath(spec["unit_path"])]
    port = hm.argv_option(un.expected_exec(unit_text), "--port")
    seen = hm.observe_serving(spec.get("unit"), spec.get("main_pid"), keys, run, port=port)
    link = spec.get("venv_link") or (venv_spec or {}).get("link")
    items = hm.serving_items(seen, unit_text, env_text, spec["unit_path"], spec["env_path"], link)
    return items, set(seen["tree"])


def _backup_ids(folder):
    """The gpufleet backups under folder, oldest first (a lost run record is judged by them)."""
    try:
        return sorted(name for name in os.listdir(folder) if bk.ID_RE.match(name))
    except OSError:
        return []


def main():
    module = AnsibleModule(
        argument_spec={
            "toolkit": {"type": "dict"},
            "venv": {"type": "dict"},
            "files": {"type": "list", "elements": "dict", "default": []},
            "gpus": {"type": "dict"},
            "gpu_health": {
                "type": "dict",
                "options": {
                    "required": {"type": "bool", "default": True},
                    "thresholds": {"type": "dict", "default": {}, "options": _nvml.THRESHOLD_SPEC},
                    "expected_gpu_count": {"type": "int"},
                },
            },
            "serving": {
                "type": "dict",
                "options": {
                    "unit": {"type": "str"},
                    "main_pid": {"type": "int"},
                    "unit_path": {"type": "path", "required": True},
                    "env_path": {"type": "path", "required": True},
                    "venv_link": {"type": "path"},
                },
                "mutually_exclusive": [("unit", "main_pid")],
                "required_one_of": [("unit", "main_pid")],
            },
            "state_path": {"type": "path"},
            "drift_is_change": {"type": "bool", "default": False},
            "fact": {"type": "str"},
        },
        supports_check_mode=True,
    )
    p = module.params
    items, diffs, file_labels, extra = [], [], set(), {}
    record_problem = ""
    if p["state_path"]:
        # Validated as every reader takes it: a record this collection cannot act on is a problem the model names,
        # never a last run it believes.
        try:
            extra["last_run"] = st.read_previous(p["state_path"])
        except st.StateError as exc:
            extra["last_run"], record_problem = {}, str(exc)
    serving, server_pids = [], None
    if p["serving"]:
        try:
            serving, server_pids = serving_items(p["serving"], p["files"], p["venv"], module.run_command)
        except (un.UnitError, ValueError) as exc:
            module.fail_json(msg=f"{socket.gethostname()}: host_state: {exc}")
    gpus = p["gpus"]
    if gpus is None and p["gpu_health"] is not None:
        health = p["gpu_health"]
        try:
            # The server's own processes are listed as its own and not judged; any other is foreign.
            gpus = _nvml.host_health(
                _nvml.load_pynvml,
                health["required"],
                health["thresholds"],
                health["expected_gpu_count"],
                server_pids=server_pids,
            )[0]
        except _nvml.NvmlUnavailable as exc:
            module.fail_json(msg=_nvml.unavailable_message(socket.gethostname(), exc), status="failed")
        extra["gpu_health"] = gpus
    try:
        if p["toolkit"]:
            items += toolkit_items(p["toolkit"])
        if p["venv"]:
            items += venv_items(p["venv"])
        for spec in p["files"]:
            observed = hm.read_text(spec["path"])
            entry = hm.file_item(
                spec.get("label") or spec["path"],
                spec["path"],
                spec.get("content") or "",
                observed,
                spec.get("kind") or "text",
            )
            items.append(entry)
            file_labels.add(entry["item"])
            if not entry["ok"]:
                diffs.append(
                    {
                        "before_header": spec["path"],
                        "after_header": f"{spec['path']} (template)",
                        "before": observed or "",
                        "after": spec.get("content") or "",
                    }
                )
        items += serving
        if p["state_path"]:
            backups = _backup_ids(os.path.join(os.path.dirname(p["state_path"]), "backups"))
            items.append(hm.run_record_item(p["state_path"], extra["last_run"] or None, backups, record_problem))
        if gpus is not None:
            items.append(hm.gpu_item(gpus))
    except (KeyError, TypeError) as exc:
        module.fail_json(msg=f"host_state: an item spec lacks {exc}; see the module's options for each item's keys")
    except ValueError as exc:
        module.fail_json(msg=f"host_state: {exc}")
    verdict = hm.judge(items)
    verdict["on_profile"] = hm.VENV_LINK not in verdict["drifted"]
    verdict["repair"] = hm.repairs(items)
    result = dict(verdict, changed=bool(p["drift_is_change"] and not verdict["in_sync"]), **extra)
    if p["fact"]:
        result["ansible_facts"] = {p["fact"]: {k: v for k, v in result.items() if k in FACT_KEYS}}
    if module._diff:
        other = [line for entry in items if entry["item"] not in file_labels for line in entry["drift"]]
        if other:
            diffs.insert(
                0,
                {
                    "before_header": "host",
                    "after_header": "profile",
                    "before": "".join(f"{line}\n" for line in other),
                    "after": "",
                },
            )
        result["diff"] = diffs
    module.exit_json(**result)


if __name__ == "__main__":
    main()
