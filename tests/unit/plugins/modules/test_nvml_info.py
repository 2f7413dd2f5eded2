# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""nvml_info: no NVML on this machine (real), and the recorded H200's answers replayed through pynvml's stand-in."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pynvml
import pytest
from ansible.module_utils.testing import patch_module_args
from module_harness import Exit, Fail

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _nvml
from ansible_collections.gpufleet.upgrade.plugins.modules import nvml_info

DATA = Path(__file__).resolve().parents[3] / "data" / "device"
_spec = importlib.util.spec_from_file_location("nvml_fake", DATA / "nvml_fake.py")
fake = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fake)


def no_driver_here():
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return True
    pynvml.nvmlShutdown()  # pragma: no cover - only on a machine with a driver
    return False


needs_no_driver = pytest.mark.skipif(not no_driver_here(), reason="this machine has an NVIDIA driver")


@needs_no_driver
def test_fails_clearly_without_nvml():
    with patch_module_args({}), pytest.raises(Fail) as err:
        nvml_info.main()
    msg = err.value.args[0]["msg"]
    assert "NVML is not available: libnvidia-ml.so.1 was not found" in msg
    assert "gpufleet_gpu_required=false" in msg  # the fix is named


@needs_no_driver
def test_reports_skipped_without_nvml_when_no_gpu_is_required():
    with patch_module_args({"gpu_required": False}), pytest.raises(Exit) as out:
        nvml_info.main()
    result = out.value.args[0]
    assert result["status"] == "skipped" and result["healthy"] is None
    assert result["skipped_reason"] == "skipped: no GPU (libnvidia-ml.so.1 was not found)"
    assert result["changed"] is False and result["gpus"] == []


def test_fails_clearly_without_nvidia_ml_py(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "pynvml", None)
    with patch_module_args({}):
        module = nvml_info.build_module()
    with pytest.raises(Fail, match="nvidia-ml-py"):
        nvml_info.run(module)


def run_fake(args, overrides=None, recording=None):
    with patch_module_args(args):
        module = nvml_info.build_module()
    nvml = fake.FakeNVML(recording or fake.load(), overrides)
    return nvml_info.run(module, nvml_loader=lambda: nvml), nvml


def test_h200_recording_through_the_module():
    result, nvml = run_fake({"thresholds": {"max_temperature_c": 80}})
    assert result["status"] == "healthy" and result["healthy"] is True and result["changed"] is False
    assert result["driver_version"] == "580.159.04" and result["cuda_driver_version"] == "13.0"
    recorded = json.loads((DATA / "h200-postcheck-warm.json").read_text())["nvml"]["gpus"][0]
    gpu = result["gpus"][0]
    for key in ("name", "uuid", "pci_bus_id", "compute_capability", "ecc_mode", "pcie", "retired_pages", "nvlink"):
        assert gpu[key] == recorded[key], key
    assert ("nvmlShutdown", []) in nvml.asked  # NVML is released


def test_thresholds_reach_the_rules():
    result, _nvml = run_fake({"thresholds": {"max_temperature_c": 30}})
    assert result["status"] == "unhealthy"
    assert "above 30 C" in result["reasons"][0]


def test_default_thresholds_fill_missing_keys():
    result, _nvml = run_fake({"thresholds": {"max_temperature_c": 90}}, {"nvmlDeviceGetCurrentClocksEventReasons": 0x8})
    assert result["healthy"] is False and "hw_slowdown" in result["reasons"][0]


def test_no_gpu_with_gpu_not_required_is_skipped():
    result, _nvml = run_fake({"gpu_required": False}, {"nvmlDeviceGetCount": 0})
    assert result["status"] == "skipped" and result["skipped_reason"] == "skipped: no GPU (NVML sees no GPU)"


def test_no_gpu_when_one_is_required_is_unhealthy():
    result, _nvml = run_fake({}, {"nvmlDeviceGetCount": 0})
    assert result["status"] == "unhealthy"
    assert "NVML sees no GPU but one is required" in result["reasons"][0]


