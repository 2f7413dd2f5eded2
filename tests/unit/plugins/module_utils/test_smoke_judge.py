# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The smoke test's judging: pure functions, fed with what the worker measured on a real H200 and with faults."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _smoke

DATA = Path(__file__).resolve().parents[3] / "data" / "device"
COLD = json.loads((DATA / "h200-postcheck-cold.json").read_text())
WARM = json.loads((DATA / "h200-postcheck-warm.json").read_text())
FAULT = json.loads((DATA / "h200-postcheck-fault.json").read_text())
GPU = {"index": 3, "uuid": "GPU-0000-test"}
PARAMS = {"required_packages": ["torch", "flashinfer"], "python": "/venv/bin/python", "tolerances": {}}
KERNELS = ["bf16_matmul", "flashinfer_single_decode", "flashinfer_single_prefill", "flashinfer_batch_decode"]


def raw(run, check):
    return run["smoke"]["gpus"][0]["checks"][check]["raw"]


@pytest.mark.parametrize("run", [COLD, WARM], ids=["cold", "warm"])
@pytest.mark.parametrize("check", KERNELS)
def test_real_h200_kernels_pass(run, check):
    outcome = _smoke.judge_kernel(check, raw(run, check), GPU, PARAMS)
    assert outcome["status"] == "passed", outcome["message"]
    assert "GPU 3 (GPU-0000-test)" in outcome["message"]


@pytest.mark.parametrize("check", ["bf16_matmul", "flashinfer_batch_decode"])
def test_a_three_percent_fault_on_the_h200_fails(check):
    outcome = _smoke.judge_kernel(check, raw(FAULT, check), GPU, PARAMS)
    assert outcome["status"] == "failed"
    assert "tolerance" in outcome["message"] and check in outcome["message"]


def test_the_fault_run_left_the_other_kernels_passing():
    for check in ("flashinfer_single_decode", "flashinfer_single_prefill"):
        assert _smoke.judge_kernel(check, raw(FAULT, check), GPU, PARAMS)["status"] == "passed"


def stats(**kw):
    base = {
        "max_abs_err": 0.001,
        "mean_abs_err": 0.0001,
        "max_abs_ref": 1.0,
        "rel_fro_err": 0.002,
        "cosine": 0.99999,
        "nonfinite": 0,
        "numel": 100,
    }
    return base | kw


@pytest.mark.parametrize(
    ("kind", "bad", "words"),
    [
        ("matmul", {"rel_fro_err": 0.011}, "relative error 0.011 (tolerance 0.01)"),
        ("matmul", {"cosine": 0.99}, "cosine 0.990000"),
        ("matmul", {"nonfinite": 3}, "3 of 100 outputs are NaN or Inf"),
        ("attention", {"max_abs_err": 0.021}, "max abs error 0.021 (tolerance 0.02)"),
        ("attention", {"rel_fro_err": 0.0101}, "relative error 0.0101 (tolerance 0.01)"),
        ("attention", {"cosine": 0.9989}, "cosine 0.998900 (minimum 0.999)"),
        ("attention", {"nonfinite": 1}, "NaN or Inf"),
    ],
)
def test_judge_close_catches_each_kind_of_wrong_result(kind, bad, words):
    ok, _reason = _smoke.judge_close(stats(), kind)
    assert ok is True
    ok, message = _smoke.judge_close(stats(**bad), kind)
    assert ok is False
    assert words in message


def test_tolerances_can_be_widened():
    ok, _reason = _smoke.judge_close(stats(rel_fro_err=0.05), "matmul", {"matmul_rel_err": 0.1})
    assert ok is True


def test_nan_cosine_never_passes():
    ok, _reason = _smoke.judge_close(stats(cosine=math.nan), "attention")
    assert ok is False


def test_missing_package_fails_when_required_and_skips_otherwise():
    missing = {"status": "missing_package", "package": "flashinfer", "error": "No module named 'flashinfer'"}
    required = _smoke.judge_kernel("flashinfer_single_decode", missing, GPU, PARAMS)
    assert required["status"] == "failed"
    assert "profile requires it" in required["message"] and "GPU 3 (GPU-0000-test)" in required["message"]
    optional = _smoke.judge_kernel("flashinfer_single_decode", missing, GPU, dict(PARAMS, required_packages=["torch"]))
    assert optional["status"] == "skipped" and "not required by the profile" in optional["message"]


