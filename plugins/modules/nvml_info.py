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
  - "The serving unit's own processes are expected on a serving host: O(server_unit) or O(server_main_pid) (the
    main process and every descendant that runs now, as SGLang's scheduler and tensor-parallel workers are children
    of its launcher), O(server_cgroup) (every member of the unit's cgroup) and O(server_pids) name them. Their compute
    processes are listed as the server's (RV(server_processes), a note per GPU) and never fail a GPU; any other
    compute process is foreign (RV(foreign_processes)) and fails the GPU when O(thresholds.forbid_processes) is true,
    naming its pid, name, memory and GPU. Given none of them, every compute process is foreign."
  - A field the GPU does not support reads C(not supported); the module never fails for it.
  - Without a driver or NVML the module fails with the reason, unless O(gpu_required=false), when it returns
    C(status=skipped) with C(skipped_reason) (hosts without GPUs, such as the lab).
  - "With O(xid), the kernel log is read as well (the journal's kernel messages of this boot, else C(dmesg)): every
    NVIDIA Xid line logged since the serving unit's main process started (its C(ExecMainStartTimestampMonotonic), or
    O(xid.since_s)) is mapped to its GPU by PCI bus id; an Xid of O(xid.fail_on) fails the host, naming the GPU, the
    Xid, the line and the fix; others are notes. A log that cannot be read is a note, never a pass in disguise:
    C(xid.source) is null then."
  - Read-only; never reports changed.
version_added: 0.1.0
author: gpufleet maintainers (@gpufleet)
requirements:
  - nvidia-ml-py (module pynvml) on the managed host, and the NVIDIA driver's libnvidia-ml.so.1
options:
  xid:
    description: Judge the kernel log's Xid lines (profile C(postcheck.xid)); absent, the log is not read.
    type: dict
    suboptions:
      fail_on:
        description: Xids that fail the host (e.g. 79 fallen off the bus, 48/63/64/94/95 ECC and row remaps).
        type: list
        elements: int
        required: true
      since_s:
        description: Seconds since boot from which lines count; default the serving unit's main process start.
        type: float
      host:
        description: The host's name in the messages (the inventory name); default the host's own name.
        type: str
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
        description:
          - Whether a foreign compute process (one that is not the serving unit's, see O(server_main_pid)) makes a
            GPU unhealthy. The serving unit's own processes never do.
        type: bool
        default: true
      fail_on_clock_events:
        description: Clock event reasons that make a GPU unhealthy.
        type: list
        elements: str
        default: [hw_slowdown, hw_thermal_slowdown, hw_power_brake_slowdown, sw_thermal_slowdown]
  server_unit:
    description:
      - The serving unit (C(sglang) or C(sglang.service)); its C(MainPID) and C(ControlGroup) are read with
        C(systemctl show) when the module runs, so they name whichever server the unit runs then.
      - A unit that cannot be read (no systemd, unknown unit) leaves the server unknown, with a note saying why.
    type: str
  server_main_pid:
    description:
      - Main pid of the server, for a host without systemd (the launcher's pid); wins over O(server_unit). It and
        every process below it that runs now are the server's.
      - C(0) says no server runs; then every compute process is foreign, and a note says so.
    type: int
  server_cgroup:
    description:
      - The serving unit's cgroup (read from O(server_unit) when not given), for example
        C(/system.slice/sglang.service); every member (cgroup v2, C(/sys/fs/cgroup)) and its descendants are the
        server's, also a process that left the launcher's tree.
    type: str
  server_pids:
    description: Further pids of the server, taken as they are (no descendants added).
    type: list
    elements: int
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
  - "While the post-check runs the serving unit holds the GPUs: after the switch the new server (the upgrade runs the
    post-check after the restart); and with C(gpufleet_drain=none) anything run before the restart sees the old server,
    which is the same unit. Either way the unit's main pid is read when the check runs, so whichever server the unit
    runs is the server, and only other processes are judged. The health rules (ECC, row remaps, PCIe link, clocks,
    temperature) are properties of the GPU, judged the same beside a server; the GPU's memory use is reported, never
    judged: a serving host's GPUs are never free."
  - NVML reports pids of the host's pid namespace; run the module there (not in a container with its own pid
    namespace) or the server's processes cannot be matched.
  - Retired pages are not supported on A100 and newer (row remapping replaced them); NVLink state is not supported
    on PCIe-only GPUs such as the RTX PRO 6000. Both read C(not supported).
