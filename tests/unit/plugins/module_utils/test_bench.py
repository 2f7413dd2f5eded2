"""Benchmark statistics and gates: exact values from hand-computed inputs."""

from __future__ import annotations

import copy

import pytest

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _bench as b
from ansible_collections.gpufleet.upgrade.plugins.module_utils._prompts_v1 import PROMPT_SET


def rec(tokens, verify=None, ttft=0.1, e2e=1.0, itl=(), prompt=10, ok=True, error=None):
    return {
        "ok": ok,
        "error": error,
        "prompt_tokens": prompt,
        "completion_tokens": tokens if ok else 0,
        "spec_verify_ct": verify,
        "ttft_s": ttft if ok else None,
        "e2e_s": e2e if ok else None,
        "itl_s": list(itl),
    }


def result(tok_s_by_level, speculative=True, sha="a" * 64, api="generate"):
    return {
        "schema": b.RESULT_SCHEMA,
        "api": api,
        "speculative": speculative,
        "prompt_set": {"name": "v1", "sha256": sha},
        "levels": [{"concurrency": c, "output_tok_s": {"mean": t}} for c, t in tok_s_by_level.items()],
    }


# -- percentiles and summaries -----------------------------------------------------------------
@pytest.mark.parametrize(
    ("values", "pct", "expected"),
    [
        ([1, 2, 3, 4], 50, 2.5),
        ([1, 2, 3, 4], 95, 3.85),
        ([1, 2, 3, 4], 99, 3.97),
        ([10], 99, 10.0),
        ([5, 1, 3], 0, 1.0),
        ([5, 1, 3], 100, 5.0),
        (list(range(1, 101)), 95, 95.05),
    ],
)
def test_percentile_interpolates_linearly(values, pct, expected):
    assert b.percentile(values, pct) == pytest.approx(expected, abs=1e-12)


def test_percentile_of_nothing_is_none():
    assert b.percentile([], 50) is None


def test_summarize_scales_and_skips_missing():
    s = b.summarize([0.010, None, 0.020, 0.030, 0.040], 1000.0)
    assert s["count"] == 4
    assert s["mean"] == pytest.approx(25.0)
    assert s["p50"] == pytest.approx(25.0)
    assert s["p95"] == pytest.approx(38.5)
    assert s["p99"] == pytest.approx(39.7)
    assert s["max"] == pytest.approx(40.0)


def test_summarize_empty_has_count_zero():
    assert b.summarize([]) == {"count": 0, "mean": None, "p50": None, "p95": None, "p99": None, "max": None}


def test_coefficient_of_variation_is_sample_stdev_over_mean():
    # mean 100, sample stdev of (90, 100, 110) is 10
    assert b.coefficient_of_variation([90, 100, 110]) == pytest.approx(0.1)
    assert b.coefficient_of_variation([100]) is None
    assert b.coefficient_of_variation([0, 0]) is None


# -- one request, one run ----------------------------------------------------------------------
def test_accept_length_and_tpot_of_a_request():
    r = rec(64, verify=22, ttft=0.1, e2e=0.73)
    assert b.accept_length(r) == pytest.approx(64 / 22)
    assert b.tpot_s(r) == pytest.approx(0.01)
    assert b.accept_length(rec(64)) is None
    assert b.tpot_s(rec(1)) is None
    assert b.accept_length(rec(0, verify=3, ok=False, error="x")) is None


def test_run_stats_exact():
    records = [
        rec(16, verify=6, ttft=0.02, e2e=0.17, itl=[0.03] * 5, prompt=20),
        rec(32, verify=11, ttft=0.04, e2e=0.35, itl=[0.031] * 10, prompt=40),
        rec(0, ok=False, error="HTTP 500 from http://x/generate: boom"),
    ]
    s = b.run_stats(records, wall_s=0.5)
    assert s["requests"] == 3
    assert s["completed"] == 2
    assert s["failed"] == 1
    assert s["output_tokens"] == 48
    assert s["input_tokens"] == 60
    assert s["output_tok_s"] == pytest.approx(96.0)
    assert s["request_throughput"] == pytest.approx(4.0)
    assert s["accept_length"] == pytest.approx(48 / 17)
    assert s["accept_length_per_request"]["mean"] == pytest.approx((16 / 6 + 32 / 11) / 2)
    assert s["ttft_ms"]["mean"] == pytest.approx(30.0)
    assert s["ttft_ms"]["p50"] == pytest.approx(30.0)
    assert s["itl_ms"]["count"] == 15
    assert s["itl_ms"]["mean"] == pytest.approx((5 * 30 + 10 * 31) / 15)
    assert s["e2e_ms"]["max"] == pytest.approx(350.0)
    assert s["tpot_ms"]["mean"] == pytest.approx(((0.15 / 15) + (0.31 / 31)) / 2 * 1000)
    assert s["errors"] == ["HTTP 500 from http://x/generate: boom"]