def test_check_mode_gives_the_same_read_only_result():
    plain, _nvml = run_fake({})
    checked, _nvml = run_fake({"_ansible_check_mode": True})
    assert checked == plain and checked["changed"] is False


def test_argument_spec_rejects_a_bad_threshold():
    with patch_module_args({"thresholds": {"max_temperature_c": "hot"}}), pytest.raises(Fail):
        nvml_info.build_module()


def test_module_defaults_match_the_rules_defaults():
    spec = {k: v["default"] for k, v in _nvml.THRESHOLD_SPEC.items()}
    assert spec == _nvml.DEFAULT_THRESHOLDS


CU130_GATES = {
    "host": "gpu-07",
    "profile": "cu130",
    "min_driver_version": "580.65.06",
    "min_cuda_driver_version": "13.0",
    "min_compute_capability": "7.5",
}


def test_gates_pass_on_the_h200_recording():
    result, _nvml = run_fake({"gates": CU130_GATES})
    assert result["gates"]["passed"] is True and result["gates"]["failures"] == []
    assert result["gates"]["report"] == "ok: driver 580.159.04, CUDA 13.0, 1 GPU(s)"
    assert result["changed"] is False and result["healthy"] is True  # health is judged as ever


def test_gates_refuse_minimums_above_the_h200_naming_the_host():
    gates = dict(CU130_GATES, profile="cu131", min_driver_version="590.48.01", min_cuda_driver_version="13.1")
    result, _nvml = run_fake({"gates": gates})
    failures = result["gates"]["failures"]
    assert len(failures) == 2 and all(f.startswith("gpu-07: ") for f in failures)
    assert "NVIDIA driver 580.159.04 is below 590.48.01, the minimum of profile cu131" in failures[0]
    assert result["gates"]["gates"]["cuda_driver"] == {"seen": "13.0", "minimum": "13.1", "passed": False}
    assert result["status"] == "healthy"  # a gate verdict, not a health verdict: the module itself does not fail


def test_gates_are_absent_unless_asked_for():
    result, _nvml = run_fake({})
    assert "gates" not in result


def test_gates_in_check_mode_are_the_same():
    plain, _nvml = run_fake({"gates": CU130_GATES})
    checked, _nvml = run_fake({"gates": CU130_GATES, "_ansible_check_mode": True})
    assert checked["gates"] == plain["gates"] and checked["changed"] is False


def test_without_nvml_the_failure_carries_the_gates_verdict():
    def unusable():
        raise _nvml.NvmlUnavailable("libnvidia-ml.so.1 was not found")

    with patch_module_args({"gates": CU130_GATES}):
        module = nvml_info.build_module()
    with pytest.raises(Fail) as err:
        nvml_info.run(module, nvml_loader=unusable)
    gates = err.value.args[0]["gates"]
    assert gates["passed"] is False
    assert gates["failures"] == [
        "gpu-07: NVML is not usable (libnvidia-ml.so.1 was not found); fix: install the NVIDIA driver (and"
        " nvidia-ml-py for the Python that runs Ansible modules), or set gpufleet_gpu_required=false for hosts"
        " without GPUs"
    ]


# --------------------------------------------------------------------------- the host model reads the GPUs itself


def host_state_call(monkeypatch, args, overrides=None, loader=None):
    """host_state with the H200 recording behind NVML: the same judgement as nvml_info, in the model's one call."""
    from ansible_collections.gpufleet.upgrade.plugins.modules import host_state

    nvml = fake.FakeNVML(fake.load(), overrides)
    monkeypatch.setattr(_nvml, "load_pynvml", loader or (lambda: nvml))
    with patch_module_args(dict(args, _ansible_check_mode=True)), pytest.raises((Exit, Fail)) as info:
        host_state.main()
    return info.type is Exit, info.value.args[0]


def test_host_state_judges_the_gpus_as_nvml_info_does(monkeypatch):
    ok, res = host_state_call(monkeypatch, {"gpu_health": {"thresholds": {"max_temperature_c": 80}}})
    expected, _calls = run_fake({"thresholds": {"max_temperature_c": 80}})
    assert ok and res["in_sync"] and res["drifted"] == [], res
    assert res["gpu_health"] == expected


