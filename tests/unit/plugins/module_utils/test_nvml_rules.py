# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""NVML facts and health rules, driven by the answers a real H200 gave (tests/data/device/h200-nvml-record.json)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pynvml
import pytest

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _nvml

DATA = Path(__file__).resolve().parents[3] / "data" / "device"
_spec = importlib.util.spec_from_file_location("nvml_fake", DATA / "nvml_fake.py")
fake = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fake)

RECORDING = fake.load()
PROFILE_HEALTH = {  # stacks/cu130.yml postcheck.health
    "max_uncorrectable_ecc": 0,
    "max_pending_row_remaps": 0,
    "allow_row_remap_failure": False,
    "allow_pcie_downgrade": False,
    "max_temperature_c": 87,
    "forbid_processes": True,
    "fail_on_clock_events": ["hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "sw_thermal_slowdown"],
}


def facts(overrides=None, recording=RECORDING):
    return _nvml.collect(fake.FakeNVML(recording, overrides))


def gpu0(overrides=None, thresholds=None):
    verdict = _nvml.judge_host(facts(overrides), thresholds or PROFILE_HEALTH)
    return verdict["gpus"][0], verdict


# ------------------------------------------------------------------------------------- the real H200's answers


def test_replayed_recording_gives_the_facts_recorded_on_the_gpu():
    assert facts() == RECORDING["facts"]


def test_real_h200_facts():
    f = facts()
    assert f["driver_version"] == "580.159.04"
    assert f["cuda_driver_version"] == "13.0"
    gpu = f["gpus"][0]
    assert gpu["name"] == "NVIDIA H200"
    assert gpu["uuid"].startswith("GPU-")
    assert gpu["compute_capability"] == "9.0"
    assert gpu["memory"]["total_mib"] == 143771
    assert gpu["pcie"] == {
        "gen_current": 5,
        "gen_max": 5,
        "gen_gpu_max": 5,
        "width_current": 16,
        "width_max": 16,
        "replay_counter": 0,
    }
    # what the H200 in a one-GPU VM does not support
    assert gpu["retired_pages"] == _nvml.NOT_SUPPORTED
    assert gpu["nvlink"] == _nvml.NOT_SUPPORTED
    assert gpu["clock_event_reasons"] == ["gpu_idle"]


def test_real_h200_is_healthy_against_the_cu130_profile():
    gpu, verdict = gpu0()
    assert verdict["healthy"] is True, verdict["reasons"]
    assert gpu["healthy"] is True
    assert verdict["reasons"] == [] and verdict["notes"] == []


def test_recorded_module_result_agrees_with_the_rules():
    """The nvml section the role wrote on the device, judged again here, gives the same verdict."""
    result = json.loads((DATA / "h200-postcheck-warm.json").read_text())["nvml"]
    for gpu in result["gpus"]:
        bare = {k: v for k, v in gpu.items() if k not in ("healthy", "reasons", "notes")}
        assert _nvml.judge_gpu(bare, PROFILE_HEALTH)["healthy"] is gpu["healthy"]
    assert result["status"] == "healthy"


# -------------------------------------------------------------------------------------------- NotSupported paths

NS = fake.Err(fake.NOT_SUPPORTED)
# every per-GPU call collect() makes -> the field it fills
FIELD_OF = {
    "nvmlDeviceGetName": ("name",),
    "nvmlDeviceGetUUID": ("uuid",),
    "nvmlDeviceGetPciInfo": ("pci_bus_id",),
    "nvmlDeviceGetCudaComputeCapability": ("compute_capability",),
    "nvmlDeviceGetMemoryInfo": ("memory",),
    "nvmlDeviceGetPersistenceMode": ("persistence_mode",),
    "nvmlDeviceGetPerformanceState": ("performance_state",),
    "nvmlDeviceGetEccMode": ("ecc_mode",),
    "nvmlDeviceGetTotalEccErrors": ("ecc_errors", "aggregate", "uncorrected"),
    "nvmlDeviceGetRemappedRows": ("remapped_rows",),
    "nvmlDeviceGetRetiredPages": ("retired_pages",),
    "nvmlDeviceGetCurrPcieLinkGeneration": ("pcie", "gen_current"),
    "nvmlDeviceGetMaxPcieLinkGeneration": ("pcie", "gen_max"),
    "nvmlDeviceGetGpuMaxPcieLinkGeneration": ("pcie", "gen_gpu_max"),
    "nvmlDeviceGetCurrPcieLinkWidth": ("pcie", "width_current"),
    "nvmlDeviceGetMaxPcieLinkWidth": ("pcie", "width_max"),
    "nvmlDeviceGetPcieReplayCounter": ("pcie", "replay_counter"),
    "nvmlDeviceGetNvLinkState": ("nvlink",),
    "nvmlDeviceGetCurrentClocksEventReasons": ("clock_event_reasons",),
    "nvmlDeviceGetTemperature": ("temperature_c",),
    "nvmlDeviceGetPowerUsage": ("power", "draw_w"),
    "nvmlDeviceGetEnforcedPowerLimit": ("power", "limit_w"),
    "nvmlDeviceGetComputeRunningProcesses": ("processes",),
}


def test_every_recorded_device_call_is_covered():
    recorded = {c["fn"] for c in RECORDING["calls"] if c["args"][:1] == ["handle0"]}
    assert recorded == set(FIELD_OF)


def dig(obj, path):
    for part in path:
        obj = obj[part]
    return obj


@pytest.mark.parametrize("fn", sorted(FIELD_OF))
def test_not_supported_reads_not_supported_and_never_fails(fn):
    gpu, verdict = gpu0({fn: NS})
    assert dig(gpu, FIELD_OF[fn]) == _nvml.NOT_SUPPORTED
    assert gpu["errors"] == {}
    # no rule fails for a field the GPU cannot report
    assert verdict["healthy"] is True, verdict["reasons"]


def test_function_missing_from_an_old_driver_reads_not_supported():
    gpu, _verdict = gpu0({"nvmlDeviceGetCurrentClocksEventReasons": fake.Err(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)})
    assert gpu["clock_event_reasons"] == _nvml.NOT_SUPPORTED


def test_call_missing_from_an_old_nvidia_ml_py_reads_not_supported():
    class OldPynvml(fake.FakeNVML):
        def __getattr__(self, name):
            if name == "nvmlDeviceGetGpuMaxPcieLinkGeneration":
                raise AttributeError(name)
            return super().__getattr__(name)

    gpu = _nvml.collect(OldPynvml(RECORDING))["gpus"][0]
    assert gpu["pcie"]["gen_gpu_max"] == _nvml.NOT_SUPPORTED


def test_other_nvml_errors_are_noted_not_fatal():
    gpu, verdict = gpu0({"nvmlDeviceGetTemperature": fake.Err(fake.UNKNOWN)})
    assert gpu["temperature_c"] is None
    assert gpu["errors"]["temperature_c"]["code"] == fake.UNKNOWN
    assert verdict["healthy"] is True
    assert any("could not read temperature_c" in n for n in verdict["notes"])


def test_gpu_lost_makes_the_gpu_unhealthy():
    gpu, verdict = gpu0({"nvmlDeviceGetHandleByIndex": fake.Err(fake.GPU_IS_LOST)})
    assert gpu["lost"] is True and gpu["healthy"] is False
    assert "fallen off the bus" in verdict["reasons"][0]
    assert "GPU 0" in verdict["reasons"][0]


def test_system_call_error_makes_the_host_unhealthy():
    f = facts({"nvmlSystemGetDriverVersion": fake.Err(fake.UNKNOWN)})
    verdict = _nvml.judge_host(f, PROFILE_HEALTH)
    assert verdict["healthy"] is False
    assert "driver_version" in verdict["reasons"][0]


# --------------------------------------------------------------------------------------------------- each rule


def on_aggregate_uncorrected(value):
    return lambda args: value if args[1:] == [pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, 1] else fake.KEEP


def test_uncorrectable_ecc_above_threshold():
    gpu, verdict = gpu0({"nvmlDeviceGetTotalEccErrors": on_aggregate_uncorrected(2)})
    assert gpu["healthy"] is False
    reason = verdict["reasons"][0]
    assert "2 uncorrectable ECC errors (aggregate counter)" in reason
    assert "max_uncorrectable_ecc" in reason and gpu["uuid"] in reason
    gpu, _verdict = gpu0(
        {"nvmlDeviceGetTotalEccErrors": on_aggregate_uncorrected(2)}, dict(PROFILE_HEALTH, max_uncorrectable_ecc=2)
    )
    assert gpu["healthy"] is True


def test_corrected_ecc_is_not_a_gate():
    gpu, _verdict = gpu0({"nvmlDeviceGetTotalEccErrors": lambda a: 500 if a[1] == 0 else fake.KEEP})
    assert gpu["ecc_errors"]["volatile"]["corrected"] == 500
    assert gpu["healthy"] is True


def test_pending_row_remap():
    gpu, verdict = gpu0({"nvmlDeviceGetRemappedRows": [0, 1, 1, 0]})
    assert gpu["remapped_rows"]["pending"] is True
    assert gpu["healthy"] is False and "row remap is pending" in verdict["reasons"][0]
    gpu, _verdict = gpu0({"nvmlDeviceGetRemappedRows": [0, 1, 1, 0]}, dict(PROFILE_HEALTH, max_pending_row_remaps=1))
    assert gpu["healthy"] is True


def test_row_remap_failure():
    gpu, verdict = gpu0({"nvmlDeviceGetRemappedRows": [0, 0, 0, 1]})
    assert gpu["healthy"] is False and "needs replacing" in verdict["reasons"][0]
    gpu, _verdict = gpu0(
        {"nvmlDeviceGetRemappedRows": [0, 0, 0, 1]}, dict(PROFILE_HEALTH, allow_row_remap_failure=True)
    )
    assert gpu["healthy"] is True


def test_retired_pages_pending_on_a_gpu_that_retires_pages():
    overrides = {
        "nvmlDeviceGetRetiredPages": lambda args: [0x1000, 0x2000] if args[1] == 0 else [0x3000],
        "nvmlDeviceGetRetiredPagesPendingStatus": pynvml.NVML_FEATURE_ENABLED,
    }
    gpu, verdict = gpu0(overrides)
    assert gpu["retired_pages"] == {"single_bit_ecc": 2, "double_bit_ecc": 1, "pending": True}
    assert gpu["healthy"] is False and "retired pages are pending" in verdict["reasons"][0]


def test_pcie_narrower_than_its_maximum():
    gpu, verdict = gpu0({"nvmlDeviceGetCurrPcieLinkWidth": 8})
    assert gpu["healthy"] is False
    assert "x8, below its maximum x16" in verdict["reasons"][0]
    gpu, _verdict = gpu0({"nvmlDeviceGetCurrPcieLinkWidth": 8}, dict(PROFILE_HEALTH, allow_pcie_downgrade=True))
    assert gpu["healthy"] is True


def test_pcie_generation_below_maximum_fails_only_under_load():
    busy, verdict = gpu0({"nvmlDeviceGetCurrPcieLinkGeneration": 3})  # the recorded GPU is in P0
    assert busy["performance_state"] == "P0"
    assert busy["healthy"] is False and "gen 3 under load (P0)" in verdict["reasons"][0]
    idle, verdict = gpu0({"nvmlDeviceGetCurrPcieLinkGeneration": 1, "nvmlDeviceGetPerformanceState": 8})
    assert idle["healthy"] is True
    assert "idle power saving" in verdict["notes"][0]


@pytest.mark.parametrize(
    ("mask", "names", "healthy"),
    [
        (0x8, ["hw_slowdown"], False),
        (0x40 | 0x1, ["gpu_idle", "hw_thermal_slowdown"], False),
        (0x80, ["hw_power_brake_slowdown"], False),
        (0x20, ["sw_thermal_slowdown"], False),
        (0x4, ["sw_power_cap"], True),  # not in the profile's list
        (0x1, ["gpu_idle"], True),
        (0x1000, ["unknown_0x1000"], True),
    ],
)
def test_clock_event_reasons(mask, names, healthy):
    gpu, verdict = gpu0({"nvmlDeviceGetCurrentClocksEventReasons": mask})
    assert gpu["clock_event_reasons"] == names
    assert gpu["healthy"] is healthy
    if not healthy:
        assert "fail_on_clock_events" in verdict["reasons"][0]


def test_temperature_above_the_limit():
    gpu, verdict = gpu0({"nvmlDeviceGetTemperature": 91})
    assert gpu["healthy"] is False and "91 C is above 87 C" in verdict["reasons"][0]
    gpu, _verdict = gpu0({"nvmlDeviceGetTemperature": 87})
    assert gpu["healthy"] is True


def test_processes_on_a_host_that_should_be_drained():
    procs = [{"pid": 4242, "usedGpuMemory": 2 * 2**30}]
    overrides = {"nvmlDeviceGetComputeRunningProcesses": procs, "nvmlSystemGetProcessName": "python3"}
    gpu, verdict = gpu0(overrides)
    assert gpu["processes"] == [{"pid": 4242, "name": "python3", "used_mib": 2048}]
    assert gpu["healthy"] is False and "4242 (python3, 2048 MiB)" in verdict["reasons"][0]
    gpu, _verdict = gpu0(overrides, dict(PROFILE_HEALTH, forbid_processes=False))
    assert gpu["healthy"] is True


def test_process_that_ended_before_its_name_was_read():
    overrides = {
        "nvmlDeviceGetComputeRunningProcesses": [{"pid": 7, "usedGpuMemory": None}],
        "nvmlSystemGetProcessName": fake.Err(pynvml.NVML_ERROR_NOT_FOUND),
    }
    gpu, _verdict = gpu0(overrides)
    assert gpu["processes"] == [{"pid": 7, "name": None, "used_mib": None}]


def test_pending_ecc_mode_change_is_a_note():
    gpu, verdict = gpu0({"nvmlDeviceGetEccMode": [1, 0]})
    assert gpu["healthy"] is True
    assert "pending a GPU reset" in verdict["notes"][0]


def test_nvlink_states_are_counted():
    gpu, _verdict = gpu0(
        {"nvmlDeviceGetNvLinkState": lambda args: fake.Err(fake.NOT_SUPPORTED) if args[1] >= 18 else int(args[1] != 3)}
    )
    assert gpu["nvlink"] == {"links": 18, "active": 17, "inactive": 1}


def test_eight_gpus_one_faulty():
    recording = fake.replicate(RECORDING, 8)
    temps = {f"handle{i}": 35 for i in range(8)} | {"handle5": 95}
    f = facts({"nvmlDeviceGetTemperature": lambda args: temps[args[0]]}, recording=recording)
    verdict = _nvml.judge_host(f, PROFILE_HEALTH, expected_gpu_count=8)
    assert [g["healthy"] for g in verdict["gpus"]] == [True] * 5 + [False] + [True] * 2
    assert len({g["uuid"] for g in verdict["gpus"]}) == 8
    assert verdict["reasons"][0].startswith("GPU 5 (GPU-")


def test_expected_gpu_count():
    verdict = _nvml.judge_host(facts(), PROFILE_HEALTH, expected_gpu_count=8)
    assert verdict["healthy"] is False
    assert "NVML sees 1 GPU(s), 8 expected" in verdict["reasons"][0]


# ------------------------------------------------------------------------------------------------ no NVML at all


def test_init_without_the_library_on_this_machine():
    """This machine has nvidia-ml-py but no driver: the real pynvml must give a clear reason."""
    nvml = _nvml.load_pynvml()
    try:
        nvml.nvmlInit()
    except nvml.NVMLError:
        pass
    else:  # pragma: no cover - only on a machine with a driver
        nvml.nvmlShutdown()
        pytest.skip("this machine has an NVIDIA driver")
    with pytest.raises(_nvml.NvmlUnavailable, match=r"libnvidia-ml\.so\.1 was not found"):
        _nvml.init(nvml)


def test_init_with_the_driver_not_loaded():
    with pytest.raises(_nvml.NvmlUnavailable, match="driver is not loaded"):
        _nvml.init(fake.FakeNVML(RECORDING, {"nvmlInit": fake.Err(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)}))


def test_cuda_version_string():
    assert _nvml.cuda_version_string(13000) == "13.0"
    assert _nvml.cuda_version_string(13010) == "13.1"
    assert _nvml.cuda_version_string(12080) == "12.8"
    assert _nvml.cuda_version_string(_nvml.NOT_SUPPORTED) == _nvml.NOT_SUPPORTED


# ------------------------------------------------------------------ the serving unit's processes against foreign ones

SERVING = [  # a server beside the post-check: its launcher holds nothing, its scheduler 122 GB, and one stranger
    {"pid": 3703, "usedGpuMemory": 122 * 2**30},
    {"pid": 4242, "usedGpuMemory": 2 * 2**30},
]
NAMES = {3703: "sglang::scheduler_TP0", 4242: "python3"}


def serving_overrides(procs=None):
    procs = SERVING if procs is None else procs
    return {
        "nvmlDeviceGetComputeRunningProcesses": procs,
        "nvmlSystemGetProcessName": lambda args: NAMES.get(args[0], "python3"),
    }


def test_the_servers_processes_are_listed_as_such_and_a_foreign_one_fails_naming_pid_name_and_gpu():
    verdict = _nvml.judge_host(facts(serving_overrides()), PROFILE_HEALTH, server_pids={3700, 3703})
    gpu = verdict["gpus"][0]
    assert gpu["healthy"] is False
    assert verdict["server_processes"] == [{"pid": 3703, "name": "sglang::scheduler_TP0", "used_mib": 124928, "gpu": 0}]
    assert verdict["foreign_processes"] == [{"pid": 4242, "name": "python3", "used_mib": 2048, "gpu": 0}]
    assert len(verdict["reasons"]) == 1
    reason = verdict["reasons"][0]
    assert reason.startswith("GPU 0 (GPU-") and "not the serving unit's" in reason
    assert "4242 (python3, 2048 MiB)" in reason and "3703" not in reason
    assert any("serving unit's process(es) 3703 (sglang::scheduler_TP0, 124928 MiB)" in n for n in verdict["notes"])


def test_only_the_servers_processes_pass_whatever_memory_they_hold():
    verdict = _nvml.judge_host(facts(serving_overrides(SERVING[:1])), PROFILE_HEALTH, server_pids={3703})
    assert verdict["healthy"] is True and verdict["reasons"] == []
    assert verdict["foreign_processes"] == [] and [p["pid"] for p in verdict["server_processes"]] == [3703]


def test_forbid_processes_false_reports_a_foreign_process_as_a_note():
    verdict = _nvml.judge_host(
        facts(serving_overrides()), dict(PROFILE_HEALTH, forbid_processes=False), server_pids={3703}
    )
    assert verdict["healthy"] is True
    assert any("not the serving unit's: 4242 (python3, 2048 MiB)" in n for n in verdict["notes"])


def test_without_the_servers_pids_every_process_is_foreign_and_the_fix_names_the_main_pid():
    verdict = _nvml.judge_host(facts(serving_overrides()), PROFILE_HEALTH)
    assert verdict["server_processes"] == [] and len(verdict["foreign_processes"]) == 2
    assert "were not given" in verdict["reasons"][0] and "postcheck_server_main_pid" in verdict["reasons"][0]
    assert "3703 (sglang::scheduler_TP0" in verdict["reasons"][0]


def test_a_unit_that_runs_no_process_or_holds_no_gpu_is_a_note():
    verdict = _nvml.judge_host(facts(serving_overrides(SERVING[1:])), PROFILE_HEALTH, server_pids=set())
    assert verdict["healthy"] is False and "runs no process" in " ".join(verdict["notes"])
    verdict = _nvml.judge_host(facts(serving_overrides(SERVING[1:])), PROFILE_HEALTH, server_pids={77, 78})
    assert any("(77, 78) hold no GPU" in n for n in verdict["notes"])


def test_eight_gpus_each_with_its_tp_worker():
    recording = fake.replicate(RECORDING, 8)
    procs = {f"handle{i}": [{"pid": 5000 + i, "usedGpuMemory": 2**30}] for i in range(8)}
    procs["handle5"].append({"pid": 9999, "usedGpuMemory": 2**30})
    overrides = {
        "nvmlDeviceGetComputeRunningProcesses": lambda args: procs[args[0]],
        "nvmlSystemGetProcessName": "python3",
    }
    verdict = _nvml.judge_host(facts(overrides, recording), PROFILE_HEALTH, server_pids=set(range(5000, 5008)))
    assert [p["gpu"] for p in verdict["server_processes"]] == list(range(8))
    assert verdict["foreign_processes"] == [{"pid": 9999, "name": "python3", "used_mib": 1024, "gpu": 5}]
    assert [g["healthy"] for g in verdict["gpus"]] == [True] * 5 + [False] + [True] * 2