def test_run_without_speculation_has_no_accept_length():
    s = b.run_stats([rec(16), rec(16)], wall_s=1.0)
    assert s["accept_length"] is None
    assert s["accept_length_per_request"]["count"] == 0
    assert s["output_tok_s"] == pytest.approx(32.0)


def test_level_stats_averages_runs_and_pools_latencies():
    run1 = ([rec(60, verify=20, ttft=0.01), rec(60, verify=20, ttft=0.03)], 1.2)  # 100 tok/s
    run2 = ([rec(60, verify=30, ttft=0.02), rec(60, verify=30, ttft=0.04)], 1.5)  # 80 tok/s
    lv = b.level_stats(2, [run1, run2])
    assert lv["concurrency"] == 2
    assert lv["repeats"] == 2
    assert lv["output_tok_s"]["mean"] == pytest.approx(90.0)
    assert lv["output_tok_s"]["min"] == pytest.approx(80.0)
    assert lv["output_tok_s"]["max"] == pytest.approx(100.0)
    # sample stdev of (100, 80) = 14.142..., / 90
    assert lv["output_tok_s"]["cv"] == pytest.approx(14.142135623730951 / 90)
    assert lv["accept_length"] == pytest.approx(240 / 100)
    assert lv["ttft_ms"]["count"] == 4
    assert lv["ttft_ms"]["p50"] == pytest.approx(25.0)
    assert lv["requests"] == 4
    assert lv["failed"] == 0
    assert [r["output_tok_s"] for r in lv["runs"]] == [pytest.approx(100.0), pytest.approx(80.0)]


def test_headline_is_the_lowest_concurrency():
    levels = [{"concurrency": 4, "output_tok_s": {"mean": 300.0}}, {"concurrency": 1, "output_tok_s": {"mean": 96.1}}]
    assert b.headline(levels) == 96.1
    assert b.headline([]) is None


# -- prompt set and plan -----------------------------------------------------------------------
def test_prompt_set_v1_is_frozen():
    info = b.prompt_set_info(PROMPT_SET)
    assert info["name"] == "v1"
    assert info["prompts"] == 5
    assert info["output_tokens"] == 208
    assert len({p["id"] for p in PROMPT_SET["prompts"]}) == 5
    # Several input lengths: the longest prompt is many times the shortest.
    lengths = sorted(len(p["text"]) for p in PROMPT_SET["prompts"])
    assert lengths[-1] > 20 * lengths[0]
    assert info["sha256"] == b.prompt_set_info(copy.deepcopy(PROMPT_SET))["sha256"]


def test_changing_a_prompt_changes_the_hash():
    changed = copy.deepcopy(PROMPT_SET)
    changed["prompts"] = list(changed["prompts"])
    changed["prompts"][0] = dict(changed["prompts"][0], max_new_tokens=17)
    assert b.prompt_set_info(changed)["sha256"] != b.prompt_set_info(PROMPT_SET)["sha256"]


def test_plan_counts_requests():
    p = b.plan(PROMPT_SET, repeats=3, warmup=7, concurrency=[1, 4])
    assert p["warmup_requests"] == 7
    assert [lv["requests_per_run"] for lv in p["levels"]] == [5, 20]
    assert [lv["output_tokens_per_run"] for lv in p["levels"]] == [208, 832]
    assert p["total_requests"] == 7 + 3 * 5 + 3 * 20
    assert [x["id"] for x in b.warmup_requests(list(PROMPT_SET["prompts"]), 7)][5:] == ["short-qa", "short-list"]


# -- gates -------------------------------------------------------------------------------------
def test_regression_gate_passes_within_the_limit():
    gate = b.regression_gate(result({1: 96.0}), result({1: 100.0}), 5)
    assert gate["passed"] is True
    assert gate["checks"][0]["change_pct"] == pytest.approx(-4.0)


