# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fleet gate: a batch's post-check runs against the fleet's pre-upgrade runs, median and MAD noise floor."""

from __future__ import annotations

import pytest

from ansible_collections.gpufleet.upgrade.plugins.filter.fleet_gate import fleet_gate
from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _fleet_gate as fg


def bench(*runs, concurrency=1):
    """A spec_decode_bench result as the module returns it, one level, these runs' output tok/s."""
    level = {"concurrency": concurrency, "output_tok_s": {"mean": sum(runs) / len(runs)}}
    level["runs"] = [{"output_tok_s": r} for r in runs]
    return {"bench": {"levels": [level], "speculative": True}}


def test_runs_are_read_per_concurrency_from_either_form():
    assert fg.runs_by_concurrency(bench(50, 52)) == {1: [50.0, 52.0]}
    assert fg.runs_by_concurrency(bench(50, 52)["bench"]) == {1: [50.0, 52.0]}
    no_runs = {"levels": [{"concurrency": 4, "output_tok_s": {"mean": 90.0}}]}
    assert fg.runs_by_concurrency(no_runs) == {4: [90.0]}
    assert fg.runs_by_concurrency(None) == {}


FLEET = {"n1": {1: [54.1, 54.1]}, "n2": {1: [54.1, 54.1]}, "n3": {1: [54.1, 54.1]}}


def test_a_batch_below_the_fleet_by_more_than_the_limit_fails_and_names_batch_figures_and_limit():
    verdict = fg.judge(2, ["n2"], {}, FLEET, {"n2": {1: [52.0, 52.0]}}, 3)
    assert not verdict["passed"]
    group = verdict["groups"][0]
    assert group["fleet_median"] == 54.1 and group["batch_median"] == 52.0 and group["change_pct"] == -3.88
    msg = verdict["message"]
    assert msg.startswith("fleet gate stopped the rollout after batch 2 (n2): ")
    assert "median output 52.0 tok/s at concurrency 1 (2 run(s) of 1 host(s): n2) is -3.9%" in msg
    assert "pre-upgrade median 54.1 tok/s (6 run(s) of 3 host(s), MAD 0.0 tok/s" in msg
    assert "the limit is -3%" in msg and "fix: " in msg


def test_a_batch_within_the_limit_or_faster_passes():
    assert fg.judge(2, ["n2"], {}, FLEET, {"n2": {1: [53.0, 53.2]}}, 3)["passed"]
    assert fg.judge(2, ["n2"], {}, FLEET, {"n2": {1: [96.1, 96.1]}}, 3)["passed"]


def test_one_slow_run_does_not_move_the_median():
    verdict = fg.judge(2, ["n2", "n3"], {}, FLEET, {"n2": {1: [54.0, 20.0]}, "n3": {1: [54.1, 54.0]}}, 3)
    assert verdict["passed"] and verdict["groups"][0]["batch_median"] == 54.0


def test_a_drop_within_the_fleets_own_noise_passes():
    noisy = {"n1": {1: [40.0, 60.0, 50.0]}, "n2": {1: [45.0, 55.0, 50.0]}}
    verdict = fg.judge(2, ["n3"], {}, noisy, {"n3": {1: [46.0, 46.0]}}, 3)
    group = verdict["groups"][0]
    assert group["change_pct"] == -8.0 and group["noise_floor_pct"] > 8.0 and verdict["passed"]


def test_groups_are_judged_apart():
    groups = {"a1": "a", "a2": "a", "b1": "b", "b2": "b"}
    fleet = {"a1": {1: [100.0, 100.0]}, "a2": {1: [100.0, 100.0]}, "b1": {1: [50.0, 50.0]}, "b2": {1: [50.0, 50.0]}}
    # 60 tok/s is far above group b's fleet, far below group a's
    verdict = fg.judge(1, ["a2", "b2"], groups, fleet, {"a2": {1: [60.0, 60.0]}, "b2": {1: [60.0, 60.0]}}, 5)
    assert [(g["group"], g["passed"]) for g in verdict["groups"]] == [("a", False), ("b", True)]
    assert "serving group a:" in verdict["message"] and "serving group b:" not in verdict["message"]


def test_not_judged_without_a_limit_shared_concurrency_or_enough_runs():
    assert fg.judge(1, ["n1"], {}, FLEET, {"n1": {1: [1.0, 1.0]}}, None)["skipped"]
    other = fg.judge(1, ["n1"], {}, FLEET, {"n1": {4: [1.0, 1.0]}}, 3)
    assert other["passed"] and other["skipped"] and "no concurrency" in other["groups"][0]["message"]
    single = fg.judge(1, ["n1"], {}, FLEET, {"n1": {1: [1.0]}}, 3)
    assert single["passed"] and "too few runs" in single["groups"][0]["message"]


def test_the_filter_gathers_the_fleets_runs_batch_by_batch_from_the_hosts_facts():
    hostvars = {
        "n1": {
            "grp": "g",
            "postcheck_baseline": bench(54.1, 54.1)["bench"],
            "postcheck_result": {"passed": True, "bench": bench(96.1, 96.1)},
        },
        "n2": {
            "grp": "g",
            "postcheck_baseline": bench(54.1, 54.1)["bench"],
            "postcheck_result": {"passed": True, "bench": bench(52.0, 52.0)},
        },
        # rolled back: its post-check failed, the failed-host budget answers for it
        "n3": {
            "grp": "g",
            "postcheck_baseline": bench(54.1, 54.1)["bench"],
            "postcheck_result": {"passed": False, "bench": bench(1.0, 1.0)},
        },
    }
    first = fleet_gate(["n1"], hostvars, "grp", 3, {}, 1)
    assert first["verdict"]["passed"] and set(first["fleet_runs"]) == {"n1"}
    second = fleet_gate(["n2", "n3"], hostvars, "grp", 3, first["fleet_runs"], 2)
    assert set(second["fleet_runs"]) == {"n1", "n2", "n3"}
    assert not second["verdict"]["passed"] and second["verdict"]["groups"][0]["hosts"] == ["n2"]


def test_the_filter_names_an_unreadable_limit():
    from ansible.errors import AnsibleFilterError

    with pytest.raises(AnsibleFilterError, match="fleet_max_regression_pct='x'"):
        fleet_gate(
            ["n1"],
            {"n1": {"postcheck_result": {"passed": True, "bench": bench(1, 1)}, "postcheck_baseline": bench(1, 1)}},
            "",
            "x",
            {},
            1,
        )
