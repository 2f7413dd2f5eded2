# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The build check build_targets and the per-SM settings (_smoke.py), judged on the raw worker output one H200
recorded for targets 9.0 and 12.0 (tests/data/device/h200-build-sm90-sm120.json, bench/sm120_readiness_device.py) and
on that output with one thing broken at a time."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _smoke, _smoke_worker

DATA = Path(__file__).resolve().parents[3] / "data" / "device"
RECORDED = json.loads((DATA / "h200-build-sm90-sm120.json").read_text())["result"]
BUILD = RECORDED["host_checks"]["build_targets"]
TORCH = RECORDED["torch"]
PER_SM = [  # stacks/cu130.yml postcheck.smoke.per_sm
    {"sm": "9.0", "prefill_backends": ["fa2", "fa3"], "expected_probes": ["is_sm90a_supported"]},
    {
        "sm": "12.0",
        "matmul_rel_err": 0.01,
        "attention_atol": 0.02,
        "attention_rel_err": 0.01,
        "min_cosine": 0.999,
        "prefill_backends": ["fa2"],
        "expected_probes": ["is_sm120a_supported"],
    },
]
PARAMS = {"required_packages": ["torch", "flashinfer"], "python": "/venv/bin/python", "tolerances": {}}


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("9.0", "9.0"),
        ("12.0", "12.0"),
        ("sm_90", "9.0"),
        ("sm_90a", "9.0"),
        ("sm_120", "12.0"),
        ("sm_120a", "12.0"),
        ("sm_100f", "10.0"),
        ("compute_120", "12.0"),
        ("SM_86", "8.6"),
        ("120", "12.0"),
        ("90", "9.0"),
        ((12, 0), "12.0"),
        ([9, 0], "9.0"),
        (" 8.9 ", "8.9"),
        ("9", None),
        ("sm_", None),
        ("12.0.1", None),
        ("hopper", None),
        (None, None),
    ],
)
def test_sm_key_spellings(value, expected):
    assert _smoke.sm_key(value) == expected


def test_names_variants_and_flashinfer_arch():
    assert _smoke.sm_name("12.0") == "sm_120" and _smoke.sm_name("12.0", "a") == "sm_120a"
    assert _smoke.arch_variants("12.0") == ["sm_120", "sm_120a"]
    assert _smoke.arch_variants("8.9") == ["sm_89"]  # no arch-specific variant before Hopper
    assert _smoke.flashinfer_arch("12.0") == "12.0a" and _smoke.flashinfer_arch("8.6") == "8.6"


def test_build_plan_joins_the_targets_and_the_host_sms_in_sm_order():
    devices = [{"index": 0, "sm": "sm_90"}, {"index": 1, "sm": "sm_90"}, {"index": 2, "sm": "sm_89"}]
    plan = _smoke.build_plan(["12.0", "sm_90", "9.0"], devices, PER_SM)
    assert [t["sm"] for t in plan] == ["8.9", "9.0", "12.0"]
    by_sm = {t["sm"]: t for t in plan}
    assert by_sm["9.0"]["host_gpus"] == [0, 1] and by_sm["9.0"]["run_index"] == 0
    assert by_sm["9.0"]["from_profile"] is True and by_sm["8.9"]["from_profile"] is False
    assert by_sm["12.0"]["run_index"] is None and by_sm["12.0"]["check"] == "build_sm_120"
    assert by_sm["9.0"]["prefill_backends"] == ["fa2", "fa3"] and by_sm["12.0"]["prefill_backends"] == ["fa2"]
    assert by_sm["8.9"]["variants"] == ["sm_89"] and by_sm["8.9"]["prefill_backends"] == ["fa2"]


def test_build_plan_refuses_a_target_that_is_no_sm():
    with pytest.raises(ValueError) as err:
        _smoke.build_plan(["9.0", "blackwell"], [])
    assert str(err.value) == "target SM 'blackwell' is not an SM such as '9.0' or '12.0'"


def test_per_sm_tolerances_win_for_their_sm_only():
    base = dict(_smoke.DEFAULT_TOLERANCES)
    per_sm = [{"sm": "12.0", "attention_atol": 0.05, "min_cosine": None}, {"sm": "9.0"}]
    assert _smoke.tolerances_for(base, per_sm, "12.0") == dict(base, attention_atol=0.05)
    assert _smoke.tolerances_for(base, per_sm, "9.0") == base
    assert _smoke.tolerances_for(base, per_sm, "8.0") == base
    assert _smoke.tolerances_for(None, per_sm, "12.0") == {"attention_atol": 0.05}


