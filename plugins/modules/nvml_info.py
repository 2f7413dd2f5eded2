#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: nvml_info
short_description: Read GPU facts through NVML and judge each GPU's health against thresholds
description:
  - Reads the driver version, the CUDA version the driver supports and, for every GPU, its identity, memory,
    ECC mode and counters, remapped rows, retired pages, PCIe link, NVLink state, clock event reasons,
    temperature, power, running compute processes and persistence mode, through nvidia-ml-py (C(pynvml)).
  - Judges every GPU against O(thresholds) (the stack profile's C(postcheck.health)) and returns C(healthy) per
    GPU and for the host, with reasons a person can act on.
  - A field the GPU does not support reads C(not supported); the module never fails for it.
  - Without a driver or NVML the module fails with the reason, unless O(gpu_required=false), when it returns
    C(status=skipped) with C(skipped_reason) (hosts without GPUs, such as the lab).
  - Read-only; never reports changed.
version_added: 0.1.0
author: gpufleet maintainers (@gpufleet)
requirements:
  - nvidia-ml-py (module pynvml) on the managed host, and the NVIDIA driver's libnvidia-ml.so.1
options:
  thresholds:
    description:
      - Health thresholds, as in the stack profile's C(postcheck.health).
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
        description:
          - Whether a PCIe link narrower than its maximum, or slower than its maximum generation while the GPU
            is busy (P0), is tolerated. An idle GPU trains its link down; that is a note, never a failure.
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
  gpu_required:
    description:
      - Whether the host must have a working NVIDIA driver and at least one GPU.
      - When false and NVML is unavailable or sees no GPU, the result is C(status=skipped), never a faked health.
    type: bool
    default: true
  expected_gpu_count:
    description: Number of GPUs the host must show; a different count makes the host unhealthy.
    type: int
  gates:
    description:
      - The preflight's GPU gates, judged on the facts read (module_utils C(_gates.judge_gpu_gates)) and returned as
        RV(gates). Each minimum left out is not gated. Health (O(thresholds)) is judged as ever, separately.
      - When NVML cannot be used and O(gpu_required=true), the module fails and RV(gates) holds that one failure.
    type: dict
    suboptions:
      min_driver_version:
        description: Lowest NVIDIA driver version (the profile's C(driver.min_version)), compared number by number.
        type: str
      min_cuda_driver_version:
        description: Lowest CUDA version the driver must support (the profile's C(driver.min_cuda)).
        type: str
      min_compute_capability:
        description: Lowest SM of every GPU (the profile's C(gpu.min_compute_capability)).
        type: str
      profile:
        description: Name of the profile the minimums come from, for the messages.
        type: str
      host:
        description: Name of the host in the messages (the preflight passes C(inventory_hostname)); the host's own
          name by default.
        type: str
attributes:
  check_mode:
    support: full
    description: Read-only; runs the same in check mode.
  diff_mode:
    support: none
    description: Nothing on the host changes, so there is no diff.
notes:
  - Retired pages are not supported on A100 and newer (row remapping replaced them); NVLink state is not supported
    on PCIe-only GPUs such as the RTX PRO 6000. Both read C(not supported).
"""

EXAMPLES = r"""
- name: Read GPU facts and judge health against the stack profile
  gpufleet.upgrade.nvml_info:
    thresholds: "{{ gpufleet_stack.postcheck.health }}"
    gpu_required: "{{ gpufleet_gpu_required | default(gpufleet_stack.gpu.required) }}"
  register: __postcheck_nvml

- name: Judge the preflight's GPU gates against the profile's minimums
  gpufleet.upgrade.nvml_info:
    gates:
      host: "{{ inventory_hostname }}"
      profile: "{{ gpufleet_stack.name }}"
      min_driver_version: "{{ gpufleet_stack.driver.min_version }}"
      min_cuda_driver_version: "{{ gpufleet_stack.driver.min_cuda }}"
      min_compute_capability: "{{ gpufleet_stack.gpu.min_compute_capability }}"
  register: __preflight_nvml

- name: Show the reasons a GPU is unhealthy
  ansible.builtin.debug:
    var: __postcheck_nvml.reasons
  when: not __postcheck_nvml.healthy
"""

RETURN = r"""
status:
  description: C(healthy), C(unhealthy) or C(skipped) (no GPU and none required).
  returned: always
  type: str
  sample: healthy
healthy:
  description: Whether every GPU passed every rule; null when skipped.
  returned: always
  type: bool
skipped_reason:
  description: Why no GPU was judged.
  returned: when status is skipped
  type: str
  sample: "skipped: no GPU (libnvidia-ml.so.1 was not found)"
reasons:
  description: One sentence per failed rule, naming the GPU (index, UUID, name), the value seen and what to do.
  returned: always
  type: list
  elements: str
notes:
  description: Facts worth reading that are not gates (pending ECC mode change, idle PCIe link, unreadable fields).
  returned: always
  type: list
  elements: str
driver_version:
  description: NVIDIA driver version.
  returned: when NVML is available
  type: str
  sample: "580.159.04"
cuda_driver_version:
  description: Highest CUDA version the driver supports.
  returned: when NVML is available
  type: str
  sample: "13.0"
gpu_count:
  description: Number of GPUs NVML sees.
  returned: always
  type: int
gates:
  description:
    - Verdict of the GPU gates (O(gates)) - C(passed), C(failures) (one sentence each naming the host, the value seen,
      the minimum and the fix), C(report) (C(ok, driver ..., CUDA ..., N GPU(s)) or C(failed)) and C(gates) (per gate
      the value seen, the minimum and whether it passed).
  returned: when O(gates) is given
  type: dict
  sample:
    passed: false
    failures:
      - "gpu-07: NVIDIA driver 580.159.04 is below 590.48.01, the minimum of profile cu131 (driver.min_version); fix:
        upgrade the driver to 590.48.01 or newer first (CUDA 13 needs 580 or newer)"
    report: failed
    gates:
      driver: {seen: 580.159.04, minimum: 590.48.01, passed: false}
gpus:
  description: Per GPU facts with C(healthy), C(reasons) and C(notes). A field the GPU does not support reads
    C(not supported).
  returned: always
  type: list
  elements: dict
  sample:
    - index: 0
      name: NVIDIA H200
      uuid: GPU-8c0e5b1a-0000-0000-0000-000000000000
      pci_bus_id: "00000000:00:05.0"
      compute_capability: "9.0"
      memory: {total_mib: 143771, used_mib: 0}
      ecc_mode: {current: enabled, pending: enabled}
      ecc_errors: {volatile: {corrected: 0, uncorrected: 0}, aggregate: {corrected: 0, uncorrected: 0}}
      remapped_rows: {correctable: 0, uncorrectable: 0, pending: false, failure: false}
      retired_pages: not supported
      pcie: {gen_current: 5, gen_max: 5, width_current: 16, width_max: 16, replay_counter: 0}
      nvlink: not supported
      clock_event_reasons: [gpu_idle]
      temperature_c: 31
      power: {draw_w: 75.3, limit_w: 700.0}
      processes: []
      persistence_mode: enabled
      healthy: true
      reasons: []
      notes: []
"""

import socket

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _gates, _nvml

ARGUMENT_SPEC = {
    "thresholds": {"type": "dict", "default": {}, "options": _nvml.THRESHOLD_SPEC},
    "gpu_required": {"type": "bool", "default": True},
    "expected_gpu_count": {"type": "int"},
    "gates": {
        "type": "dict",
        "options": {
            "min_driver_version": {"type": "str"},
            "min_cuda_driver_version": {"type": "str"},
            "min_compute_capability": {"type": "str"},
            "profile": {"type": "str"},
            "host": {"type": "str"},
        },
    },
}


def build_module():
    return AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)


def run(module, nvml_loader=_nvml.load_pynvml):
    params = module.params
    gates = params["gates"]
    host = (gates or {}).get("host") or socket.gethostname()
    try:
        result, facts = _nvml.host_health(
            nvml_loader, params["gpu_required"], params["thresholds"], params["expected_gpu_count"]
        )
    except _nvml.NvmlUnavailable as exc:
        extra = {"gates": _gates.nvml_unusable(str(exc), host)} if gates is not None else {}
        module.fail_json(msg=_nvml.unavailable_message(host, exc), status="failed", **extra)
    if gates is not None and facts is not None:
        result["gates"] = _gates.judge_gpu_gates(facts, gates, host)
    return result


def main():
    module = build_module()
    module.exit_json(**run(module))


if __name__ == "__main__":
    main()
