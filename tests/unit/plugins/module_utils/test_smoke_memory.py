# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The smoke test beside a resident server: each check's GPU memory, and an allocation that does not fit told as
that. The GPU is a stand-in torch.cuda with a caching allocator's bookkeeping and a server holding most of the
card; the worker's own code runs against it."""

from __future__ import annotations

import json
import types

import pytest

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _nvml, _smoke, _smoke_worker

MIB = 2**20
H200_MIB = 143771


class OutOfMemoryError(RuntimeError):
    """Named as torch.cuda.OutOfMemoryError is: the worker knows it by its name, as it must without torch."""


class FakeCuda:
    """torch.cuda as the probe uses it: a card of H200 size of which ``held_mib`` is another process's, and
    torch's caching allocator (reserved, allocated, peaks, empty_cache)."""

    def __init__(self, held_mib):
        self.held = held_mib * MIB
        self.total = H200_MIB * MIB
        self.context = 500 * MIB  # a CUDA context, outside torch's allocator
        self.reserved = self.allocated = self.peak_reserved = self.peak_allocated = 0
        self.inited = False

    def init(self):
        self.inited = True

    def set_device(self, index):
        pass

    def _need_init(self):
        if not self.inited:
            raise RuntimeError("Invalid device argument")  # what torch says of stats before CUDA is up

    def mem_get_info(self, index):
        self._need_init()
        used = self.held + self.context + self.reserved
        return self.total - used, self.total

    def empty_cache(self):
        self.reserved = self.allocated

    def reset_peak_memory_stats(self, index):
        self._need_init()
        self.peak_reserved, self.peak_allocated = self.reserved, self.allocated

    def max_memory_allocated(self, index):
        return self.peak_allocated

    def max_memory_reserved(self, index):
        return self.peak_reserved

    def get_device_properties(self, index):
        return types.SimpleNamespace(uuid="8c0e5b1a-0000-0000-0000-000000000000")

    def alloc(self, mib):
        free, _total = self.mem_get_info(0)
        if mib * MIB > free:
            raise OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate {mib / 1024:.2f} GiB. GPU 0 has a total capacity of"
                f" {self.total / 2**30:.2f} GiB of which {free / 2**30:.2f} GiB is free."
            )
        self.allocated += mib * MIB
        self.reserved += mib * MIB
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        self.peak_reserved = max(self.peak_reserved, self.reserved)

    def free(self, mib):
        self.allocated -= mib * MIB  # freed tensors stay reserved in the cache until empty_cache


@pytest.fixture
def gpu(monkeypatch):
    """A server holding 90 % of the card; the worker's ``need('torch')`` gets the stand-in."""
    cuda = FakeCuda(held_mib=int(H200_MIB * 0.9))
    monkeypatch.setitem(__import__("sys").modules, "torch", types.SimpleNamespace(cuda=cuda))
    return cuda


def run(capsys, table, names=None):
    _smoke_worker.run_checks(names or list(table), table, memory_index=0)
    return {e["check"]: e for e in map(json.loads, capsys.readouterr().out.splitlines()) if e["event"] == "result"}


def test_each_check_reports_its_own_peak_and_the_cache_it_left_is_given_back(gpu, capsys):
    def big(**_):
        gpu.alloc(1536)
        gpu.free(1536)
        return {}

    def small(**_):
        gpu.alloc(256)
        gpu.free(256)
        return {}

    got = run(capsys, {"big": big, "small": small})
    big_mem, small_mem = got["big"]["memory"], got["small"]["memory"]
    assert big_mem["peak_reserved_mib"] == 1536 and big_mem["peak_allocated_mib"] == 1536
    assert small_mem["peak_reserved_mib"] == 256  # not 1536: big's cache was emptied before small began
    assert big_mem["total_mib"] == H200_MIB
    assert big_mem["free_before_mib"] == H200_MIB - int(H200_MIB * 0.9) - 500
    assert big_mem["device_used_after_mib"] == int(H200_MIB * 0.9) + 500 + 1536  # the freed tensors stay cached
    assert got["big"]["status"] == "measured"