def test_prefill_backends_default_and_profile_override():
    assert _smoke.prefill_backends_for([], "9.0") == ["fa2", "fa3"]
    assert _smoke.prefill_backends_for([], "12.0") == ["fa2"]
    assert _smoke.prefill_backends_for([{"sm": "9.0", "prefill_backends": ["fa2"]}], "9.0") == ["fa2"]


def test_probes_expected_true_pass_and_anything_else_fails():
    gpu = {"index": 0, "uuid": "GPU-x", "sm": "sm_120"}
    raw = {"flashinfer_probes": {"is_sm120a_supported": True, "is_sm90a_supported": False}}
    assert _smoke.judge_probes(raw, gpu, ["is_sm120a_supported"])["status"] == "passed"
    assert _smoke.judge_probes(raw, gpu, [])["status"] == "info"
    failed = _smoke.judge_probes(raw, gpu, ["is_sm90a_supported", "is_sm12x_supported"])
    assert failed["status"] == "failed"
    assert "is_sm90a_supported = False, is_sm12x_supported = absent, the profile expects true" in failed["message"]
    unread = _smoke.judge_probes({"flashinfer": "not installed (x)"}, gpu, ["is_sm120a_supported"])
    assert unread["status"] == "failed" and "probes were not read (not installed (x))" in unread["message"]


def test_target_env_builds_for_one_arch_into_a_scratch_workspace_and_strips_nothing():
    target = _smoke.build_plan(["12.0"], [])[0]
    env = _smoke.target_env({"FLASHINFER_DISABLE_JIT": "0", "CUDA_HOME": "/c"}, target, "/tmp/ws")
    assert env == {
        "FLASHINFER_DISABLE_JIT": "0",  # the server runs with it: so does the build check, which then fails naming it
        "CUDA_HOME": "/c",
        "FLASHINFER_CUDA_ARCH_LIST": "12.0a",
        "FLASHINFER_WORKSPACE_BASE": "/tmp/ws",
    }


def test_a_build_that_fails_names_what_in_the_serving_environment_turns_the_jit_off():
    target = _smoke.build_plan(["12.0"], [])[0]
    raw = {"status": "error", "error": "RuntimeError: JIT compilation is disabled"}
    flag = "FLASHINFER_DISABLE_JIT='0': flashinfer turns its JIT compiler off whenever the variable is set"
    got = _smoke.judge_build({target["check"]: raw}, [target], ["sm_120"], "13.0", {"env_flags": [flag]})
    assert got["status"] == "failed" and got["message"].endswith(f"; the serving environment sets {flag}")
    got = _smoke.judge_build({target["check"]: raw}, [target], ["sm_120"], "13.0", {})
    assert "serving environment" not in got["message"]


# ------------------------------------------------------------------------------ the recorded H200 run


def plan():
    return _smoke.build_plan(["9.0", "12.0"], TORCH["devices"], PER_SM)


def target(sm):
    return next(t for t in plan() if t["sm"] == sm)


def raw(sm):
    return copy.deepcopy(BUILD["targets"][sm]["raw"])


def judge(sm, got, arch_list=None, params=None):
    arch_list = TORCH["arch_list"] if arch_list is None else arch_list
    return _smoke.judge_build_target(got, target(sm), arch_list, "13.0", params or PARAMS)


def test_the_recorded_run_judged_again_gives_the_recorded_verdict():
    again = _smoke.judge_build({t["check"]: raw(t["sm"]) for t in plan()}, plan(), TORCH["arch_list"], "13.0", PARAMS)
    assert again["status"] == BUILD["status"] == "passed"
    assert again["message"] == BUILD["message"]
    assert again["cannot_build"] == [] and again["run_on_host"] == ["9.0"]
    for sm in ("9.0", "12.0"):
        for key in ("built", "inspected", "ran", "run_on", "not_run_reason"):
            assert again["targets"][sm][key] == BUILD["targets"][sm][key], (sm, key)


