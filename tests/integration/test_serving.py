# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Role serving on a lab node: take over the seed's unit, restart handler, health failures with the
unit's log, and the benchmark with and without speculation on the old stack (the 54.1 tok/s case)."""

from __future__ import annotations

import json
import time
import urllib.request

import pytest

pytestmark = pytest.mark.integration

OLD = {"gpufleet_stack_profile": "lab-cu128"}
SERVING = "tests/integration/playbooks/serving.yml"


@pytest.fixture(scope="module")
def fleet(lab_fleet):
    return lab_fleet(1, name="bench-it")


@pytest.fixture(scope="module")
def node(fleet):
    return fleet.nodes[0]


def server_info(fleet, node):
    url = f"http://127.0.0.1:{fleet.serving_port(node)}/get_server_info"
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.load(resp)


def test_role_takes_over_the_seed_unit(fleet, node, run_playbook, node_exec):
    result = run_playbook(SERVING, fleet.inventory, extravars=OLD)
    assert result.rc == 0, result
    written = result.task("Write the serving unit and its environment file", node)
    unit_path = "/etc/systemd/system/gpufleet-serving.service"
    assert written.res["written"] == [unit_path, "/etc/gpufleet/gpufleet-serving.env"]
    unit = node_exec(node, ["cat", "/etc/systemd/system/gpufleet-serving.service"]).stdout
    assert (
        "ExecStart=/opt/gpufleet/serving/current/bin/python -m lab_sglang --host 127.0.0.1 "
        f"--port {fleet.serving_port(node)} --model-path /srv/models/lab-model --speculative-algorithm EAGLE3 "
        "--speculative-draft-model-path /srv/models/lab-draft --speculative-num-steps 3 "
        "--speculative-eagle-topk 4 --speculative-num-draft-tokens 16\n"
    ) in unit
    env = node_exec(node, ["cat", "/etc/gpufleet/gpufleet-serving.env"]).stdout
    assert 'CUDA_HOME="/usr/local/cuda-12.8"' in env
    info = server_info(fleet, node)
    assert info["speculative_algorithm"] == "EAGLE3"
    assert info["version"] == "0.5.3"
    assert info["gpufleet_lab"]["cuda_home"] == "/usr/local/cuda-12.8"
    assert info["gpufleet_lab"]["sys_prefix_realpath"].endswith("/venvs/lab-cu128-seed")


def test_second_run_and_check_mode_change_nothing(fleet, node, run_playbook):
    pid = server_info(fleet, node)["gpufleet_lab"]["pid"]
    for check in (False, True):
        result = run_playbook(SERVING, fleet.inventory, extravars=OLD, check=check)
        assert result.rc == 0, result
        assert result.changed_tasks() == [], [t.task for t in result.changed_tasks()]
    assert server_info(fleet, node)["gpufleet_lab"]["pid"] == pid


def test_restart_topic_restarts_and_waits(fleet, node, run_playbook):
    pid = server_info(fleet, node)["gpufleet_lab"]["pid"]
    result = run_playbook("tests/integration/playbooks/serving_restart.yml", fleet.inventory, extravars=OLD)
    assert result.rc == 0, result
    assert result.task("Poll /health while the unit is alive", node).status == "ok"
    assert server_info(fleet, node)["gpufleet_lab"]["pid"] != pid


def test_benchmark_finds_speculation_a_net_loss_on_the_old_stack(fleet, node, run_playbook):
    result = run_playbook("tests/integration/playbooks/bench_lab.yml", fleet.inventory, extravars=OLD)
    assert result.rc != 0
    gated = result.task("Benchmark the serving unit and apply the gates", node)
    assert "speculative decoding is a net loss" in gated.msg
    spec, nospec = gated.res["bench"], result.task("Benchmark the server without speculation", node).res["bench"]
    assert nospec["speculative"] is False and spec["speculative"] is True
    assert spec["server"]["version"] == "0.5.3"
    # Old stack: 54.1 tok/s with EAGLE-3 vs 60 without; both measured end to end through SSH-run modules.
    assert 0.8 * 54.1 < spec["output_tok_s"] < 54.2
    assert 0.8 * 60.0 < nospec["output_tok_s"] < 60.1
    assert spec["output_tok_s"] < nospec["output_tok_s"]
    # The unit is back, with speculation, after the run without it.
    assert server_info(fleet, node)["speculative_algorithm"] == "EAGLE3"