def test_timeout_and_error_fail_with_the_gpu_named():
    timeout = _smoke.judge_kernel(
        "bf16_matmul", {"status": "timeout", "error": "did not finish within 5 s"}, GPU, PARAMS
    )
    assert timeout["status"] == "failed" and "GPU 3 (GPU-0000-test): bf16_matmul: did not finish" in timeout["message"]
    error = _smoke.judge_kernel("flashinfer_batch_decode", {"status": "error", "error": "RuntimeError: x"}, GPU, PARAMS)
    assert error["status"] == "failed" and "raised RuntimeError: x" in error["message"]


def test_capability_probes_are_reported_not_judged():
    outcome = _smoke.judge_kernel("capability_probes", raw(WARM, "capability_probes"), GPU, PARAMS)
    assert outcome["status"] == "info"
    assert outcome["raw"]["flashinfer_probes"]["is_sm90a_supported"] is True


def test_cuda_version():
    env = WARM["smoke"]["torch"]
    assert _smoke.judge_cuda_version(env, "13.0")["status"] == "passed"
    wrong = _smoke.judge_cuda_version(env, "12.8")
    assert wrong["status"] == "failed"
    assert "'13.0' but the profile targets '12.8'" in wrong["message"] and "cu128" in wrong["message"]
    assert _smoke.judge_cuda_version(env, None)["status"] == "info"


def test_arch_list():
    arch = WARM["smoke"]["torch"]["arch_list"]
    h200 = WARM["smoke"]["torch"]["devices"][0]
    assert _smoke.judge_arch(h200, arch)["status"] == "passed"
    blackwell = dict(h200, sm="sm_121", uuid="GPU-x")
    failed = _smoke.judge_arch(blackwell, [*arch, "compute_120"])
    assert failed["status"] == "failed"
    assert "sm_121 is not in" in failed["message"] and "PTX" in failed["message"]


def versions(**dists):
    parsed = {}
    for dist, version in dists.items():
        public, _sep, local = version.partition("+")
        parsed[dist.replace("_", "-")] = {"version": version, "public": public, "local": local or None}
    return {"status": "measured", "parsed": parsed}


def test_flashinfer_versions_recorded_on_the_h200():
    outcome = _smoke.judge_versions(WARM["smoke"]["host_checks"]["flashinfer_versions"]["raw"], "0.6.4", "13.0", PARAMS)
    assert outcome["status"] == "passed"
    assert "absent: flashinfer-cubin, flashinfer-jit-cache" in outcome["message"]


@pytest.mark.parametrize(
    ("trio", "pin", "words"),
    [
        ({"flashinfer_python": "0.6.4", "flashinfer_cubin": "0.6.3"}, None, "flashinfer-cubin 0.6.3 does not match"),
        (
            {"flashinfer_python": "0.6.4", "flashinfer_jit_cache": "0.6.5+cu130"},
            None,
            "flashinfer-jit-cache 0.6.5+cu130 does not match",
        ),
        ({"flashinfer_python": "0.6.4", "flashinfer_jit_cache": "0.6.4+cu129"}, None, "built for cu129"),
        ({"flashinfer_python": "0.6.3"}, "0.6.4", "the profile pins 0.6.4"),
    ],
)
def test_flashinfer_versions_mismatch(trio, pin, words):
    outcome = _smoke.judge_versions(versions(**trio), pin, "13.0", PARAMS)
    assert outcome["status"] == "failed" and words in outcome["message"]


def test_flashinfer_trio_consistent():
    trio = versions(flashinfer_python="0.6.4", flashinfer_cubin="0.6.4", flashinfer_jit_cache="0.6.4+cu130")
    assert _smoke.judge_versions(trio, "0.6.4", "13.0", PARAMS)["status"] == "passed"


def test_flashinfer_absent():
    missing = {"status": "missing_package", "package": "flashinfer", "error": "x"}
    assert _smoke.judge_versions(missing, None, "13.0", PARAMS)["status"] == "failed"
    assert _smoke.judge_versions(missing, None, "13.0", dict(PARAMS, required_packages=[]))["status"] == "skipped"