def test_sm120_is_built_and_inspected_not_run():
    got = judge("12.0", raw("12.0"))
    assert got["status"] == "passed" and got["ran"] == [] and got["run_on"] is None
    assert got["built"]["nvcc"] == ["sm_120", "sm_120a"] and got["built"]["flashinfer_arch"] == "12.0a"
    assert got["built"]["flashinfer"] == ["batch_decode", "single_decode", "single_prefill_fa2"]
    assert "built and inspected, not run (no SM 12.0 GPU on this host)" in got["message"]
    assert got["not_run_reason"] == "no SM 12.0 GPU on this host"


def test_sm90_ran_on_the_h200():
    got = judge("9.0", raw("9.0"))
    assert got["status"] == "passed" and got["run_on"] == "GPU 0"
    assert got["ran"] == ["batch_decode", "single_decode", "single_prefill"]
    assert "single_prefill_fa3" in got["built"]["flashinfer"]


def test_a_missing_variant_fails():
    got = raw("12.0")
    del got["nvcc"]["sm_120a"]
    verdict = judge("12.0", got)
    assert verdict["status"] == "failed" and "nvcc cannot build sm_120a: not attempted" in verdict["message"]


def test_nvcc_refusing_a_variant_fails_with_its_error():
    got = raw("12.0")
    got["nvcc"]["sm_120a"] = {"rc": 1, "error": "nvcc fatal   : Unsupported gpu architecture 'compute_120a'"}
    verdict = judge("12.0", got)
    assert "nvcc cannot build sm_120a: nvcc fatal   : Unsupported gpu architecture 'compute_120a'" in verdict["message"]
    assert verdict["built"]["nvcc"] == ["sm_120"]


def test_no_sass_for_the_target_fails():
    got = raw("12.0")
    got["nvcc"]["sm_120"]["elf"] = {"images": ["sm_90"]}
    got["flashinfer"]["modules"]["single_decode"]["elf"] = {"images": []}
    verdict = judge("12.0", got)
    assert verdict["status"] == "failed"
    assert "cuobjdump finds no sm_120 SASS in nvcc's output (ELF images: ['sm_90'])" in verdict["message"]
    assert "cuobjdump finds no sm_120a SASS in flashinfer's single_decode" in verdict["message"]


def test_an_empty_disassembly_fails():
    got = raw("12.0")
    got["nvcc"]["sm_120a"]["sass"] = {"arches": ["sm_120a"], "functions": 1, "instructions": 0}
    assert "--dump-sass shows no sm_120a instructions" in judge("12.0", got)["message"]


def test_cuobjdump_that_cannot_read_a_file_fails_as_such():
    got = raw("12.0")
    got["flashinfer"]["modules"]["batch_decode"]["elf"] = {"images": [], "error": "cuobjdump --list-elf exited 1: x"}
    verdict = judge("12.0", got)
    assert "cuobjdump could not read flashinfer's batch_decode: cuobjdump --list-elf exited 1: x" in verdict["message"]


def test_no_cuobjdump_builds_but_reports_sass_not_inspected():
    got = raw("12.0")
    got["toolkit"]["cuobjdump"] = None
    for entry in got["nvcc"].values():
        entry["elf"], entry["sass"] = None, {"skipped": "no cuobjdump in the toolkit or on PATH"}
    for mod in got["flashinfer"]["modules"].values():
        mod["elf"] = None
    verdict = judge("12.0", got)
    assert verdict["status"] == "passed" and verdict["inspected"] == []
    assert "SASS not inspected (no cuobjdump in the toolkit: add the cuda_cuobjdump component)" in verdict["message"]
    assert "built, not run (no SM 12.0 GPU on this host)" in verdict["message"]


def test_torch_without_sm120_fails():
    verdict = judge("12.0", raw("12.0"), arch_list=["sm_80", "sm_90"])
    assert verdict["status"] == "failed"
    assert "torch.cuda.get_arch_list() ['sm_80', 'sm_90'] lacks sm_120" in verdict["message"]


def test_another_nvcc_release_fails_naming_the_fix():
    got = raw("12.0")
    got["toolkit"]["nvcc_release"] = "12.8"
    verdict = judge("12.0", got)
    assert "is release 12.8, the profile targets 13.0; set CUDA_HOME to the CUDA 13.0 toolkit" in verdict["message"]


def test_no_nvcc_fails():
    got = raw("12.0")
    got["toolkit"]["nvcc"], got["nvcc"] = None, {}
    verdict = judge("12.0", got)
    assert "no nvcc found (CUDA_HOME='/usr/local/cuda')" in verdict["message"]


