#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: gpu_smoke_test
short_description: Prove that a venv's torch and flashinfer kernels run correctly on every GPU of the host
description:
  - Runs a worker script under the Python of a given venv (the serving venv by default), one process per GPU,
    all GPUs at once, with a time limit per check. A check that overruns is killed and reported as failed;
    the checks after it still run.
  - "Checks: C(torch_cuda_version) (C(torch.version.cuda) equals O(expected_cuda)); C(arch_in_list) (each
    GPU's C(sm_XY) is in C(torch.cuda.get_arch_list())); C(bf16_matmul) against an fp32 reference;
    C(flashinfer_single_decode), C(flashinfer_single_prefill) and C(flashinfer_batch_decode) (paged KV cache)
    against torch SDPA in fp32; C(flashinfer_versions) (flashinfer-python, -cubin and -jit-cache agree);
    C(capability_probes) (sm90a/sm100a/sm120a/sm12x support, fp8/fp4 GEMM backends, reported not judged);
    C(peer_access); C(symmetric_memory) (reported); C(nccl_allreduce) across all GPUs (one process per GPU)
    with the right sum and its bus bandwidth."
  - "C(build_targets): the build check for the fleet's SMs, O(target_sms) plus the SMs of this host's GPUs. For each
    target SM, in a worker of its own: the toolkit's nvcc (the one flashinfer's JIT uses: C(CUDA_HOME), C(CUDA_PATH),
    C(nvcc) on C(PATH)) compiles a small kernel for C(sm_XX) and, from SM 9.0 on, C(sm_XXa); C(cuobjdump) lists
    the SASS in each (and disassembles it where C(nvdisasm) is there); flashinfer's JIT builds the decode, prefill
    (per backend, see O(per_sm)) and batch-decode modules the kernel checks use, for the arch flashinfer itself picks
    for that SM (C(12.0a)), all at once, into a scratch workspace under the module's temporary folder, and
    C(cuobjdump) lists their SASS; C(torch.cuda.get_arch_list()) must hold C(sm_XX). A target with a GPU here also
    runs the freshly built flashinfer kernels on it against torch SDPA (once every module built); the others are
    compiled and inspected, not run, and the result says so. Without C(cuobjdump) the SASS is reported not
    inspected rather than failed. The check fails, naming the target, for any target the stack cannot build for
    (C(host_checks.build_targets.cannot_build))."
  - "Tolerances: C(bf16_matmul) relative Frobenius error <= O(tolerances.matmul_rel_err) (default 0.01) and cosine >=
    O(tolerances.min_cosine) (default 0.999); attention checks max abs error <= O(tolerances.attention_atol)
    (default 0.02), relative error <= O(tolerances.attention_rel_err) (default 0.01) (bf16 inputs and outputs
    against an fp32 reference) and the same cosine."
  - O(per_sm) holds the profile's settings per SM (C(postcheck.smoke.per_sm)); a GPU of that SM is judged with
    them (tolerances, expected capability probes) and the build check uses its prefill backends.
  - A check that cannot run because a package is missing fails when the package is in O(required_packages)
    and is reported skipped with the reason otherwise.
  - "One environment: the workers run with the environment the serving unit runs with. The running server's own
    (C(/proc/<main pid>/environ) of O(server_unit) or O(server_main_pid): systemd's environment, the unit's
    C(Environment=) and C(EnvironmentFile=) as they reached the server), else O(env_file) (the unit's environment file,
    read as systemd reads it) over the module's own environment, else the module's environment; RV(serving_env) says
    which and why. Nothing is taken out of it: a variable that turns a feature off by its mere presence
    (C(FLASHINFER_DISABLE_JIT)) acts on the smoke test as on the server, and RV(serving_env) C(presence_flags) names it.
    O(env) is set over it."
  - Every environment the module builds keeps NVLink multicast off (C(NCCL_NVLS_ENABLE=0),
    C(TORCH_SYMM_MEM_DISABLE_MULTICAST=1), C(NVSHMEM_DISABLE_NVLS=1)), whatever the serving environment or O(env)
    says, and sets C(CUDA_DEVICE_ORDER=PCI_BUS_ID) (torch's GPU indices must be NVML's).
  - "Memory: each per-GPU check reports the GPU memory it took (torch's peak allocated and reserved memory, the
    device's used memory after it, what was free before and after; RV(gpus) C(memory), RV(memory)), so what the smoke
    test needs beside a server that holds most of the card is measured, not assumed. The memory one check cached is
    given back before the next. Before the workers start the module reads through NVML (when usable) what each GPU's
    processes hold, the serving unit's apart. An allocation that does not fit (C(torch.cuda.OutOfMemoryError), a CUDA
    C(out of memory) error passed on by flashinfer or NCCL, cuBLAS failing to allocate) is reported as
    C(out_of_memory) with the free memory seen and what the server holds, not as a kernel error."
