# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fleet gate stops a lab rollout that every host's own gate lets through.

Three lab hosts, batches of one. Every host's old stack serves the stand-in's old rate (54.1 tok/s with
speculation). Each host's own gate is set wide (max_regression_pct 30, as for hosts whose single runs are noisy, like
this loaded lab's); host 2's new stack is set to 40 tok/s: about 26 % below its own baseline, within its own gate, but
far beyond the fleet gate's limit (the lab profile's fleet_max_regression_pct 3) and the fleet's noise (the lab's
runs differ by a few tok/s). Host 1 upgrades, host 2 upgrades and passes its post-check, then the fleet gate stops
the rollout: host 3 is not started, its report naming the batch, the figures and the limit.
"""

from __future__ import annotations

import json

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SLOW = {"LAB_SGLANG_SPEC_TOK_S": "40"}
# Each host's own gate, wide: the figure the rollout lets through host by host.
OWN_GATE = {"max_regression_pct": 30}


@pytest.fixture(scope="module")
def fleet(lab_fleet):
    return lab_fleet(3, name="fleet-gate")


def test_a_batch_slower_than_the_fleet_stops_the_rollout(fleet, run_playbook):
    first, slow, last = fleet.nodes
    # The stand-in reads its rates from the unit's environment (role serving's serving_env), here host 2's only.
    host_vars = fleet.inventory.parent / "host_vars"
    host_vars.mkdir(exist_ok=True)
    (host_vars / f"{slow}.yml").write_text(json.dumps({"serving_env": SLOW}) + "\n")
    try:
        result = run_playbook(
            "playbooks/upgrade.yml",
            fleet.inventory,
            # the lab inventory turns the benchmark off; both gates need it
            extravars={
                "gpufleet_batch_size": 1,
                "gpufleet_drain": "stop",
                "gpufleet_bench_enabled": True,
                "postcheck_bench_extra_args": OWN_GATE,
            },
        )
    finally:
        (host_vars / f"{slow}.yml").unlink()
    assert result.rc != 0, str(result)
    runs = fleet.inventory.parent / "controller" / "runs"
    report = json.loads(sorted(runs.glob("*/report.json"), key=lambda p: p.stat().st_mtime)[-1].read_text())
    hosts = {h["host"]: h for h in report["hosts"]}
    assert hosts[first]["outcome_kind"] == "upgraded", hosts[first]
    # host 2 passed its own gate: upgraded, not rolled back
    assert hosts[slow]["outcome_kind"] == "upgraded", hosts[slow]
    assert hosts[last]["outcome_kind"] == "not_started", hosts[last]
    why = hosts[last]["outcome"]
    print(why)
    assert f"fleet gate stopped the rollout after batch 2 ({slow})" in why
    assert f"1 host(s): {slow}) is -" in why and "pre-upgrade median" in why and "the limit is -3%" in why
    verdict = result.tasks("Judge the batch against the fleet's pre-upgrade benchmarks (fleet gate)")[-1].res
    gate = verdict["ansible_facts"]["__gpufleet_fleet_gate"]["verdict"]["groups"][0]
    assert gate["change_pct"] < -3 and -gate["change_pct"] > gate["noise_floor_pct"], gate
    own = [t.res for t in result.tasks("Benchmark speculative decoding on the serving unit", host=slow)][-1]
    assert next(g for g in own["gates"] if g["name"] == "regression")["passed"], own["gates"]
