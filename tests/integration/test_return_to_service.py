# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Time back to service on a one-node lab: the old stack's return recorded by a restart and its warm-up, then an
upgrade (drain stop) whose server JIT-compiles its kernels (the stand-in's lab mode, 1 s a kernel) until the
post-check's warm-up has met every shape; the report carries every edge against the figure from before."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.integration

# The stand-in loads 2 s before it binds, then compiles each kernel of a new shape in 1 s.
LAB_SERVER = {"LAB_SGLANG_LOAD_S": "2", "LAB_SGLANG_JIT_COMPILE_S": "1"}
RECORD = "/var/lib/gpufleet/serving-return.json"


@pytest.fixture(scope="module")
def fleet(lab_fleet):
    return lab_fleet(1, name="it-return")


def read_record(node_exec, node):
    return json.loads(node_exec(node, ["cat", RECORD], check=True).stdout)


def test_the_upgrade_warms_the_server_and_reports_its_return_against_the_one_before(
    fleet, run_playbook, node_exec, tmp_path
):
    node = fleet.nodes[0]
    old = run_playbook(
        "tests/integration/playbooks/return_lab.yml",
        fleet.inventory,
        extravars={
            "gpufleet_stack_profile": "lab-cu128",
            "serving_env": LAB_SERVER,
            "gpufleet_controller_dir": str(tmp_path),
        },
    )
    assert old.rc == 0, old
    before = read_record(node_exec, node)
    assert before["until"] == "warm" and before["kernels_compiled"] >= 3
    assert before["edges"]["process_up"] < before["edges"]["health"]  # the 2 s load comes after the process started

    # The gate's limit set so low that any return fails it: the host must not undrain, and the run rolls it back.
    up = run_playbook(
        "playbooks/upgrade.yml",
        fleet.inventory,
        extravars={
            "gpufleet_stack_profile": "lab",
            "gpufleet_drain": "stop",
            "serving_env": LAB_SERVER,
            "postcheck_return_max_ratio": 0.01,
        },
    )
    assert up.rc != 0
    runs = fleet.inventory.parent / "controller" / "runs"
    report = json.loads(sorted(runs.glob("*/report.json"))[-1].read_text())
    host = report["hosts"][0]
    assert host["outcome_kind"] == "rolled_back"
    assert "post-check failed (1 problem(s))" in host["outcome"] and "the limit is 0.01x" in host["outcome"]
    ret = host["return"]
    assert [e["key"] for e in ret["edges"] if e["s"] is not None] == ["process_up", "health", "warm"]
    # the gate's figure from before: the old stack's own part, from its process's start
    assert ret["before_s"] == round(before["total_s"] - before["edges"]["process_up"], 1)
    assert ret["ratio"] == round(ret["server_s"] / ret["before_s"], 2)
    # the first pass compiled the new stack's kernels (1 s each), the second compiled nothing
    assert ret["kernels_compiled"] >= 3 and ret["compiled_after_warmup"] == [] and ret["passes"] == 2
    assert ret["edges"][2]["s"] >= ret["kernels_compiled"] * 1.0
    gates = {g["name"]: g for g in host["gates"]}
    assert gates["postcheck.warmup"]["status"] == "passed"
    assert gates["postcheck.return"]["status"] == "failed"
    assert f"recorded before ({before['recorded_at']})" in gates["postcheck.return"]["message"]
    junit = (runs / report["run_id"] / "junit.xml").read_text()
    assert '<property name="return_to_service_s"' in junit