def test_regression_gate_trips_beyond_the_limit():
    gate = b.regression_gate(result({1: 90.0, 4: 400.0}), result({1: 100.0, 4: 380.0}), 5)
    assert gate["passed"] is False
    assert [c["passed"] for c in gate["checks"]] == [False, True]
    assert "concurrency 1 fell from 100.0 to 90.0 tok/s (-10.0%, limit -5%)" in gate["message"]


def test_regression_gate_counts_improvement_as_pass():
    gate = b.regression_gate(result({1: 96.1}), result({1: 54.1}), 5)
    assert gate["passed"] is True
    assert gate["checks"][0]["change_pct"] == pytest.approx(77.634, abs=1e-3)


def test_regression_gate_exactly_at_limit_passes():
    assert b.regression_gate(result({1: 95.0}), result({1: 100.0}), 5)["passed"] is True


@pytest.mark.parametrize(
    ("baseline", "reason"),
    [
        (result({1: 100.0}, sha="b" * 64), "prompt set differs"),
        (result({1: 100.0}, api="completions"), "API differs"),
        (result({1: 100.0}, speculative=False), "speculation differs"),
        (result({2: 100.0}), "no concurrency level was measured in both"),
    ],
)
def test_regression_gate_refuses_incomparable_baselines(baseline, reason):
    gate = b.regression_gate(result({1: 100.0}), baseline, 5)
    assert gate["passed"] is False
    assert reason in gate["message"]


def test_spec_gate_trips_on_the_net_loss_case():
    gate = b.spec_gate(result({1: 54.1}), result({1: 60.0}, speculative=False), 1.0)
    assert gate["passed"] is False
    assert gate["checks"][0]["speedup"] == pytest.approx(54.1 / 60.0)
    assert "speculative decoding is a net loss" in gate["message"]


def test_spec_gate_passes_when_speculation_pays():
    gate = b.spec_gate(result({1: 96.1}), result({1: 60.0}, speculative=False), 1.5)
    assert gate["passed"] is True
    assert gate["checks"][0]["speedup"] == pytest.approx(1.6016666, abs=1e-6)


def test_spec_gate_honours_min_speedup_above_one():
    gate = b.spec_gate(result({1: 66.0}), result({1: 60.0}, speculative=False), 1.2)
    assert gate["passed"] is False
    assert "net loss" not in gate["message"]


def test_spec_gate_needs_one_run_with_and_one_without():
    assert (
        "does not run speculative decoding"
        in b.spec_gate(result({1: 1.0}, speculative=False), result({1: 1.0}, speculative=False), 1)["message"]
    )
    assert "used speculative decoding too" in b.spec_gate(result({1: 1.0}), result({1: 1.0}), 1)["message"]


def test_error_gate():
    levels = [
        {"requests": 10, "failed": 1, "errors": ["HTTP 500 from u: x"]},
        {"requests": 10, "failed": 0, "errors": []},
    ]
    assert b.error_gate(levels, 0)["passed"] is False
    assert (
        "1 of 20 requests failed (5.0%, limit 0.0%); first error: HTTP 500 from u: x"
        == b.error_gate(levels, 0)["message"]
    )
    assert b.error_gate(levels, 0.05)["passed"] is True
    assert b.error_gate([], 0.5)["passed"] is False


def test_extract_result_accepts_the_module_return_or_bench():
    bench = result({1: 1.0})
    assert b.extract_result({"bench": bench, "changed": False}) is bench
    assert b.extract_result(bench) is bench
    with pytest.raises(ValueError, match="levels"):
        b.extract_result({"output_tok_s": 3})


def test_server_summary_keeps_server_args_version_and_the_average_accept_length():
    info = {
        "version": "0.5.9",
        "model_path": "/m",
        "served_model_name": "llama",
        "speculative_algorithm": "EAGLE3",
        "speculative_num_steps": 3,
        "internal_states": [{"avg_spec_accept_length": 2.9, "last_gen_throughput": 90.0}],
        "tp_size": 8,
    }
    summary = b.server_summary(info)
    assert summary["avg_spec_accept_length"] == 2.9 and summary["speculative_num_steps"] == 3
    assert summary["speculative_draft_model_path"] is None and "lab" not in summary and "tp_size" not in summary
    assert b.server_summary({"internal_states": []})["avg_spec_accept_length"] is None
