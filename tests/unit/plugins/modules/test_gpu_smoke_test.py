# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""gpu_smoke_test end to end with real worker processes.

Without torch (this venv's Python) the module's missing-package paths run. With GPUFLEET_TORCH_PYTHON pointing at
an interpreter that has torch (CPU is enough), the CPU orchestration runs too: bf16 matmul per rank and the
multi-process all-reduce over gloo, and a corrupted kernel is caught.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from ansible.module_utils.testing import patch_module_args
from module_harness import Exit, Fail

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _smoke, _smoke_worker
from ansible_collections.gpufleet.upgrade.plugins.modules import gpu_smoke_test

TORCH_PYTHON = os.environ.get("GPUFLEET_TORCH_PYTHON")
needs_torch_python = pytest.mark.skipif(not TORCH_PYTHON, reason="set GPUFLEET_TORCH_PYTHON to a Python with torch")


def run(args):
    with patch_module_args(args), pytest.raises((Exit, Fail)) as out:
        gpu_smoke_test.main()
    return out.type is Exit, out.value.args[0]


def no_torch_here():
    try:
        import torch  # noqa: F401
    except ImportError:
        return True
    return False  # pragma: no cover


def test_check_mode_runs_no_kernel():
    ok, result = run({"python": sys.executable, "_ansible_check_mode": True})
    assert ok and result["status"] == "skipped" and "check mode" in result["skipped_reason"]
    assert result["changed"] is False


def test_missing_venv_fails_clearly(tmp_path):
    ok, result = run({"venv": str(tmp_path / "nope")})
    assert not ok
    assert f"{tmp_path}/nope/bin/python does not exist" in result["msg"] and "build the serving venv" in result["msg"]


def test_missing_venv_without_gpu_required_is_skipped(tmp_path):
    ok, result = run({"venv": str(tmp_path / "nope"), "gpu_required": False})
    assert ok and result["status"] == "skipped"


@pytest.mark.skipif(not no_torch_here(), reason="this interpreter has torch")
def test_venv_without_torch_fails_when_the_profile_requires_torch():
    ok, result = run({"python": sys.executable, "required_packages": ["torch", "flashinfer"]})
    assert not ok
    assert "torch is not importable by" in result["msg"] and "postcheck.smoke.required_packages" in result["msg"]
    ok, result = run({"python": sys.executable, "required_packages": ["torch"], "fail_on_failure": False})
    assert ok and result["status"] == "failed" and result["passed"] is False


@pytest.mark.skipif(not no_torch_here(), reason="this interpreter has torch")
def test_venv_without_torch_is_skipped_when_torch_is_not_required():
    ok, result = run({"python": sys.executable, "required_packages": []})
    assert ok and result["status"] == "skipped"
    assert "torch is not installed in the venv" in result["skipped_reason"]


def test_worker_shipped_is_the_worker_in_the_collection(tmp_path):
    class Module:
        tmpdir = str(tmp_path)

    path = gpu_smoke_test.write_worker(Module())
    with open(_smoke_worker.__file__, encoding="utf-8") as handle:
        assert open(path, encoding="utf-8").read() == handle.read()


def test_argument_spec_lists_every_check():
    assert gpu_smoke_test.ARGUMENT_SPEC["checks"]["choices"] == list(_smoke.ALL_CHECKS)
    assert set(_smoke.GPU_CHECKS) == set(_smoke_worker.GPU_CHECKS)
    assert set(_smoke.HOST_CHECKS) == set(_smoke_worker.HOST_CHECKS)


@needs_torch_python
def test_cpu_torch_without_cuda_fails_when_a_gpu_is_required():
    ok, result = run({"python": TORCH_PYTHON, "required_packages": ["torch"]})
    assert not ok and "sees no CUDA device" in result["msg"]
    ok, result = run({"python": TORCH_PYTHON, "gpu_required": False})
    assert ok and result["skipped_reason"] == "skipped: no GPU (torch sees no CUDA device)"


CPU_ARGS = {
    "device": "cpu",
    "cpu_ranks": 2,
    "matmul_size": 256,
    "allreduce_size_mb": 4,
    "required_packages": ["torch"],
    "timeout_s": 120,
}


@needs_torch_python
def test_cpu_orchestration_two_ranks_with_gloo():
    ok, result = run(dict(CPU_ARGS, python=TORCH_PYTHON))
    assert ok and result["status"] == "passed", result["failures"]
    assert [g["checks"]["bf16_matmul"]["status"] for g in result["gpus"]] == ["passed", "passed"]
    assert result["gpus"][0]["checks"]["flashinfer_single_decode"]["status"] == "skipped"
    allreduce = result["allreduce"]
    assert allreduce["status"] == "passed" and allreduce["backend"] == "gloo" and allreduce["expected"] == 3
    assert {r["rank"] for r in allreduce["ranks"]} == {0, 1}
    assert result["env"]["NCCL_NVLS_ENABLE"] == "0"


@needs_torch_python
def test_cpu_orchestration_catches_a_corrupted_kernel():
    args = dict(
        CPU_ARGS, python=TORCH_PYTHON, checks=["bf16_matmul"], env={"GPUFLEET_SMOKE_INJECT_FAULT": "bf16_matmul"}
    )
    ok, result = run(args)
    assert not ok
    assert "GPU 0 (cpu-rank-0): bf16_matmul: relative error" in result["msg"]
    assert len(result["failures"]) == 2  # both ranks


# ------------------------------------------------------------------ build_targets: the module's plumbing

DATA = Path(__file__).resolve().parents[3] / "data" / "device"
RECORDED_BUILD = json.loads((DATA / "h200-build-sm90-sm120.json").read_text())["result"]
CU130_PER_SM = [  # stacks/cu130.yml postcheck.smoke.per_sm
    {"sm": "9.0", "prefill_backends": ["fa2", "fa3"], "expected_probes": ["is_sm90a_supported"]},
    {"sm": "12.0", "prefill_backends": ["fa2"], "expected_probes": ["is_sm120a_supported"]},
]


def build_test(args):
    with patch_module_args(dict({"python": sys.executable, "checks": ["build_targets"]}, **args)):
        module = gpu_smoke_test.build_module()
    env = _smoke.build_env({}, module.params["env"])
    return module, gpu_smoke_test.SmokeTest(module.params, "/w.py", sys.executable, env)


def test_build_targets_runs_one_worker_per_target_with_its_arch(monkeypatch):
    module, test = build_test(
        {"target_sms": ["12.0", "9.0"], "per_sm": CU130_PER_SM, "build_timeout_s": 123, "env": {"CUDA_HOME": "/c"}}
    )
    calls = []
    recorded = RECORDED_BUILD["host_checks"]["build_targets"]["targets"]

    def run_stream(argv, env, checks, timeout_s):
        calls.append((argv, env, checks, timeout_s))
        sm = argv[argv.index("--target") + 1]
        return {checks[0]: recorded[sm]["raw"]}

    monkeypatch.setattr(_smoke, "run_stream", run_stream)
    torch_env = RECORDED_BUILD["torch"]
    verdict = gpu_smoke_test.build_outcome(module, test, torch_env["devices"], torch_env)
    assert verdict["status"] == "passed", verdict["message"]
    assert [c[2] for c in calls] == [["build_sm_90"], ["build_sm_120"]] and {c[3] for c in calls} == {123}
    sm90, sm120 = (c[0] for c in calls)
    assert sm90[sm90.index("--variants") + 1] == "sm_90,sm_90a" and sm90[sm90.index("--run-index") + 1] == "0"
    assert sm90[sm90.index("--prefill-backends") + 1] == "fa2,fa3"
    assert sm120[sm120.index("--run-index") + 1] == "-1" and sm120[sm120.index("--prefill-backends") + 1] == "fa2"
    env120 = calls[1][1]
    assert env120["FLASHINFER_CUDA_ARCH_LIST"] == "12.0a" and env120["CUDA_HOME"] == "/c"
    assert env120["FLASHINFER_WORKSPACE_BASE"].startswith(module.tmpdir)  # removed with the module's temp folder
    assert env120["NCCL_NVLS_ENABLE"] == "0"
    assert "built and inspected, not run (no SM 12.0 GPU on this host)" in verdict["targets"]["12.0"]["message"]


def test_build_targets_refuses_a_target_that_is_no_sm():
    module, test = build_test({"target_sms": ["sm120-ish"]})
    with pytest.raises(Fail) as err:
        gpu_smoke_test.build_outcome(module, test, [], {})
    assert "target_sms: target SM 'sm120-ish' is not an SM" in err.value.args[0]["msg"]
    assert "fix: give SMs as major.minor, e.g. 12.0" in err.value.args[0]["msg"]


def test_build_targets_is_skipped_on_a_cpu_run():
    module, test = build_test({"device": "cpu", "target_sms": ["12.0"]})
    assert gpu_smoke_test.build_outcome(module, test, [], {})["status"] == "skipped"


def test_per_sm_rejects_an_unknown_prefill_backend():
    with patch_module_args({"per_sm": [{"sm": "12.0", "prefill_backends": ["fa4"]}]}), pytest.raises(Fail):
        gpu_smoke_test.build_module()


def test_the_build_check_runs_only_when_named_or_asked_for():
    def wanted(args):
        with patch_module_args(dict({"python": sys.executable}, **args)):
            module = gpu_smoke_test.build_module()
        return gpu_smoke_test.SmokeTest(module.params, "/w.py", sys.executable, {}).wanted

    default = wanted({})
    assert _smoke.BUILD_CHECK not in default and "bf16_matmul" in default and "nccl_allreduce" in default
    assert wanted({"build_check": True}) == default | {_smoke.BUILD_CHECK}
    assert wanted({"checks": ["arch_in_list"], "build_check": True}) == {"arch_in_list", _smoke.BUILD_CHECK}
    assert wanted({"checks": ["build_targets"]}) == {_smoke.BUILD_CHECK}


# ------------------------------------------------------- beside a resident server: its environment and its memory

# torch's view of the recorded H200: the module pairs it with NVML's by UUID (indices differ under
# CUDA_VISIBLE_DEVICES)
H200_UUID = next(
    c["result"]
    for c in json.loads((DATA / "h200-nvml-record.json").read_text())["calls"]
    if c["fn"] == "nvmlDeviceGetUUID"
)
H200 = {"index": 0, "uuid": H200_UUID, "name": "NVIDIA H200", "sm": "sm_90"}
TORCH_ENV = {"status": "measured", "torch_version": "2.11.0+cu130", "torch_cuda": "13.0", "arch_list": ["sm_90"]}
# The kernels' raw results of the recorded warm H200 run: what a passing check reports.
RECORDED_CHECKS = json.loads((DATA / "h200-postcheck-warm.json").read_text())["smoke"]["gpus"][0]["checks"]
MATMUL, DECODE = (RECORDED_CHECKS[c]["raw"] for c in ("bf16_matmul", "flashinfer_single_decode"))


def beside_a_server(monkeypatch, tmp_path, gpu_raw):
    """The module against a stand-in GPU worker, with a real process standing in for the server (its environment
    is read from /proc) and NVML's answers replayed with the server's process holding 120 GiB."""
    import subprocess

    nvml_fake = fake_nvml()
    server_env = {"PATH": "/usr/bin:/bin", "CUDA_HOME": "/usr/local/cuda-13.0", "SERVING_ONLY": "1"}
    code = "import time; print('up', flush=True); time.sleep(60)"
    server = subprocess.Popen([sys.executable, "-c", code], env=server_env, stdout=subprocess.PIPE, text=True)
    assert server.stdout.readline() == "up\n"  # its environ is the exec's once it runs
    monkeypatch.setenv("MODULE_ONLY", "1")
    calls = []

    def run_stream(argv, env, checks, timeout_s):
        calls.append((argv, env, checks))
        if "host" in argv:
            return {"torch_env": dict(TORCH_ENV, devices=[H200])}
        return {c: gpu_raw[c] for c in checks}

    monkeypatch.setattr(_smoke, "run_stream", run_stream)
    procs = [{"pid": server.pid, "usedGpuMemory": 120 * 2**30}]
    nvml = nvml_fake.FakeNVML(
        nvml_fake.load(), {"nvmlDeviceGetComputeRunningProcesses": procs, "nvmlSystemGetProcessName": "python3"}
    )
    args = {
        "python": sys.executable,
        "checks": ["bf16_matmul", "flashinfer_single_decode"],
        "server_main_pid": server.pid,
        "env_file": str(tmp_path / "absent.env"),
        "required_packages": ["torch"],
    }
    try:
        with patch_module_args(args):
            module = gpu_smoke_test.build_module()
        result = gpu_smoke_test.run(module, nvml_loader=lambda: nvml)
    finally:
        server.kill()
        server.wait()
    return result, calls, server.pid


def fake_nvml():
    import importlib.util

    spec = importlib.util.spec_from_file_location("nvml_fake", DATA / "nvml_fake.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_beside_a_server_the_workers_run_with_its_environment_and_report_memory(monkeypatch, tmp_path):
    memory = {"free_before_mib": 20000, "total_mib": 143771, "peak_allocated_mib": 1280, "peak_reserved_mib": 1536}
    gpu_raw = {
        "bf16_matmul": dict(MATMUL, memory=memory),
        "flashinfer_single_decode": dict(DECODE, memory=dict(memory, peak_reserved_mib=40)),
    }
    result, calls, pid = beside_a_server(monkeypatch, tmp_path, gpu_raw)
    assert result["status"] == "passed", result["failures"]
    env = calls[0][1]
    assert env["SERVING_ONLY"] == "1" and env["CUDA_HOME"] == "/usr/local/cuda-13.0" and "MODULE_ONLY" not in env
    assert env["NCCL_NVLS_ENABLE"] == "0" and env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert result["serving_env"]["source"] == {"kind": "process", "pid": pid, "path": f"/proc/{pid}/environ"}
    assert result["serving_env"]["presence_flags"] == []
    assert result["server"]["main_pid"] == pid and pid in result["server"]["pids"]
    gpu = result["gpus"][0]
    assert gpu["memory"]["peak_check"] == "bf16_matmul" and gpu["memory"]["peak_reserved_mib"] == 1536
    assert gpu["memory"]["before_run"]["server_pids"] == [pid] and gpu["memory"]["before_run"]["server_mib"] == 122880
    assert result["memory"]["peak_reserved_mib"] == 1536 and result["memory"]["peak"] == "GPU 0 bf16_matmul"
    assert result["memory"]["nvml_error"] is None and result["out_of_memory"] == []


def test_beside_a_server_an_out_of_memory_is_reported_as_that(monkeypatch, tmp_path):
    oom = {
        "status": "out_of_memory",
        "error": "OutOfMemoryError: CUDA out of memory. Tried to allocate 128.00 MiB",
        "memory": {"free_before_mib": 100, "total_mib": 143771, "free_after_mib": 90, "peak_reserved_mib": 0},
    }
    gpu_raw = {"bf16_matmul": oom, "flashinfer_single_decode": DECODE}
    result, _calls, pid = beside_a_server(monkeypatch, tmp_path, gpu_raw)
    assert result["status"] == "failed" and result["gpus"][0]["checks"]["bf16_matmul"]["status"] == "out_of_memory"
    assert result["out_of_memory"] == result["failures"] and len(result["failures"]) == 1
    message = result["failures"][0]
    assert "bf16_matmul: out of memory, not a kernel error: 100 MiB of 143771 MiB were free" in message
    assert f"the serving unit's processes {pid} hold 122880 MiB" in message
