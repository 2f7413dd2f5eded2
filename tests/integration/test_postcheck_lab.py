# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Role postcheck on lab nodes (no GPU): GPU gates skipped, never faked; per-host results on node and controller;
a GPU demanded where there is none fails the host with its name and the fix."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.integration

PLAYBOOK = "tests/integration/playbooks/postcheck_lab.yml"


@pytest.fixture(scope="module")
def fleet(lab_fleet):
    return lab_fleet(2, name="it-postcheck")


def results_on_node(node_exec, node):
    out = node_exec(node, ["sh", "-c", "ls /var/lib/gpufleet/results/ 2>/dev/null || true"]).stdout
    return sorted(f for f in out.split() if f.startswith("postcheck-"))


def controller_results(ctl, node):
    return sorted((ctl / "results" / node).glob("postcheck-*.json"))


def test_gpu_gates_are_skipped_without_a_gpu(fleet, run_playbook, node_exec, tmp_path):
    result = run_playbook(
        PLAYBOOK, fleet.inventory, extravars={"gpufleet_stack_profile": "lab", "gpufleet_controller_dir": str(tmp_path)}
    )
    assert result.rc == 0, result
    for node in fleet.nodes:
        files = controller_results(tmp_path, node)
        assert len(files) == 1
        data = json.loads(files[0].read_text())
        assert data["host"] == node and data["passed"] is True and data["gpu_required"] is False
        assert data["gates"]["gpu_health"]["status"] == "skipped"
        assert data["gates"]["gpu_health"]["skipped_reason"].startswith("skipped: no GPU")
        assert data["gates"]["smoke"] == {"status": "skipped", "skipped_reason": "skipped: no GPU", "reasons": []}
        assert data["profile"]["name"] == "lab"
        # the same file is on the node
        assert files[0].name in results_on_node(node_exec, node)


def test_a_gpu_required_where_there_is_none_fails_the_host(fleet, run_playbook, node_exec, tmp_path):
    node = fleet.nodes[0]
    before = results_on_node(node_exec, node)
    extravars = {
        "gpufleet_stack_profile": "lab",
        "gpufleet_controller_dir": str(tmp_path),
        "gpufleet_gpu_required": True,
    }
    result = run_playbook(PLAYBOOK, fleet.inventory, extravars=extravars, limit=node)
    assert result.rc != 0
    failed = result.task("Fail the host when a post-check gate failed", node)
    assert failed.failed
    assert node in failed.msg and "NVML is not available" in failed.msg and "gpufleet_gpu_required=false" in failed.msg
    # the result was written before the gate failed the host
    data = json.loads(controller_results(tmp_path, node)[0].read_text())
    assert data["passed"] is False and data["gates"]["gpu_health"]["status"] == "failed"
    assert len(results_on_node(node_exec, node)) == len(before) + 1


def test_check_mode_writes_nothing_on_the_node(fleet, run_playbook, node_exec, tmp_path):
    node = fleet.nodes[1]
    before = results_on_node(node_exec, node)
    extravars = {"gpufleet_stack_profile": "lab", "gpufleet_controller_dir": str(tmp_path)}
    result = run_playbook(PLAYBOOK, fleet.inventory, extravars=extravars, limit=node, check=True)
    assert result.rc == 0, result
    assert results_on_node(node_exec, node) == before
    assert controller_results(tmp_path, node) == []


def test_benchmark_gate_runs_against_the_serving_unit(fleet, run_playbook, tmp_path):
    node = fleet.nodes[0]
    extravars = {
        "gpufleet_stack_profile": "lab",
        "gpufleet_controller_dir": str(tmp_path),
        "postcheck_bench_enabled": True,
    }
    result = run_playbook(PLAYBOOK, fleet.inventory, extravars=extravars, limit=node)
    bench = result.task("Benchmark speculative decoding on the serving unit", node)
    assert bench.res.get("bench"), bench.res
    data = json.loads(controller_results(tmp_path, node)[0].read_text())
    assert data["gates"]["bench"]["status"] in ("passed", "failed")
    # gates the benchmark could not judge (no baseline, no run without speculation) are named, not hidden
    assert "regression skipped: no baseline given" in data["gates"]["bench"]["notes"]
    assert data["bench"]["bench"] == bench.res["bench"]
    # the host fails exactly when the benchmark's own gates say so
    assert (result.rc == 0) is bench.res["passed"], data["gates"]["bench"]