def test_peer_access():
    assert _smoke.judge_peer_access({"count": 1, "pairs": {}}, 1)["status"] == "skipped"
    assert _smoke.judge_peer_access({"pairs": {"0->1": True, "1->0": True}}, 2)["status"] == "passed"
    partial = _smoke.judge_peer_access({"pairs": {"0->1": False, "1->0": True}}, 2)
    assert partial["status"] == "info" and "0->1" in partial["message"]


def rank(r, world, err=0.0, status="measured"):
    return {
        "rank": r,
        "status": status,
        "max_abs_err": err,
        "size_mb": 256,
        "seconds_per_op": 0.002,
        "algbw_gbps": 134.2,
        "busbw_gbps": 134.2 * 2 * (world - 1) / world,
    }


def test_allreduce_right_sum():
    out = _smoke.judge_allreduce([rank(r, 8) for r in range(8)], 8, "nccl")
    assert out["status"] == "passed" and out["expected"] == 36
    assert "bus bandwidth 234.8 GB/s" in out["message"]


def test_allreduce_wrong_sum_names_the_rank():
    ranks = [rank(r, 4) for r in range(4)]
    ranks[2] = rank(2, 4, err=1.0)
    out = _smoke.judge_allreduce(ranks, 4, "nccl")
    assert out["status"] == "failed" and "rank 2 (GPU 2): wrong sum" in out["message"]


def test_allreduce_missing_or_timed_out_rank():
    out = _smoke.judge_allreduce([rank(0, 2), {"rank": 1, "status": "timeout", "error": "did not finish"}], 2, "nccl")
    assert out["status"] == "failed" and "rank 1 (GPU 1): did not finish" in out["message"]
    out = _smoke.judge_allreduce([rank(0, 2)], 2, "gloo")
    assert "rank 1 (GPU 1) reported nothing" in out["message"]


def test_allreduce_single_rank_recorded_on_the_h200():
    out = _smoke.judge_allreduce(WARM["smoke"]["allreduce"]["ranks"], 1, "nccl")
    assert out["status"] == "passed" and "no bandwidth to measure" in out["message"]
    assert "busbw_gbps" not in out


def test_build_env_keeps_multicast_off_whatever_the_caller_says():
    env = _smoke.build_env({"PATH": "/bin", "NCCL_NVLS_ENABLE": "1"}, {"NCCL_NVLS_ENABLE": "1", "CUDA_HOME": "/c"})
    assert env["NCCL_NVLS_ENABLE"] == "0"
    assert env["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1" and env["NVSHMEM_DISABLE_NVLS"] == "1"
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID" and env["CUDA_HOME"] == "/c" and env["PATH"] == "/bin"


def test_recorded_runs_kept_multicast_off():
    for run in (COLD, WARM, FAULT):
        assert run["smoke"]["env"]["NCCL_NVLS_ENABLE"] == "0"
        assert run["smoke"]["host_checks"]["symmetric_memory"]["raw"]["multicast_disabled_by_env"] == "1"


def test_summarize_collects_failures_from_everywhere():
    host = {"a": _smoke.outcome("passed"), "b": _smoke.outcome("failed", "host broke")}
    gpus = [{"checks": {"x": _smoke.outcome("failed", "gpu broke"), "y": _smoke.outcome("skipped", "")}}]
    allreduce = _smoke.outcome("failed", "sum broke")
    assert _smoke.summarize(host, gpus, allreduce) == {
        "passed": False,
        "failures": ["host broke", "gpu broke", "sum broke"],
    }
    assert _smoke.summarize({}, [{"checks": {"y": _smoke.outcome("skipped")}}], None)["passed"] is True


def test_recorded_fault_run_failed_the_host_and_named_the_gpu():
    assert FAULT["passed"] is False and FAULT["gates"]["smoke"]["status"] == "failed"
    uuid = FAULT["smoke"]["gpus"][0]["uuid"]
    assert all(uuid in f for f in FAULT["failures"]) and len(FAULT["failures"]) == 2