version_added: 0.1.0
author: gpufleet maintainers (@gpufleet)
requirements:
  - torch (and flashinfer for its checks) in the venv; nothing beyond the standard library for the module itself
options:
  venv:
    description: Venv whose C(bin/python) runs the checks.
    type: path
    default: /opt/gpufleet/serving/current
  python:
    description: Python interpreter to run the checks with, instead of O(venv)'s.
    type: path
  expected_cuda:
    description:
      - The CUDA version C(torch.version.cuda) must report (the profile's C(cuda.version)).
      - Omitted means reported only.
    type: str
  flashinfer_version:
    description: The flashinfer version the profile pins; omitted means only the three packages must agree.
    type: str
  required_packages:
    description: Packages whose absence fails a check (the profile's C(postcheck.smoke.required_packages)).
    type: list
    elements: str
    default: []
  timeout_s:
    description: Time limit of each check, and of the worker's start-up, in seconds.
    type: int
    default: 300
  checks:
    description:
      - Checks to run; all but C(build_targets) by default (it compiles for minutes - name it, or set
        O(build_check)).
    type: list
    elements: str
    choices: [torch_cuda_version, arch_in_list, bf16_matmul, flashinfer_single_decode, flashinfer_single_prefill,
              flashinfer_batch_decode, flashinfer_versions, capability_probes, peer_access, symmetric_memory,
              nccl_allreduce, build_targets]
  gpus:
    description: Indices (PCI bus order, as NVML) of the GPUs to test; all by default. The all-reduce always spans all.
    type: list
    elements: int
  tolerances:
    description: Tolerances of the comparisons.
    type: dict
    default: {}
    suboptions:
      matmul_rel_err:
        description: Largest relative Frobenius error of the bf16 product.
        type: float
        default: 0.01
      attention_atol:
        description: Largest absolute error of an attention output.
        type: float
        default: 0.02
      attention_rel_err:
        description: Largest relative Frobenius error of an attention output.
        type: float
        default: 0.01
      min_cosine:
        description: Smallest cosine similarity between a kernel's output and its reference.
        type: float
        default: 0.999
  build_check:
    description: Add the build check C(build_targets) to the checks (to the default set when O(checks) is omitted).
    type: bool
    default: false
  target_sms:
    description:
      - SMs the stack must build kernels for, as C(major.minor) (the profile's C(gpu.target_sms), for example
        C(["9.0", "12.0"])); the SMs of this host's GPUs are always added. Used by the check C(build_targets).
    type: list
    elements: str
    default: []
  build_timeout_s:
    description: Time limit of the build check of one target SM (flashinfer compiles several modules), in seconds.
    type: int
    default: 900
  per_sm:
    description:
      - Settings for GPUs of one SM (the profile's C(postcheck.smoke.per_sm)); an SM not listed takes O(tolerances)
        and the built-in prefill backends.
    type: list
    elements: dict
    default: []
    suboptions:
      sm:
        description: The SM, as C(major.minor).
        type: str
        required: true
      matmul_rel_err:
        description: Replaces O(tolerances.matmul_rel_err) on this SM.
        type: float
      attention_atol:
        description: Replaces O(tolerances.attention_atol) on this SM.
        type: float
      attention_rel_err:
        description: Replaces O(tolerances.attention_rel_err) on this SM.
        type: float
      min_cosine:
        description: Replaces O(tolerances.min_cosine) on this SM.
        type: float
      prefill_backends:
        description:
          - flashinfer single-prefill backends the build check builds for this SM; C(fa3) exists for SM 9.x only.
          - Default C([fa2, fa3]) on SM 9.x, C([fa2]) elsewhere (what flashinfer 0.6 picks).
        type: list
        elements: str
        choices: [fa2, fa3]
      expected_probes:
        description:
          - flashinfer capability probes (C(capability_probes)) that must read true on a GPU of this SM, for example
            C(is_sm90a_supported); empty means the probes are reported only.
        type: list
        elements: str
        default: []
  matmul_size:
    description: Edge of the square bf16 product (also timed, giving TFLOP/s).
    type: int
    default: 8192
  allreduce_size_mb:
    description: Size of the all-reduced buffer per GPU in MiB.
    type: int
    default: 256
  allreduce_sizes:
    description:
      - Sizes in bytes the all-reduce sweeps first, ascending, each summed and timed (nccl-tests' bus bandwidth,
        algbw * 2(n-1)/n, per size in C(allreduce.sweep)). The default, 1 KiB to 64 MiB by fourfold steps with 512
        KiB, holds the sizes at which NCCL 2.26.2 crashes on RTX PRO 6000 (512 KiB and more, NCCL issue 2418); the first
        size that breaks is named. Empty skips the sweep.
    type: list
    elements: int
    default: [1024, 4096, 16384, 65536, 262144, 524288, 1048576, 4194304, 16777216, 67108864]
  allreduce_baseline:
    description:
      - This host's sweep from before the upgrade (C(allreduce.sweep) of that run, or a mapping bytes -> bus
        bandwidth in GB/s), or the path of a JSON file on the host that holds one (as O(allreduce_record_path) wrote
        it; a missing file compares nothing, and says so in C(allreduce.baseline_note)); with
        O(allreduce_min_busbw_ratio), each size from 1 MiB on must reach that ratio of it.
    type: raw
  allreduce_record_path:
    description: Write this run's sweep (C(allreduce.sweep), world size, time) as JSON at this path on the host, for a
      later run's O(allreduce_baseline) (role postcheck's entry point baseline, before the upgrade); not in check mode.
    type: path
  allreduce_min_busbw_ratio:
    description: Least bus bandwidth, as a share of O(allreduce_baseline), per size (profile
      C(postcheck.smoke.allreduce_min_busbw_ratio)); unset, the sweep is reported, not compared.
    type: float
  dcgm_level:
    description:
      - Run C(dcgmi diag -r <level> -j) after the kernels where C(dcgmi) is installed (0 = not run; the canary batch
        deeper, see C(_dcgm.level_for)); a failed test fails the smoke test naming the GPU and test, a warning is a
        note, a run that reports nothing fails. Without C(dcgmi) it is reported skipped.
    type: int
    default: 0
  dcgm_timeout_s:
    description: Time limit of the DCGM diagnostic in seconds (level 2 takes about 2 min, level 3 about 15 min).
    type: int
    default: 1200
  env:
    description:
      - Variables set over the serving environment (see the description), for example a fault injection in a test.
        Leave it empty to test exactly what the server runs with.
    type: dict
    default: {}
  env_file:
    description:
      - The serving unit's environment file (C(/etc/gpufleet/<unit>.env)), read when no server process runs or its
        environment cannot be read.
    type: path
  server_unit:
    description:
      - The serving unit; its C(MainPID) (C(systemctl show)) gives the server's environment and names its processes
        in the memory figures.
    type: str
  server_main_pid:
    description: Main pid of the server on a host without systemd; wins over O(server_unit). C(0) says none runs.
    type: int
  server_cgroup:
    description: The serving unit's cgroup (read from O(server_unit) when not given); its members are the server's.
    type: str
  server_pids:
    description: Further pids of the server.
    type: list
    elements: int
  gpu_required:
    description: When false and the venv or torch sees no GPU, the result is C(status=skipped) ("skipped, no GPU").
    type: bool
    default: true
  device:
    description:
      - C(cuda) tests the GPUs. C(cpu) runs the same orchestration on the CPU (bf16 matmul, and the multi-process
        all-reduce with the gloo backend over O(cpu_ranks) processes) for testing without a GPU; flashinfer checks
        are skipped there.
    type: str
    choices: [cuda, cpu]
    default: cuda
  cpu_ranks:
    description: Number of worker processes standing in for GPUs when O(device=cpu).
    type: int
    default: 2
  fail_on_failure:
    description: Fail the task when a check fails; false returns the results with C(passed=false) (the postcheck role
      writes them before it gates).
    type: bool
    default: true
attributes:
  check_mode:
    support: partial
    description: Can run in check mode and report what it would do without running anything on the GPUs.
    details: In check mode the module runs no kernel and compiles nothing (they would compete with the serving
      process) and returns C(status=skipped).
  diff_mode:
    support: none
    description: The smoke test changes nothing on the host, so there is no diff.
"""

EXAMPLES = r"""
- name: Run the kernel smoke test in the serving venv against the profile
  gpufleet.upgrade.gpu_smoke_test:
    venv: /opt/gpufleet/serving/current
    expected_cuda: "{{ gpufleet_stack.cuda.version }}"
    required_packages: "{{ gpufleet_stack.postcheck.smoke.required_packages }}"
    timeout_s: "{{ gpufleet_stack.postcheck.smoke.timeout_s }}"
    target_sms: "{{ gpufleet_stack.gpu.target_sms }}"
    per_sm: "{{ gpufleet_stack.postcheck.smoke.per_sm }}"
    server_unit: sglang
    env_file: /etc/gpufleet/sglang.env
    fail_on_failure: false
  register: __postcheck_smoke

- name: Prove that the CUDA 13.0 toolkit and flashinfer build for Hopper and Blackwell, on whatever GPU is here
  gpufleet.upgrade.gpu_smoke_test:
    checks: [torch_cuda_version, arch_in_list, build_targets]
    expected_cuda: "13.0"
    target_sms: ["9.0", "12.0"]
    env:
      CUDA_HOME: /usr/local/cuda-13.0

- name: Exercise the multi-process all-reduce on the CPU (gloo)
  gpufleet.upgrade.gpu_smoke_test:
    python: /opt/scratch/bin/python
    device: cpu
    cpu_ranks: 2
    checks: [bf16_matmul, nccl_allreduce]
"""

RETURN = r"""
status:
  description: C(passed), C(failed) or C(skipped).
  returned: always
  type: str
passed:
  description: Whether no check failed; null when skipped.
  returned: always
  type: bool
skipped_reason:
  description: Why nothing ran.
  returned: when status is skipped
  type: str
failures:
  description: One message per failed check, naming the GPU (index and UUID), the check, the numbers seen and
    the tolerance.
  returned: always
  type: list
  elements: str
python:
  description: Interpreter that ran the checks.
  returned: always
  type: str
torch:
  description: torch version, torch.version.cuda, arch list and the devices torch sees.
  returned: when torch could be imported
  type: dict
host_checks:
  description: Host-wide checks (torch_cuda_version, flashinfer_versions, peer_access, symmetric_memory,
    build_targets), each with C(status) (passed, failed, skipped, info), C(message) and the raw measurements.
  returned: always
  type: dict
  contains:
    build_targets:
      description:
        - C(targets) (SM -> C(status), C(message), C(built) (nvcc variants, flashinfer modules and their arch),
          C(inspected) (what cuobjdump found SASS in), C(ran) (kernels run on this host's GPU), C(run_on),
          C(not_run_reason), C(raw)); C(cannot_build) (the SMs the stack cannot build for); C(run_on_host) (the
          targets that have a GPU here).
      returned: when the check ran
      type: dict
gpus:
  description:
    - Per GPU C(index), C(uuid), C(name), C(sm), C(wall_s), C(checks) (name -> status (C(passed), C(failed),
      C(out_of_memory), C(skipped), C(info), C(error)), message, raw measurements with C(seconds) and C(memory)) and
      C(memory) (C(checks) - per check C(free_before_mib), C(total_mib), C(peak_allocated_mib), C(peak_reserved_mib),
      C(free_after_mib), C(device_used_after_mib), C(process_nvml_mib) where the venv has nvidia-ml-py -, the largest
      (C(peak_check), C(peak_reserved_mib), C(peak_allocated_mib), C(peak_device_used_mib)) and C(before_run) (what
      the GPU's processes held before the smoke test, the serving unit's apart)).
  returned: always
  type: list
  elements: dict
allreduce:
  description: The all-reduce across all GPUs (world size, expected sum, per-rank results, bus bandwidth), with
    C(sweep) (per size C(bytes), C(size), C(seconds_per_op) of the slowest rank, C(algbw_gbps), C(busbw_gbps)) and
    C(busbw_compared) (per size from 1 MiB, the figure before and the ratio).
  returned: when run
  type: dict
dcgm:
  description: The DCGM diagnostic - C(level), C(status) (C(passed), C(failed), C(skipped)), C(reasons), C(notes),
    C(counts) per status, C(version), C(rc).
  returned: when O(dcgm_level) > 0
  type: dict
wall_s:
  description: Wall time of the whole smoke test in seconds.
  returned: always
  type: float
env:
  description: Variables the module set in the workers' environment (multicast off, device order, extras).
  returned: when the workers ran
  type: dict
serving_env:
  description:
    - Where the workers' environment came from - C(source) (C(kind) C(process) with its C(pid), C(file) with its
      C(path), or C(module); C(not_used) says why a better source was not used), C(changed) (the variables the module
      set to other values than the serving environment's, with their values), C(from_caller) (names given in O(env)),
      C(names) (every variable name; values are not returned, they may hold secrets) and C(presence_flags) (variables
      that act by their mere presence, with the reason).
  returned: when the workers ran
  type: dict
server:
  description: The server the module was told about (see nvml_info's RV(server)).
  returned: when a server option was given
  type: dict
memory:
  description:
    - The smoke test's largest footprint - C(peak_reserved_mib) (torch's reserved memory of the largest check on any
      GPU), C(peak) (which GPU and check), C(allreduce_peak_reserved_mib) and C(allreduce_peak_device_used_mib) (the
      all-reduce ranks, NCCL's buffers included in the device figure), C(nvml_error) (why what the GPUs' processes hold
      could not be read).
  returned: when the workers ran
  type: dict
  sample: {peak_reserved_mib: 1152, peak: GPU 0 bf16_matmul, allreduce_peak_reserved_mib: 512, nvml_error: null}
out_of_memory:
  description: One message per check that ran out of GPU memory (also in RV(failures)).
  returned: when the workers ran
  type: list
  elements: str
"""

import inspect
import os
import socket
import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _dcgm, _nvml, _server, _smoke, _smoke_worker

ARGUMENT_SPEC = {
    "venv": {"type": "path", "default": "/opt/gpufleet/serving/current"},
    "python": {"type": "path"},
    "expected_cuda": {"type": "str"},
    "flashinfer_version": {"type": "str"},
    "required_packages": {"type": "list", "elements": "str", "default": []},
    "timeout_s": {"type": "int", "default": 300},
    "checks": {"type": "list", "elements": "str", "choices": list(_smoke.ALL_CHECKS)},
    "build_check": {"type": "bool", "default": False},
    "gpus": {"type": "list", "elements": "int"},
    "target_sms": {"type": "list", "elements": "str", "default": []},
    "build_timeout_s": {"type": "int", "default": 900},
    "per_sm": {
        "type": "list",
        "elements": "dict",
        "default": [],
        "options": {
            "sm": {"type": "str", "required": True},
            **{key: {"type": "float"} for key in _smoke.TOLERANCE_KEYS},
            "prefill_backends": {"type": "list", "elements": "str", "choices": ["fa2", "fa3"]},
            "expected_probes": {"type": "list", "elements": "str", "default": []},
        },
    },
    "tolerances": {
        "type": "dict",
        "default": {},
        "options": {
            "matmul_rel_err": {"type": "float", "default": _smoke.DEFAULT_TOLERANCES["matmul_rel_err"]},
            "attention_atol": {"type": "float", "default": _smoke.DEFAULT_TOLERANCES["attention_atol"]},
            "attention_rel_err": {"type": "float", "default": _smoke.DEFAULT_TOLERANCES["attention_rel_err"]},
            "min_cosine": {"type": "float", "default": _smoke.DEFAULT_TOLERANCES["min_cosine"]},
        },
    },
    "matmul_size": {"type": "int", "default": 8192},
    "allreduce_size_mb": {"type": "int", "default": 256},
    "allreduce_sizes": {"type": "list", "elements": "int", "default": list(_smoke.ALLREDUCE_SIZES)},
    "allreduce_baseline": {"type": "raw"},
    "allreduce_record_path": {"type": "path"},
    "allreduce_min_busbw_ratio": {"type": "float"},
    "dcgm_level": {"type": "int", "default": 0},
    "dcgm_timeout_s": {"type": "int", "default": 1200},
    "env": {"type": "dict", "default": {}},
    "env_file": {"type": "path"},
    **_server.SERVER_SPEC,
    "gpu_required": {"type": "bool", "default": True},
    "device": {"type": "str", "choices": ["cuda", "cpu"], "default": "cuda"},
    "cpu_ranks": {"type": "int", "default": 2},
    "fail_on_failure": {"type": "bool", "default": True},
}


def build_module():
    return AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)


def skipped(reason, **extra):
    return dict(
        changed=False,
        status="skipped",
        passed=None,
        skipped_reason=reason,
        failures=[],
        host_checks={},
        gpus=[],
        **extra,
    )


def write_worker(module) -> str:
    path = os.path.join(module.tmpdir, "gpufleet_smoke_worker.py")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(inspect.getsource(_smoke_worker))
    return path


class SmokeTest:
    def __init__(self, params, worker, python, env, held=None):
        self.p = params
        self.python = python
        self.env = env
        self.held = held or {}
        self.base = [python, worker]
        self.wanted = set(params["checks"] or (c for c in _smoke.ALL_CHECKS if c != _smoke.BUILD_CHECK))
        if params["build_check"]:
            self.wanted.add(_smoke.BUILD_CHECK)
        self.judge_params = {
            "required_packages": params["required_packages"],
            "python": python,
            "tolerances": params["tolerances"],
        }

    def worker_argv(self, mode, *extra):
        return [*self.base, mode, "--device", self.p["device"], *extra]

    def run_host(self):
        checks = ["torch_env"] + [c for c in _smoke.HOST_CHECKS[1:] if c in self.wanted]
        return _smoke.run_stream(self.worker_argv("host"), self.env, checks, self.p["timeout_s"])

    def run_gpu(self, device):
        checks = [c for c in _smoke.GPU_CHECKS if c in self.wanted]
        if self.p["device"] == "cpu":
            checks = [c for c in checks if c not in _smoke.FLASHINFER_CHECKS]
        argv = self.worker_argv("gpu", "--index", str(device["index"]), "--matmul-size", str(self.p["matmul_size"]))
        began = time.monotonic()
        raw = _smoke.run_stream(argv, self.env, checks, self.p["timeout_s"]) if checks else {}
        if self.p["device"] == "cpu":
            for name in _smoke.FLASHINFER_CHECKS & self.wanted:
                raw[name] = {"status": "skipped", "reason": "cpu run: flashinfer kernels need a GPU"}
        return raw, round(time.monotonic() - began, 2)

    def run_build(self, plan, workdir):
        """One worker per target SM, one after the other: each compiles with all the host's cores."""
        results = {}
        for target in plan:
            workspace = os.path.join(workdir, target["check"])
            argv = self.worker_argv(
                "build",
                "--target",
                target["sm"],
                "--variants",
                ",".join(target["variants"]),
                "--prefill-backends",
                ",".join(target["prefill_backends"]),
                "--workdir",
                workspace,
                "--run-index",
                str(-1 if target["run_index"] is None else target["run_index"]),
            )
            env = _smoke.target_env(self.env, target, workspace)
            results.update(_smoke.run_stream(argv, env, [target["check"]], self.p["build_timeout_s"]))
        return results

    def gpu_params(self, device):
        """Judging parameters for one GPU: the profile's per-SM tolerances win for its SM; what its processes held."""
        sm = _smoke.sm_key(device.get("sm"))
        tolerances = _smoke.tolerances_for(self.p["tolerances"], self.p["per_sm"], sm)
        return dict(self.judge_params, tolerances=tolerances, held=self.held.get(device.get("uuid")))

    def run_allreduce(self, world_size):
        backend = "gloo" if self.p["device"] == "cpu" else "nccl"
        argv = self.worker_argv("allreduce", "--size-mb", str(self.p["allreduce_size_mb"]))
        argv += ["--sizes", ",".join(str(s) for s in sorted(self.p["allreduce_sizes"] or ()))]
        ranks = _smoke.run_allreduce(argv, self.env, world_size, self.p["timeout_s"], backend)
        baseline, note = _smoke.read_baseline(self.p["allreduce_baseline"])
        out = _smoke.judge_allreduce(ranks, world_size, backend, baseline, self.p["allreduce_min_busbw_ratio"])
        return dict(out, baseline_note=note) if note else out


def run_dcgm(module, level, host):
    """dcgmi diag at ``level`` where DCGM is installed; its JSON judged by _dcgm."""
    dcgmi = module.get_bin_path("dcgmi")
    if not dcgmi:
        return {"level": level, "status": "skipped", "reasons": [], "notes": [f"{host}: dcgmi is not installed"]}
    argv = [dcgmi, *_dcgm.command(level)[1:]]
    limit = module.get_bin_path("timeout")  # coreutils: run_command has no time limit of its own
    argv = [limit, str(module.params["dcgm_timeout_s"]), *argv] if limit else argv
    rc, out, err = module.run_command(argv)
    verdict = _dcgm.judge(_dcgm.parse(out or err), host, level)
    return dict(verdict, level=level, rc=rc, status="passed" if verdict["passed"] else "failed")


def host_outcomes(test, host_raw, devices):
    p = test.p
    torch_env = host_raw.get("torch_env", {})
    out = {}
    if "torch_cuda_version" in test.wanted and p["device"] == "cuda":
        out["torch_cuda_version"] = _smoke.judge_cuda_version(torch_env, p["expected_cuda"])
    if "flashinfer_versions" in test.wanted:
        out["flashinfer_versions"] = _smoke.judge_versions(
            host_raw.get("flashinfer_versions", {}), p["flashinfer_version"], p["expected_cuda"], test.judge_params
        )
    if "peer_access" in test.wanted:
        out["peer_access"] = _smoke.judge_peer_access(host_raw.get("peer_access", {}), len(devices))
    if "symmetric_memory" in test.wanted:
        raw = host_raw.get("symmetric_memory", {})
        out["symmetric_memory"] = _smoke.outcome("info", "", raw=raw)
    return out


def judge_gpu_check(test, name, raw, device):
    params = test.gpu_params(device)
    if name == "capability_probes" and raw.get("status") not in ("timeout", "not_run", "error", "missing_package"):
        entry = _smoke.per_sm_settings(test.p["per_sm"], _smoke.sm_key(device.get("sm")))
        return _smoke.judge_probes(raw, device, entry.get("expected_probes"))
    return _smoke.judge_kernel(name, raw, device, params)


def build_outcome(module, test, devices, torch_env):
    if test.p["device"] != "cuda":
        return _smoke.outcome("skipped", "cpu run: the build check compiles for GPUs and runs on one")
    try:
        plan = _smoke.build_plan(test.p["target_sms"], devices, test.p["per_sm"])
    except ValueError as exc:
        module.fail_json(msg=f"{socket.gethostname()}: target_sms: {exc}; fix: give SMs as major.minor, e.g. 12.0")
    results = test.run_build(plan, os.path.join(module.tmpdir, "gpufleet-build"))
    params = dict(test.judge_params)
    arch_list = torch_env.get("arch_list", [])
    return _smoke.judge_build(results, plan, arch_list, test.p["expected_cuda"], params, test.p["per_sm"])


def cpu_devices(count):
    return [{"index": i, "uuid": f"cpu-rank-{i}", "name": "cpu", "sm": None} for i in range(count)]


def serving_environment(module, server):
    """The workers' environment (the serving unit's, O(env) over it) and the report of where it came from."""
    p = module.params
    serving_env, source = _server.serving_environment(server["main_pid"], p["env_file"], os.environ)
    env = _smoke.build_env(serving_env, p["env"])
    report = _smoke.env_report(serving_env, env, p["env"], source)
    report["presence_flags"] = _server.presence_flags(env)
    return env, report


def run(module, nvml_loader=_nvml.load_pynvml):
    p = module.params
    host = socket.gethostname()
    python = p["python"] or os.path.join(p["venv"], "bin", "python")
    if module.check_mode:
        return skipped("check mode: the smoke test runs GPU kernels and is not run under --check", python=python)
    if not os.access(python, os.X_OK):
        if not p["gpu_required"]:
            return skipped(f"skipped: no GPU required and {python} does not exist", python=python)
        module.fail_json(
            msg=f"{host}: {python} does not exist or is not executable; build the serving venv first or point"
            " venv/python at an existing one",
            python=python,
        )
    server = _server.resolve(p, module.get_bin_path, module.run_command)
    env, env_report = serving_environment(module, server)
    held, held_error = {}, "cpu run"
    if p["device"] == "cuda":
        held, held_error = _nvml.read_memory_holders(nvml_loader, server["pids"])
    test = SmokeTest(p, write_worker(module), python, env, held)
    test.judge_params["env_flags"] = [_server.presence_flag_message(f) for f in env_report["presence_flags"]]
    began = time.monotonic()
    host_raw = test.run_host()
    torch_env = host_raw.get("torch_env", {})
    if torch_env.get("status") != "measured":
        return torch_missing(module, test, host_raw, host, began)
    devices = torch_env.get("devices", []) if p["device"] == "cuda" else cpu_devices(p["cpu_ranks"])
    if not devices:
        if not p["gpu_required"]:
            return skipped("skipped: no GPU (torch sees no CUDA device)", python=python, torch=torch_env)
        module.fail_json(
            msg=f"{host}: torch {torch_env.get('torch_version')} under {python} sees no CUDA device"
            f" (cuda_available={torch_env.get('cuda_available')}); check the driver (nvidia-smi) and that torch is a"
            " CUDA build",
            torch=torch_env,
        )
    selected = [d for d in devices if p["gpus"] is None or d["index"] in p["gpus"]]
    gpu_raw = _smoke.run_parallel({d["index"]: (lambda d=d: test.run_gpu(d)) for d in selected})
    gpus = []
    for device in selected:
        raw, wall = gpu_raw[device["index"]]
        checks = {name: judge_gpu_check(test, name, r, device) for name, r in raw.items()}
        if "arch_in_list" in test.wanted and p["device"] == "cuda":
            checks["arch_in_list"] = _smoke.judge_arch(device, torch_env.get("arch_list", []))
        memory = dict(_smoke.check_memory(checks), before_run=held.get(device.get("uuid")))
        gpus.append(dict(device, wall_s=wall, checks=checks, memory=memory))
    allreduce = test.run_allreduce(len(devices)) if "nccl_allreduce" in test.wanted else None
    host_checks = host_outcomes(test, host_raw, devices)
    if _smoke.BUILD_CHECK in test.wanted:
        host_checks[_smoke.BUILD_CHECK] = build_outcome(module, test, devices, torch_env)
    summary = _smoke.summarize(host_checks, gpus, allreduce)
    dcgm = run_dcgm(module, p["dcgm_level"], host) if p["dcgm_level"] > 0 else None
    if dcgm and dcgm["reasons"]:
        summary = {"passed": False, "failures": summary["failures"] + dcgm["reasons"]}
    result = dict(
        changed=False,
        status="passed" if summary["passed"] else "failed",
        python=python,
        torch=torch_env,
        host_checks=host_checks,
        gpus=gpus,
        wall_s=round(time.monotonic() - began, 2),
        env={k: env[k] for k in sorted(set(_smoke.MULTICAST_OFF) | {"CUDA_DEVICE_ORDER"} | set(p["env"]))},
        serving_env=env_report,
        memory=dict(_smoke.memory_summary(gpus, allreduce), nvml_error=held_error),
        out_of_memory=_smoke.out_of_memory_messages(host_checks, gpus, allreduce),
        **summary,
    )
    if server["pids"] is not None or server["error"]:
        result["server"] = _server.server_fact(server)
    if allreduce is not None:
        result["allreduce"] = allreduce
        if p["allreduce_record_path"] and not module.check_mode and allreduce["status"] == "passed":
            _smoke.write_sweep(p["allreduce_record_path"], allreduce)
    if dcgm is not None:
        result["dcgm"] = dcgm
    return result


def torch_missing(module, test, host_raw, host, began):
    raw = host_raw.get("torch_env", {})
    if raw.get("status") == "missing_package":
        status, why = _smoke.resolve_missing("torch", test.p["required_packages"], test.python)
        if status == "skipped" or not test.p["gpu_required"]:
            return skipped(f"skipped: {why}", python=test.python, wall_s=round(time.monotonic() - began, 2))
        failures = [f"{host}: {why}"]
    else:
        failures = [f"{host}: the worker could not read torch's facts under {test.python}: {raw.get('error')}"]
    result = dict(
        changed=False,
        status="failed",
        passed=False,
        failures=failures,
        python=test.python,
        host_checks={},
        gpus=[],
        wall_s=round(time.monotonic() - began, 2),
    )
    return result


def main():
    module = build_module()
    result = run(module)
    if module.params["fail_on_failure"] and result.get("passed") is False:
        module.fail_json(
            msg="; ".join(result["failures"]),
            **{k: v for k, v in result.items() if k != "failures"},
            failures=result["failures"],
        )
    module.exit_json(**result)


if __name__ == "__main__":
    main()