def test_an_allocation_that_does_not_fit_is_out_of_memory_with_the_memory_seen(gpu, capsys):
    def greedy(**_):
        gpu.alloc(20 * 1024)
        return {}

    got = run(capsys, {"greedy": greedy})["greedy"]
    assert got["status"] == "out_of_memory" and "CUDA out of memory" in got["error"]
    assert got["memory"]["free_before_mib"] == H200_MIB - int(H200_MIB * 0.9) - 500
    assert got["memory"]["free_after_mib"] == got["memory"]["free_before_mib"]


def test_a_wrong_kernel_stays_an_error(gpu, capsys):
    def broken(**_):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    assert run(capsys, {"broken": broken})["broken"]["status"] == "error"


def test_a_probe_that_cannot_read_the_gpu_says_why_and_the_check_still_reports(monkeypatch, capsys):
    monkeypatch.setitem(__import__("sys").modules, "torch", types.SimpleNamespace())
    got = run(capsys, {"plain": lambda **_: {}})["plain"]
    assert got["status"] == "measured" and got["memory"]["error"].startswith("AttributeError")


@pytest.mark.parametrize(
    ("exc", "oom"),
    [
        (OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), True),
        (RuntimeError("CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported"), True),
        (RuntimeError("CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"), True),
        (RuntimeError("Error in function 'run' at flashinfer/csrc/decode.cu:120: cudaErrorMemoryAllocation"), True),
        (
            RuntimeError(
                "NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled cuda error, Cuda failure 'out of memory'"
            ),
            True,
        ),
        (RuntimeError("CUDA error: an illegal memory access was encountered"), False),
        (RuntimeError("JIT compilation is disabled"), False),
    ],
)
def test_out_of_memory_is_known_by_its_class_or_the_words_of_cuda_cublas_flashinfer_and_nccl(exc, oom):
    assert _smoke_worker.is_out_of_memory(exc) is oom
    assert _smoke_worker.failure(exc)["status"] == ("out_of_memory" if oom else "error")


# ------------------------------------------------------------------------------------------- the judgement

GPU0 = {"index": 0, "uuid": "GPU-8c0e5b1a-0000-0000-0000-000000000000"}
HELD = {
    "index": 0,
    "total_mib": H200_MIB,
    "used_mib": 129893,
    "server_pids": [3703],
    "server_mib": 129393,
    "other_pids": [4242],
    "other_mib": 500,
}
OOM_RAW = {
    "status": "out_of_memory",
    "error": "OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB",
    "memory": {"free_before_mib": 13878, "total_mib": H200_MIB, "free_after_mib": 13878, "peak_reserved_mib": 0},
}


def test_out_of_memory_is_judged_as_that_naming_the_free_memory_and_what_the_server_holds():
    got = _smoke.judge_kernel("bf16_matmul", OOM_RAW, GPU0, {"held": HELD})
    assert got["status"] == "out_of_memory"
    message = got["message"]
    assert message.startswith(f"GPU 0 ({GPU0['uuid']}): bf16_matmul: out of memory, not a kernel error")
    assert f"13878 MiB of {H200_MIB} MiB were free when it started" in message
    assert "the serving unit's processes 3703 hold 129393 MiB, other processes 4242 500 MiB" in message
    assert "postcheck_smoke_matmul_size" in message and "Tried to allocate 20.00 GiB" in message
    unknown = _smoke.judge_kernel("bf16_matmul", OOM_RAW, GPU0, {})["message"]
    assert "what the server holds is unknown" in unknown
    unnamed = _smoke.judge_kernel("bf16_matmul", OOM_RAW, GPU0, {"held": dict(HELD, server_pids=None)})["message"]
    assert "processes 4242 hold 500 MiB (the server was not named)" in unnamed


def test_out_of_memory_fails_the_smoke_test_and_is_listed_apart():
    oom = _smoke.judge_kernel("bf16_matmul", OOM_RAW, GPU0, {"held": HELD})
    gpus = [dict(GPU0, checks={"bf16_matmul": oom})]
    assert _smoke.summarize({}, gpus, None) == {"passed": False, "failures": [oom["message"]]}
    assert _smoke.out_of_memory_messages({}, gpus, None) == [oom["message"]]
    ranks = [{"rank": 0, **OOM_RAW}]
    allreduce = _smoke.judge_allreduce(ranks, 1, "nccl")
    assert (
        allreduce["status"] == "failed" and "rank 0 (GPU 0): out of memory, not a kernel error" in allreduce["message"]
    )
    assert _smoke.out_of_memory_messages({}, [], allreduce) == [allreduce["message"]]


