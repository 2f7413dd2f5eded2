# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""gpu_smoke_test end to end with real worker processes.

Without torch (this venv's Python) the module's missing-package paths run. With GPUFLEET_TORCH_PYTHON pointing at
an interpreter that has torch (CPU is enough), the CPU orchestration runs too: bf16 matmul per rank and the
multi-process all-reduce over gloo, and a corrupted kernel is caught.
"""

from __future__ import annotations

import os
import sys

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
