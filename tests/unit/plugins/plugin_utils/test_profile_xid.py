"""Profile key postcheck.xid.fail_on: shipped in the GPU profiles, validated, read by role postcheck."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _profile as prof

ROOT = Path(__file__).resolve().parents[4]


@pytest.mark.parametrize("name", ["cu128", "cu130", "cu130-sglang0523", "lab"])
def test_profiles_list_the_bus_and_ecc_xids(name):
    profile = prof.load_profile(name=name)
    assert {48, 63, 64, 79, 94, 95} <= set(profile["postcheck"]["xid"]["fail_on"])


def test_a_bad_xid_list_is_refused_with_its_path():
    profile = copy.deepcopy(prof.load_profile(name="lab"))
    profile["postcheck"]["xid"] = {"fail_on": ["seventy-nine"]}
    assert any("postcheck.xid.fail_on" in e or "xid" in e for e in prof.validate(profile))


def test_role_postcheck_passes_the_list_to_nvml_info():
    defaults = yaml.safe_load((ROOT / "roles/postcheck/defaults/main.yml").read_text())
    assert "postcheck.xid.fail_on" in defaults["postcheck_xid_fail_on"]
    (task,) = [
        t
        for t in yaml.safe_load((ROOT / "roles/postcheck/tasks/nvml.yml").read_text())
        if "gpufleet.upgrade.nvml_info" in t
    ]
    assert "postcheck_xid_fail_on" in task["gpufleet.upgrade.nvml_info"]["xid"]


@pytest.mark.parametrize("name", ["cu130", "cu130-sglang0523"])
def test_gpu_profiles_hold_the_all_reduce_to_the_hosts_own_figure(name):
    assert prof.load_profile(name=name)["postcheck"]["smoke"]["allreduce_min_busbw_ratio"] == 0.8


def test_role_postcheck_records_the_sweep_before_and_compares_after():
    tasks = yaml.safe_load((ROOT / "roles/postcheck/tasks/baseline.yml").read_text())
    (before,) = [t for t in tasks if "gpufleet.upgrade.gpu_smoke_test" in t]
    assert (
        before["gpufleet.upgrade.gpu_smoke_test"]["allreduce_record_path"]
        == "{{ postcheck_smoke_allreduce_baseline_path }}"
    )
    (after,) = [
        t
        for t in yaml.safe_load((ROOT / "roles/postcheck/tasks/smoke.yml").read_text())
        if "gpufleet.upgrade.gpu_smoke_test" in t
    ]
    args = after["gpufleet.upgrade.gpu_smoke_test"]
    assert args["allreduce_baseline"] == "{{ postcheck_smoke_allreduce_baseline_path }}"
    assert "postcheck_smoke_allreduce_min_busbw_ratio" in args["allreduce_min_busbw_ratio"]
    assert args["dcgm_level"] == "{{ postcheck_smoke_dcgm_level | int }}"