def test_a_crashing_server_fails_fast_with_its_log(fleet, node, run_playbook):
    start = time.monotonic()
    result = run_playbook(
        SERVING, fleet.inventory, extravars={**OLD, "serving_env": {"LAB_SGLANG_FAULT": "exit_on_start"}}
    )
    elapsed = time.monotonic() - start
    assert result.rc != 0
    failure = result.task("Fail with the unit's state and log", node)
    assert "gpufleet-serving.service did not become healthy: unit gpufleet-serving.service is" in failure.msg
    assert "the scheduler died while loading /srv/models/lab-model" in failure.msg
    assert f"{node}:" in failure.msg
    assert elapsed < 60  # far below the profile's health timeout: the crash is seen, not waited out


def test_a_server_never_healthy_times_out(fleet, node, run_playbook):
    extravars = {**OLD, "serving_env": {"LAB_SGLANG_FAULT": "never_healthy"}, "serving_health_timeout_s": 3}
    result = run_playbook(SERVING, fleet.inventory, extravars=extravars)
    assert result.rc != 0
    msg = result.task("Fail with the unit's state and log", node).msg
    assert f"no 200 from http://127.0.0.1:{fleet.serving_port(node)}/health within 3s (last: HTTP 503)" in msg


def test_clean_profile_brings_the_unit_back(fleet, node, run_playbook):
    result = run_playbook(SERVING, fleet.inventory, extravars=OLD)
    assert result.rc == 0, result
    # The fault lived in the environment file only: the unit file is left alone.
    written = result.task("Write the serving unit and its environment file", node)
    assert written.res["written"] == ["/etc/gpufleet/gpufleet-serving.env"], written.res
    assert server_info(fleet, node)["gpufleet_lab"]["fault"] == "none"


NEW_SET = [
    "lab-torch==2.11.0+cu130",
    "lab-flashinfer-python==0.6.4",
    "lab-flashinfer-cubin==0.6.4",
    "lab-flashinfer-jit-cache==0.6.4+cu130",
    "lab-sgl-kernel==0.3.21+cu130",
    "lab-sglang==0.5.9",
]


def test_after_the_upgrade_both_gates_pass(fleet, node, run_playbook, node_exec, lab_mirrors):
    """Pre-upgrade baseline on the old venv, then a 0.5.9 venv behind `current` and the restart topic."""
    bench_lab = "tests/integration/playbooks/bench_lab.yml"
    result = run_playbook(bench_lab, fleet.inventory, extravars={**OLD, "bench_fail_on_gate": False})
    assert result.rc == 0, result
    node_exec(node, ["mkdir", "-p", "/var/lib/gpufleet/backups/it"], check=True)
    node_exec(
        node, ["cp", "/var/lib/gpufleet/results/bench.json", "/var/lib/gpufleet/backups/it/bench.json"], check=True
    )

    # What venv_rebuild does, by hand: a new venv, then the `current` link switched atomically.
    venv = "/opt/gpufleet/serving/venvs/bench-it-new"
    node_exec(node, ["python3", "-m", "venv", venv], check=True)
    index = lab_mirrors.urls["lab-main"]
    node_exec(
        node,
        [f"{venv}/bin/pip", "install", "-q", "--disable-pip-version-check", "--index-url", index, *NEW_SET],
        check=True,
    )
    node_exec(
        node,
        [
            "sh",
            "-c",
            "ln -sfn venvs/bench-it-new /opt/gpufleet/serving/.current.tmp && "
            "mv -T /opt/gpufleet/serving/.current.tmp /opt/gpufleet/serving/current",
        ],
        check=True,
    )
    result = run_playbook(
        "tests/integration/playbooks/serving_restart.yml", fleet.inventory, extravars={"gpufleet_stack_profile": "lab"}
    )
    assert result.rc == 0, result
    info = server_info(fleet, node)
    assert info["version"] == "0.5.9"
    assert info["gpufleet_lab"]["cuda_home"] == "/usr/local/cuda-13.0"
    assert info["gpufleet_lab"]["sys_prefix_realpath"] == venv

    result = run_playbook(
        bench_lab,
        fleet.inventory,
        extravars={"gpufleet_stack_profile": "lab", "bench_baseline_path": "/var/lib/gpufleet/backups/it/bench.json"},
    )
    assert result.rc == 0, result
    gated = result.task("Benchmark the serving unit and apply the gates", node).res
    gates = {g["name"]: g for g in gated["gates"]}
    assert gates["regression"]["passed"] and not gates["regression"]["skipped"]
    assert gates["regression"]["checks"][0]["change_pct"] > 50  # 54.1 -> 96.1 tok/s is +77.6 %
    assert gates["speculation"]["passed"] and gates["speculation"]["checks"][0]["speedup"] > 1.3
    assert 0.8 * 96.1 < gated["bench"]["output_tok_s"] < 96.2