"""

EXAMPLES = r"""
- name: Read GPU facts and judge health against the stack profile
  gpufleet.upgrade.nvml_info:
    thresholds: "{{ gpufleet_stack.postcheck.health }}"
    gpu_required: "{{ gpufleet_gpu_required | default(gpufleet_stack.gpu.required) }}"
  register: __postcheck_nvml

- name: Judge GPU health beside the serving unit, whose own processes are expected
  gpufleet.upgrade.nvml_info:
    thresholds: "{{ gpufleet_stack.postcheck.health }}"
    server_unit: "{{ gpufleet_stack.serving.unit_name }}"
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
server:
  description: The server the module was told about - C(unit), C(main_pid), C(cgroup), C(source) (C(server_main_pid)
    or C(systemd (<ActiveState>))), C(error) (why the unit could not be read) and C(pids) (the main pid expanded to
    every descendant and cgroup member that ran when read; null when unknown).
  returned: when NVML is available and a server option was given
  type: dict
  sample: {unit: sglang, main_pid: 3700, cgroup: /system.slice/sglang.service, source: systemd (active), error: null,
           pids: [3700, 3703, 3704]}
server_processes:
  description: The serving unit's compute processes, one per process and GPU - C(pid), C(name), C(used_mib), C(gpu).
  returned: when NVML is available
  type: list
  elements: dict
  sample: [{pid: 3703, name: python3, used_mib: 125134, gpu: 0}]
foreign_processes:
  description: Every other compute process, as RV(server_processes); each fails its GPU when
    O(thresholds.forbid_processes).
  returned: when NVML is available
  type: list
  elements: dict
xid:
  description: The Xid gate - C(passed), C(reasons), C(notes), C(events) (C(xid), C(pci), C(line), C(at_s),
    C(gpu_index), C(gpu_uuid)), C(source) (C(journal), C(dmesg), or null when the log could not be read),
    C(since_s), C(fail_on).
  returned: when O(xid) is given
  type: dict
gpus:
  description: Per GPU facts with C(healthy), C(reasons), C(notes), C(server_processes) and C(foreign_processes).
    A field the GPU does not support reads
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
      server_processes: []
      foreign_processes: []
      persistence_mode: enabled
      healthy: true
      reasons: []
      notes: []
"""

import socket

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _gates, _nvml, _server, _xid

ARGUMENT_SPEC = {
    "thresholds": {"type": "dict", "default": {}, "options": _nvml.THRESHOLD_SPEC},
    "gpu_required": {"type": "bool", "default": True},
    "expected_gpu_count": {"type": "int"},
    "xid": {
        "type": "dict",
        "options": {
            "fail_on": {"type": "list", "elements": "int", "required": True},
            "since_s": {"type": "float"},
            "host": {"type": "str"},
        },
    },
    **_server.SERVER_SPEC,
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
    server = _server.resolve(params, module.get_bin_path, module.run_command)
    server_pids = server["pids"]
    try:
        result, facts = _nvml.host_health(
            nvml_loader, params["gpu_required"], params["thresholds"], params["expected_gpu_count"], server_pids
        )
    except _nvml.NvmlUnavailable as exc:
        extra = {"gates": _gates.nvml_unusable(str(exc), host)} if gates is not None else {}
        module.fail_json(msg=_nvml.unavailable_message(host, exc), status="failed", **extra)
    if gates is not None and facts is not None:
        result["gates"] = _gates.judge_gpu_gates(facts, gates, host)
    if facts is not None and (server_pids is not None or server["error"]):
        result["server"] = _server.server_fact(server)
        result["notes"] = _server.server_notes(server) + result["notes"]
    if params["xid"] is not None:
        add_xid(module, result, host, server)
    return result


def add_xid(module, result, host, server):
    """The kernel log's Xids since the unit started join the host's reasons (a skipped host keeps them as notes)."""
    params = module.params["xid"]
    host = params["host"] or host
    xid = _xid.check(
        module.run_command,
        module.get_bin_path,
        params["fail_on"],
        result.get("gpus"),
        host,
        params["since_s"],
        server.get("unit"),
    )
    result["xid"] = xid
    if result.get("status") == "skipped":
        result["notes"] = result["notes"] + xid["reasons"] + xid["notes"]
        return
    result["reasons"] = result["reasons"] + xid["reasons"]
    result["notes"] = result["notes"] + xid["notes"]
    if xid["reasons"]:
        result["healthy"], result["status"] = False, "unhealthy"


def main():
    module = build_module()
    module.exit_json(**run(module))


if __name__ == "__main__":
    main()