def test_memory_figures_per_gpu_and_for_the_host():
    def check(reserved, allocated, used):
        mem = {"peak_reserved_mib": reserved, "peak_allocated_mib": allocated, "device_used_after_mib": used}
        return {"status": "passed", "raw": {"memory": mem}}

    gpu0 = _smoke.check_memory(
        {"bf16_matmul": check(1536, 1280, 131000), "flashinfer_batch_decode": check(200, 150, 129800)}
    )
    gpu1 = _smoke.check_memory(
        {"bf16_matmul": check(1600, 1280, 131100), "capability_probes": {"status": "info", "raw": {}}}
    )
    assert gpu0["peak_check"] == "bf16_matmul" and gpu0["peak_reserved_mib"] == 1536
    assert gpu0["peak_allocated_mib"] == 1280 and gpu0["peak_device_used_mib"] == 131000
    assert set(gpu1["checks"]) == {"bf16_matmul"}
    ranks = [{"rank": r, "memory": {"peak_reserved_mib": 512, "device_used_after_mib": 130400 + r}} for r in (0, 1)]
    summary = _smoke.memory_summary([dict(index=0, memory=gpu0), dict(index=1, memory=gpu1)], {"ranks": ranks})
    assert summary == {
        "peak_reserved_mib": 1600,
        "peak": "GPU 1 bf16_matmul",
        "allreduce_peak_reserved_mib": 512,
        "allreduce_peak_device_used_mib": 130401,
    }
    assert _smoke.check_memory({}) == {"checks": {}}
    assert _smoke.memory_summary([], None)["peak_reserved_mib"] is None


def test_the_environment_report_names_what_the_module_changed_and_no_value_of_the_rest():
    serving = {"HF_TOKEN": "secret", "NCCL_NVLS_ENABLE": "1", "CUDA_HOME": "/usr/local/cuda-13.0"}
    env = _smoke.build_env(serving, {"GPUFLEET_SMOKE_INJECT_FAULT": "x"})
    report = _smoke.env_report(serving, env, {"GPUFLEET_SMOKE_INJECT_FAULT": "x"}, {"kind": "process", "pid": 1})
    assert report["changed"]["NCCL_NVLS_ENABLE"] == "0" and report["changed"]["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert "HF_TOKEN" not in report["changed"] and "secret" not in json.dumps(report)
    assert "HF_TOKEN" in report["names"] and report["from_caller"] == ["GPUFLEET_SMOKE_INJECT_FAULT"]
    assert env["CUDA_HOME"] == "/usr/local/cuda-13.0" and env["HF_TOKEN"] == "secret"  # nothing stripped


# ------------------------------------------------------------------------------ what the GPUs' processes hold


def test_memory_holders_split_the_servers_from_the_others():
    fake = _nvml_fake()
    procs = [{"pid": 3703, "usedGpuMemory": 120 * 2**30}, {"pid": 4242, "usedGpuMemory": 2**30}]
    nvml = fake.FakeNVML(fake.load(), {"nvmlDeviceGetComputeRunningProcesses": procs, "nvmlSystemGetProcessName": "p"})
    holders, error = _nvml.read_memory_holders(lambda: nvml, {3700, 3703})
    assert error is None and ("nvmlShutdown", []) in nvml.asked
    assert len(holders) == 1
    uuid, held = next(iter(holders.items()))
    assert uuid.startswith("GPU-") and held["index"] == 0 and held["total_mib"] == 143771
    assert held["server_pids"] == [3703] and held["server_mib"] == 122880
    assert held["other_pids"] == [4242] and held["other_mib"] == 1024
    holders, _error = _nvml.read_memory_holders(lambda: nvml, None)
    assert holders[uuid]["server_pids"] is None and holders[uuid]["other_mib"] == 123904


def test_memory_holders_without_nvml_say_why():
    def unusable():
        raise _nvml.NvmlUnavailable("libnvidia-ml.so.1 was not found")

    assert _nvml.read_memory_holders(unusable, None) == ({}, "libnvidia-ml.so.1 was not found")


def _nvml_fake():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[3] / "data" / "device" / "nvml_fake.py"
    spec = importlib.util.spec_from_file_location("nvml_fake", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
