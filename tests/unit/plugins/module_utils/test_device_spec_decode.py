# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The device runs beside the GPU-resident stand-in, replayed: the gates judge their records again.

The device machine lent an H100 for these runs (the H200 was not to be had): files ``h100-*`` under tests/data/device.

- ``*-spec-decode-gate.json`` (bench/spec_decode_device.py): every benchmark run against the stand-in in GPU mode
  (headline numbers per concurrency level): A/A pairs on one server and across restarts, runs without speculation,
  runs with a draft slowed on purpose. The gates of _bench judge them again here, at the profile's thresholds.
- ``*-nvml-server.json`` / ``*-nvml-server-foreign.json``: the NVML answers while the stand-in served (its launcher
  and one worker per GPU), alone and with a foreign torch process beside it, with every process's /proc/<pid>/stat
  line; the server's processes are rebuilt from its main pid by _proc.process_tree on a fake /proc.
- ``*-postcheck-beside-server.json`` / ``*-postcheck-foreign.json`` (bench/smoke_device.py --beside-server): the
  post-check's results beside the server and with a foreign process; ``*-audit-*.json``: host_state's verdicts (the
  audit's gpus item) on the same machine; ``*-beside-server-summary.json``: wall times and the smoke test's memory.
"""

from __future__ import annotations

import importlib.util
import json
import statistics
from pathlib import Path

import pytest
import yaml

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _bench, _nvml, _proc
from ansible_collections.gpufleet.upgrade.plugins.module_utils import _host_model as hm

ROOT = Path(__file__).resolve().parents[4]
DATA = ROOT / "tests" / "data" / "device"
_spec = importlib.util.spec_from_file_location("nvml_fake", DATA / "nvml_fake.py")
fake = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fake)

MACHINE = "h100"
GATE = json.loads((DATA / f"{MACHINE}-spec-decode-gate.json").read_text())
PROFILE = yaml.safe_load((ROOT / "stacks" / "cu130.yml").read_text())
HEALTH = PROFILE["postcheck"]["health"]
LIMIT = PROFILE["postcheck"]["bench"]["max_regression_pct"]
MINIMUM = PROFILE["postcheck"]["bench"]["min_spec_speedup"]
PAIRS = GATE["phases"]["aa"]["pairs"]
NOSPEC = GATE["phases"]["nospec"]["runs"]
SLOW = GATE["phases"]["slow"]["runs"]


def regression(limit):
    return [_bench.regression_gate(p["after"], p["before"], limit) for p in PAIRS]


def speculation(runs):
    return [_bench.spec_gate(run, NOSPEC[i % len(NOSPEC)], MINIMUM) for i, run in enumerate(runs)]


# ------------------------------------------------------------------------------------------ the benchmark gates


def test_the_run_used_the_profiles_thresholds_and_enough_runs():
    assert (GATE["max_regression_pct"], GATE["min_spec_speedup"]) == (LIMIT, MINIMUM)
    assert sum(not p["restart"] for p in PAIRS) >= 20
    assert len(SLOW) >= 10
    assert GATE["nvidia_smi"].startswith("NVIDIA H100")


def test_aa_false_alarms_at_the_profiles_threshold_are_those_recorded():
    gates = regression(LIMIT)
    assert sum(not g["passed"] for g in gates) == GATE["figures"]["aa_false_alarms"]
    assert len(gates) == GATE["figures"]["aa_pairs"]


def test_the_regression_gate_bites_on_this_data_below_the_noise():
    """A limit under the largest A/A change raises alarms on the same records: the gate judges, it is not idle."""
    changes = [abs(c["change_pct"]) for g in regression(LIMIT) for c in g["checks"]]
    assert max(changes) == pytest.approx(GATE["figures"]["aa_abs_change_pct_max"])
    assert sum(not g["passed"] for g in regression(max(changes) / 2)) >= 1
    assert all(g["passed"] for g in regression(max(changes) * 1.01))


def test_a_healthy_draft_passes_the_speculation_gate_and_a_slowed_one_is_caught_as_recorded():
    healthy = speculation([p["before"] for p in PAIRS if not p["restart"]])
    assert sum(not g["passed"] for g in healthy) == GATE["figures"]["healthy_spec_gate_failures"]
    slow = speculation(SLOW)
    assert sum(not g["passed"] for g in slow) == GATE["figures"]["slow_caught"]
    speedups = [c["speedup"] for g in slow for c in g["checks"]]
    assert statistics.fmean(speedups) < MINIMUM <= min(c["speedup"] for g in healthy for c in g["checks"])


def test_accept_length_is_the_stacks_deterministic_one():
    """The stand-in's accept length is a function of its configuration: only the time came from the GPU."""
    lengths = {round(r["accept_length"], 6) for p in PAIRS for r in (p["before"], p["after"])}
    assert len(lengths) == 1
    assert all(r["accept_length"] is None for r in NOSPEC)


# ------------------------------------------------------------------------------------------ the NVML gate


def fake_proc(tmp_path, stat_lines):
    for pid, line in stat_lines.items():
        (tmp_path / pid).mkdir()
        (tmp_path / pid / "stat").write_text(line + "\n")
    return tmp_path


def replay(name, tmp_path, give_server=True):
    recording = json.loads((DATA / f"{MACHINE}-{name}").read_text())
    root = fake_proc(tmp_path, recording["proc_stat"])
    pids = _proc.process_tree(recording["server_main_pid"], str(root)) if give_server else None
    result, facts = _nvml.host_health(lambda: fake.FakeNVML(recording), True, HEALTH, None, pids)
    return recording, pids, result


def test_the_servers_own_processes_pass_the_gate_and_are_listed_as_its_own(tmp_path):
    recording, pids, result = replay("nvml-server.json", tmp_path)
    workers = {p["pid"] for gpu in recording["facts"]["gpus"] for p in gpu["processes"]}
    assert workers and workers <= pids
    assert recording["server_main_pid"] in pids
    assert result["healthy"] is True, result["reasons"]
    assert {p["pid"] for p in result["server_processes"]} == workers
    assert result["foreign_processes"] == []


def test_without_the_servers_pids_its_processes_count_as_foreign(tmp_path):
    _recording, _pids, result = replay("nvml-server.json", tmp_path, give_server=False)
    assert result["healthy"] is False
    assert "were not given" in result["reasons"][0]


def test_a_foreign_process_beside_the_server_fails_the_gate_naming_it(tmp_path):
    recording, pids, result = replay("nvml-server-foreign.json", tmp_path)
    foreign = recording["foreign_pid"]
    assert foreign not in pids
    assert result["healthy"] is False
    assert [p["pid"] for p in result["foreign_processes"]] == [foreign]
    assert f"{foreign} (" in " ".join(result["reasons"])
    assert result["server_processes"]


# ---------------------------------------------------------------------------------------- the post-check and the audit


def load(name):
    return json.loads((DATA / f"{MACHINE}-{name}").read_text())


@pytest.mark.parametrize(
    ("run", "healthy"), [("postcheck-beside-server.json", True), ("postcheck-foreign.json", False)]
)
def test_the_postchecks_gpu_gate_judges_its_recorded_facts_again_the_same(run, healthy):
    result = load(run)
    nvml = result["nvml"]
    assert nvml["server"]["source"] == "server_main_pid"
    verdict = _nvml.judge_host({"gpus": nvml["gpus"], "errors": {}}, HEALTH, None, set(nvml["server"]["pids"]))
    assert verdict["healthy"] is healthy is (result["gates"]["gpu_health"]["status"] == "passed")
    assert verdict["reasons"] == result["gates"]["gpu_health"]["reasons"]
    assert verdict["server_processes"] == nvml["server_processes"]
    assert {p["pid"] for p in verdict["server_processes"]} <= set(nvml["server"]["pids"])
    # the smoke test and the benchmark passed beside the server either way: only the foreign process fails the host
    assert {k: g["status"] for k, g in result["gates"].items() if k != "gpu_health"} == {
        "smoke": "passed",
        "bench": "passed",
    }
    assert result["passed"] is healthy


def test_the_foreign_process_is_named_with_its_pid_and_the_server_keeps_its_own():
    result, summary = load("postcheck-foreign.json"), load("beside-server-summary.json")
    foreign = summary["foreign_pid"]
    assert [p["pid"] for p in result["nvml"]["foreign_processes"]] == [foreign]
    assert f"{foreign} (" in result["failures"][0]
    workers = {w["pid"] for w in summary["server"]["gpu"]}
    assert {p["pid"] for p in result["nvml"]["server_processes"]} == workers


@pytest.mark.parametrize(("run", "ok"), [("audit-beside-server.json", True), ("audit-foreign.json", False)])
def test_the_audits_gpus_item_says_what_the_postcheck_says(run, ok):
    audit = load(run)
    item = next(i for i in audit["items"] if i["item"] == "gpus")
    assert item == hm.gpu_item(audit["gpu_health"])
    assert item["ok"] is ok
    postcheck = load("postcheck-beside-server.json" if ok else "postcheck-foreign.json")
    assert audit["gpu_health"]["reasons"] == postcheck["gates"]["gpu_health"]["reasons"]
    assert [p["pid"] for p in audit["gpu_health"]["server_processes"]] == [
        p["pid"] for p in postcheck["nvml"]["server_processes"]
    ]


def test_the_smoke_test_fit_beside_the_server_with_its_peak_recorded():
    summary = load("beside-server-summary.json")
    for run in summary["runs"]:
        memory = run["smoke_memory"]
        per_check = run["smoke_memory_per_check"]
        assert memory["peak_reserved_mib"] == max(m["peak_reserved_mib"] for m in per_check.values())
        # every check found room beside the server (and the foreign process): none ran out of memory
        assert all(m["free_before_mib"] > m["peak_reserved_mib"] for m in per_check.values())
        assert run["gates"]["smoke"] == "passed"


# ---------------------------------------------------------------------------------------- a second machine, same code


def test_a_second_machine_gives_no_false_alarm_either_and_the_same_postcheck_verdicts():
    """run2: another H100 (its own GPU), A/A on one server only (the time budget ended it before the slowed draft)."""
    gate = load("run2-spec-decode-gate.json")
    pairs = gate["phases"]["aa"]["pairs"]
    gates = [_bench.regression_gate(p["after"], p["before"], LIMIT) for p in pairs]
    assert len(pairs) == gate["figures"]["aa_pairs"] >= 15
    assert sum(not g["passed"] for g in gates) == gate["figures"]["aa_false_alarms"]
    summary = load("run2-beside-server-summary.json")
    assert {r["run"]: r["passed"] for r in summary["runs"]} == {
        "beside-server": True,
        "beside-server-warm": True,
        "foreign": False,
    }
    assert summary["audit"]["foreign"]["foreign_processes"][0]["pid"] == summary["foreign_pid"]
    assert summary["audit"]["beside-server"]["gpus_item"]["ok"] is True