def test_host_state_names_each_unhealthy_reason_as_drift(monkeypatch):
    hot = {"max_temperature_c": 20}
    ok, res = host_state_call(monkeypatch, {"gpu_health": {"thresholds": hot}})
    expected, _calls = run_fake({"thresholds": hot})
    assert ok and not res["in_sync"] and res["drifted"] == ["gpus"], res
    assert expected["reasons"] and res["drift"] == [f"GPU health: {'; '.join(expected['reasons'])}"]


def test_host_state_without_nvml_fails_when_a_gpu_is_required_and_skips_otherwise(monkeypatch):
    def unavailable():
        raise _nvml.NvmlUnavailable("libnvidia-ml.so.1 was not found")

    ok, res = host_state_call(monkeypatch, {"gpu_health": {"required": True}}, loader=unavailable)
    assert not ok and "NVML is not available: libnvidia-ml.so.1 was not found" in res["msg"], res
    assert "gpufleet_gpu_required=false" in res["msg"]
    ok, res = host_state_call(monkeypatch, {"gpu_health": {"required": False}}, loader=unavailable)
    assert ok and res["in_sync"] and res["gpu_health"]["status"] == "skipped", res


def test_host_state_returns_the_state_file_and_names_a_broken_one(monkeypatch, tmp_path):
    state = tmp_path / "state.json"
    ok, res = host_state_call(monkeypatch, {"state_path": str(state)})
    assert ok and res["last_run"] == {}, res
    state.write_text(json.dumps({"result": "upgraded", "run_id": "r1", "version": 1}))
    ok, res = host_state_call(monkeypatch, {"state_path": str(state)})
    assert ok and res["last_run"] == {"result": "upgraded", "run_id": "r1", "version": 1}
    # A record the collection cannot act on is the run record's drift, named with the fix, never a last run.
    state.write_text("{not json")
    ok, res = host_state_call(monkeypatch, {"state_path": str(state)})
    assert ok and not res["in_sync"] and res["last_run"] == {} and res["drifted"] == ["run record"], res
    assert str(state) in res["drift"][0] and "move it aside" in res["drift"][0], res


# ------------------------------------------------------------------------- the serving unit's processes, real pids


def test_the_main_pid_is_expanded_to_its_real_descendants_and_only_others_fail(tmp_path):
    import os
    import subprocess
    import sys

    # A real process tree: this test's process is the "launcher", a child of it the "scheduler" holding the GPU.
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        procs = [
            {"pid": child.pid, "usedGpuMemory": 120 * 2**30},
            {"pid": 1, "usedGpuMemory": 2**30},  # pid 1 is no descendant of this test
        ]
        overrides = {"nvmlDeviceGetComputeRunningProcesses": procs, "nvmlSystemGetProcessName": "python3"}
        result, _calls = run_fake({"server_main_pid": os.getpid()}, overrides)
    finally:
        child.kill()
        child.wait()
    assert child.pid in result["server"]["pids"] and os.getpid() in result["server"]["pids"]
    assert result["server"]["main_pid"] == os.getpid()
    assert [p["pid"] for p in result["server_processes"]] == [child.pid]
    assert [p["pid"] for p in result["foreign_processes"]] == [1]
    assert result["status"] == "unhealthy" and len(result["reasons"]) == 1
    assert "1 (python3, 1024 MiB)" in result["reasons"][0] and str(child.pid) not in result["reasons"][0]


def test_server_pids_alone_and_a_unit_that_does_not_run():
    procs = [{"pid": 3703, "usedGpuMemory": 2**30}]
    overrides = {"nvmlDeviceGetComputeRunningProcesses": procs, "nvmlSystemGetProcessName": "python3"}
    result, _calls = run_fake({"server_pids": [3703]}, overrides)
    assert result["healthy"] is True and result["server"]["pids"] == [3703]
    result, _calls = run_fake({"server_main_pid": 0}, overrides)
    assert result["healthy"] is False and result["server"]["pids"] == []
    assert "runs no process" in " ".join(result["notes"])
    result, _calls = run_fake({}, overrides)
    assert "server" not in result and "were not given" in result["reasons"][0]
