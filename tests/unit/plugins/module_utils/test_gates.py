# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The preflight's GPU gates (_gates.judge_gpu_gates): every gate's pass, fail and unreadable message, numeric
comparison, no GPU, the recorded H200's NVML answers replayed through _nvml.collect, and the verdicts the device run
recorded (tests/data/device/h200-preflight-gates.json) judged again from the facts it recorded."""

from __future__ import annotations

import copy
import importlib.util
import json
from pathlib import Path

import pytest

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _gates, _nvml

DATA = Path(__file__).resolve().parents[3] / "data" / "device"
_spec = importlib.util.spec_from_file_location("nvml_fake", DATA / "nvml_fake.py")
fake = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fake)

CU130 = {  # stacks/cu130.yml driver.min_version, driver.min_cuda, gpu.min_compute_capability
    "profile": "cu130",
    "min_driver_version": "580.65.06",
    "min_cuda_driver_version": "13.0",
    "min_compute_capability": "7.5",
}
TOO_HIGH = dict(CU130, profile="cu131", min_driver_version="590.48.01", min_cuda_driver_version="13.1")
GPU = {"index": 3, "name": "NVIDIA RTX PRO 6000", "uuid": "GPU-abc", "compute_capability": "12.0", "errors": {}}


def facts(**over):
    base = {"driver_version": "580.159.04", "cuda_driver_version": "13.0", "errors": {}, "gpus": [dict(GPU)]}
    base.update(over)
    return base


@pytest.mark.parametrize(
    ("seen", "minimum", "expected"),
    [
        ("580.65.06", "580.159.04", True),  # 65 < 159 as numbers; as strings '6' > '1' would say the opposite
        ("580.159.04", "580.65.06", False),
        ("12.0", "7.5", False),  # as strings '1' < '7' would call SM 12.0 too old
        ("7.0", "7.5", True),
        ("13", "13.0", False),  # padded with zeros: equal
        ("13.0", "13.1", True),
        ("not supported", "13.0", None),
        (None, "13.0", None),
        (True, "13.0", None),
        ("580.159.04", "", None),
    ],
)
def test_below_compares_numbers_not_strings(seen, minimum, expected):
    assert _gates.below(seen, minimum) is expected


def test_every_gate_passes_on_a_blackwell_host():
    verdict = _gates.judge_gpu_gates(facts(), CU130, "gpu-01")
    assert verdict["passed"] is True and verdict["failures"] == []
    assert verdict["report"] == "ok: driver 580.159.04, CUDA 13.0, 1 GPU(s)"
    assert verdict["gates"]["driver"] == {"seen": "580.159.04", "minimum": "580.65.06", "passed": True}
    assert verdict["gates"]["compute_capability"]["gpus"] == [{"index": 3, "seen": "12.0", "passed": True}]


def test_driver_below_the_minimum_names_host_value_minimum_and_fix():
    verdict = _gates.judge_gpu_gates(facts(driver_version="575.51.03"), CU130, "gpu-01")
    assert verdict["passed"] is False and verdict["report"] == "failed"
    (msg,) = verdict["failures"]
    assert msg.startswith("gpu-01: NVIDIA driver 575.51.03 is below 580.65.06, the minimum of profile cu130")
    assert "fix: upgrade the driver to 580.65.06 or newer" in msg
    assert verdict["gates"]["driver"]["passed"] is False


def test_cuda_driver_below_the_target_names_host_value_minimum_and_fix():
    verdict = _gates.judge_gpu_gates(facts(cuda_driver_version="12.8"), CU130, "gpu-01")
    (msg,) = verdict["failures"]
    assert "gpu-01: the driver supports CUDA 12.8, the target needs 13.0 (profile cu130, driver.min_cuda)" in msg
    assert "fix: upgrade the driver to one that supports CUDA 13.0" in msg


def test_sm_below_the_minimum_names_the_gpu_and_the_fix():
    old = dict(GPU, index=1, name="Tesla V100", uuid="GPU-v100", compute_capability="7.0")
    verdict = _gates.judge_gpu_gates(facts(gpus=[dict(GPU), old]), CU130, "gpu-01")
    (msg,) = verdict["failures"]
    assert msg.startswith("gpu-01: GPU 1 (Tesla V100, GPU-v100) has SM 7.0, below the minimum 7.5")
    assert "fix: leave this host out of the upgrade (--limit)" in msg
    assert [g["passed"] for g in verdict["gates"]["compute_capability"]["gpus"]] == [True, False]


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("driver_version", None, "the NVIDIA driver version reads None, which cannot be compared with the minimum"),
        ("driver_version", "not supported", "reads 'not supported'"),
        ("cuda_driver_version", None, "the CUDA version the driver supports reads None, which cannot be compared"),
    ],
)
def test_unreadable_versions_fail_with_the_nvml_error(field, value, expected):
    errors = {field: {"call": "nvmlSystemGet", "code": 999, "error": "Unknown Error"}}
    verdict = _gates.judge_gpu_gates(facts(**{field: value, "errors": errors}), CU130, "gpu-01")
    (msg,) = verdict["failures"]
    assert msg.startswith("gpu-01: ") and expected in msg
    assert "NVML answered: Unknown Error" in msg and "fix: check the driver with nvidia-smi" in msg


def test_a_gpu_nvml_cannot_open_fails_naming_the_error():
    lost = {"index": 2, "errors": {"handle": {"error": "GPU is lost"}}, "lost": True}
    verdict = _gates.judge_gpu_gates(facts(gpus=[lost]), CU130, "gpu-01")
    (msg,) = verdict["failures"]
    assert "gpu-01: GPU 2 (name unknown, uuid unknown): NVML could not open it (GPU is lost)" in msg
    assert "minimum SM 7.5" in msg and "dmesg for Xid errors" in msg


def test_no_gpu_fails_with_the_fix():
    verdict = _gates.judge_gpu_gates(facts(gpus=[]), CU130, "gpu-01")
    (msg,) = verdict["failures"]
    assert msg.startswith("gpu-01: NVML sees no GPU but the profile requires one")
    assert "gpufleet_gpu_required=false" in msg


def test_a_minimum_left_out_is_not_gated():
    verdict = _gates.judge_gpu_gates(facts(driver_version="1.0"), dict(CU130, min_driver_version=None), "h")
    assert verdict["passed"] is True and "driver" not in verdict["gates"]


def test_all_failures_are_reported_at_once():
    bad = facts(driver_version="560.35.03", cuda_driver_version="12.6", gpus=[dict(GPU, compute_capability="6.1")])
    verdict = _gates.judge_gpu_gates(bad, CU130, "gpu-01")
    assert len(verdict["failures"]) == 3


def test_nvml_unusable_names_the_reason_and_the_fix():
    verdict = _gates.nvml_unusable("libnvidia-ml.so.1 was not found", "gpu-01")
    assert verdict["passed"] is False and verdict["report"] == "failed"
    (msg,) = verdict["failures"]
    assert msg.startswith("gpu-01: NVML is not usable (libnvidia-ml.so.1 was not found)")
    assert "install the NVIDIA driver" in msg


def collected(recording):
    nvml = fake.FakeNVML(recording)
    _nvml.init(nvml)
    return _nvml.collect(nvml)


def test_h200_nvml_record_through_collect():
    """The answers a real H200 gave: the cu130 gates pass, minimums above it refuse on driver and CUDA."""
    got = collected(fake.load())
    passed = _gates.judge_gpu_gates(got, CU130, "h200")
    assert passed["passed"] is True, passed["failures"]
    assert passed["report"] == "ok: driver 580.159.04, CUDA 13.0, 1 GPU(s)"
    refused = _gates.judge_gpu_gates(got, TOO_HIGH, "h200")
    assert [m.split(";")[0] for m in refused["failures"]] == [
        "h200: NVIDIA driver 580.159.04 is below 590.48.01, the minimum of profile cu131 (driver.min_version)",
        "h200: the driver supports CUDA 13.0, the target needs 13.1 (profile cu131, driver.min_cuda)",
    ]


def test_eight_gpus_of_the_recording_one_of_them_lost():
    recording = fake.replicate(fake.load(), 8)
    for call in recording["calls"]:
        if call["fn"] == "nvmlDeviceGetHandleByIndex" and call["args"] == [5]:
            call["error"] = fake.GPU_IS_LOST
            call.pop("result", None)
    verdict = _gates.judge_gpu_gates(collected(recording), CU130, "h200x8")
    assert len(verdict["gates"]["compute_capability"]["gpus"]) == 8
    (msg,) = verdict["failures"]
    assert msg.startswith("h200x8: GPU 5 (name unknown, uuid unknown): NVML could not open it")


# ------------------------------------------------------------------ the device run (bench/sm120_readiness_device.py)

RECORDED = json.loads((DATA / "h200-preflight-gates.json").read_text())


def recorded_minimums(run):
    result = run["result"]
    return {
        "profile": result["profile"],
        "min_driver_version": result["driver"]["min_version"],
        "min_cuda_driver_version": result["driver"]["min_cuda"],
        "min_compute_capability": result["min_compute_capability"],
    }


@pytest.mark.parametrize("name", sorted(RECORDED))
def test_recorded_verdicts_follow_from_the_recorded_facts(name):
    run = RECORDED[name]
    nvml = run["result"]["nvml_info"]
    recorded_facts = {k: copy.deepcopy(nvml[k]) for k in ("driver_version", "cuda_driver_version", "gpus")}
    again = _gates.judge_gpu_gates(recorded_facts, recorded_minimums(run), "localhost")
    assert again == nvml["gates"]
    assert run["result"]["preflight_report"]["gpu"] == again["report"]


def test_recorded_cu130_passes_and_the_high_minimums_refuse_changing_nothing():
    assert RECORDED["cu130"]["result"]["refusal"] is None
    assert RECORDED["cu130"]["result"]["nvml_info"]["driver_version"] == "580.159.04"
    for name in ("too_high", "too_high_check_mode"):
        run = RECORDED[name]
        assert run["result"]["refusal"] == "; ".join(run["result"]["nvml_info"]["gates"]["failures"])
        assert "NVIDIA driver 580.159.04 is below 590.48.01" in run["result"]["refusal"]
        assert run["state_dir_changed"] == [] and " changed=0 " in run["recap"]
    assert RECORDED["too_high_check_mode"]["check_mode"] is True