def test_a_flashinfer_module_that_does_not_build_fails():
    got = raw("12.0")
    got["flashinfer"]["modules"]["single_prefill_fa2"].update(built=False, error="ninja: build stopped")
    verdict = judge("12.0", got)
    assert "flashinfer's JIT cannot build single_prefill_fa2 for 12.0a: ninja: build stopped" in verdict["message"]


def test_flashinfer_missing_fails_when_required_and_is_noted_when_not():
    got = raw("12.0")
    got["flashinfer"] = {"status": "missing_package", "package": "flashinfer", "error": "No module named 'flashinfer'"}
    assert "the profile requires it" in judge("12.0", got)["message"]
    relaxed = judge("12.0", got, params=dict(PARAMS, required_packages=["torch"]))
    assert relaxed["status"] == "passed"
    assert "no flashinfer module built (flashinfer is not installed and not required)" in relaxed["message"]


def test_a_worker_that_timed_out_fails():
    verdict = judge("9.0", {"status": "timeout", "error": "did not finish within 240 s; killed"})
    assert verdict["status"] == "failed" and "the build worker: did not finish within 240 s" in verdict["message"]


def test_a_wrong_kernel_in_the_run_fails():
    got = raw("9.0")
    got["run"]["flashinfer_single_decode"]["max_abs_err"] = 0.5
    verdict = judge("9.0", got)
    assert verdict["status"] == "failed"
    assert (
        "freshly built, GPU 0 (GPU-9066212b-b3b6-5f78-f4d6-98b32d5f5ce0): flashinfer_single_decode:"
        in (verdict["message"])
    )


def test_per_sm_tolerances_reach_the_run():
    got = raw("9.0")
    got["run"]["flashinfer_batch_decode"]["max_abs_err"] = 0.03  # above 0.02, inside 0.05
    targets = {t["check"]: raw(t["sm"]) for t in plan()}
    targets["build_sm_90"] = got
    loose = [{"sm": "9.0", "attention_atol": 0.05}]
    params = dict(PARAMS, tolerances=dict(_smoke.DEFAULT_TOLERANCES))
    assert _smoke.judge_build(targets, plan(), TORCH["arch_list"], "13.0", params, loose)["status"] == "passed"
    assert _smoke.judge_build(targets, plan(), TORCH["arch_list"], "13.0", params, [])["status"] == "failed"


def test_a_host_gpu_without_a_run_fails():
    got = raw("9.0")
    del got["run"]
    assert "the freshly built kernels did not run on GPU 0" in judge("9.0", got)["message"]
    got["run"] = {"index": 0, "not_run": "modules that did not build: single_prefill_fa3"}
    assert "not run on GPU 0: modules that did not build: single_prefill_fa3" in judge("9.0", got)["message"]


def test_extra_modules_the_run_compiled_are_named():
    got = raw("9.0")
    got["run"]["extra_modules"] = ["page"]
    assert "(the run also compiled page)" in judge("9.0", got)["message"]


def test_judge_build_names_every_target_that_fails():
    results = {"build_sm_90": raw("9.0")}  # nothing reported for 12.0
    verdict = _smoke.judge_build(results, plan(), TORCH["arch_list"], "13.0", PARAMS)
    assert verdict["status"] == "failed" and verdict["cannot_build"] == ["12.0"]
    assert (
        "SM 12.0: the stack cannot build or run kernels for it: the build worker: the build worker reported"
        in (verdict["message"])
    )


# ------------------------------------------------------------------------------ the worker's cuobjdump readers


def test_parse_list_elf_and_sass():
    listing = "ELF file    1: gpufleet_axpy.1.sm_120a.cubin\nELF file    2: x.2.sm_90.cubin\nnoise\n"
    assert _smoke_worker.parse_list_elf(listing) == ["sm_120a", "sm_90"]
    sass = "\n".join(
        [
            "\tcode for sm_120a",
            "\t\tFunction : gpufleet_axpy",
            '\t.headerflags\t@"EF_CUDA_VIRTUAL_SM(EF_CUDA_SM120)"',
            "        /*0000*/                   LDC R1, c[0x0][0x37c] ;",
            "        /*0010*/                   S2R R0, SR_TID.X ;",
            "  arch = sm_120a",
        ]
    )
    assert _smoke_worker.parse_sass(sass) == {"arches": ["sm_120a"], "functions": 1, "instructions": 2}
