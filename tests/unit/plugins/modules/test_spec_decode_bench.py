# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""spec_decode_bench's main(): arguments, check mode, baselines and gates, with the measurement faked."""

from __future__ import annotations

import json

import pytest
from ansible.module_utils.testing import patch_module_args
from module_harness import Exit, Fail

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _bench
from ansible_collections.gpufleet.upgrade.plugins.module_utils._prompts_v1 import PROMPT_SET
from ansible_collections.gpufleet.upgrade.plugins.modules import spec_decode_bench as mod


def call(args, check=False):
    args = dict(args, _ansible_check_mode=check)
    with patch_module_args(args), pytest.raises((Exit, Fail)) as info:
        mod.main()
    return info.type is Exit, info.value.args[0]


def fake_result(tok_s, speculative=True, url="http://127.0.0.1:30000"):
    return {
        "schema": _bench.RESULT_SCHEMA,
        "server_url": url,
        "api": "generate",
        "prompt_set": _bench.prompt_set_info(PROMPT_SET),
        "speculative": speculative,
        "output_tok_s": tok_s,
        "levels": [{"concurrency": 1, "output_tok_s": {"mean": tok_s}, "requests": 10, "failed": 0, "errors": []}],
    }


@pytest.fixture
def measured(monkeypatch):
    """Make Bench.measure return a canned result per server URL and record which URLs were measured."""
    results = {}
    seen = []

    def measure(self):
        seen.append(self.client.base_url)
        if self.client.base_url not in results:
            raise AssertionError(f"unexpected server {self.client.base_url}")
        return results[self.client.base_url]

    monkeypatch.setattr(mod.Bench, "measure", measure)
    return results, seen


def test_check_mode_sends_nothing_and_reports_the_plan(measured):
    _results, seen = measured
    ok, out = call({"repeats": 2, "warmup": 1, "concurrency": [1, 2]}, check=True)
    assert ok and out["changed"] is False
    assert seen == []
    assert out["plan"]["total_requests"] == 1 + 2 * 5 + 2 * 10
    assert out["plan"]["prompt_set"]["name"] == "v1"


def test_missing_baseline_fails_for_real_and_is_reported_in_check_mode(tmp_path, measured):
    path = str(tmp_path / "bench.json")
    ok, out = call({"baseline_path": path, "max_regression_pct": 5})
    assert not ok
    assert "does not exist" in out["msg"] and "baseline_missing=skip" in out["msg"]
    assert measured[1] == []  # refused before any request
    ok, out = call({"baseline_path": path, "max_regression_pct": 5}, check=True)
    assert ok and out["plan"]["baseline"] == f"no baseline at {path}"
    (tmp_path / "bench.json").write_text(json.dumps(fake_result(50.0)))
    ok, out = call({"baseline_path": path}, check=True)
    assert ok and out["plan"]["baseline"] == "found"


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ({"repeats": 0}, "repeats must be at least 1"),
        ({"warmup": -1}, "warmup must be 0 or more"),
        ({"concurrency": [1, 0]}, "concurrency must list levels of 1 or more"),
        ({"concurrency": []}, "concurrency must list levels"),
        ({"max_error_rate": 2}, "max_error_rate is a share"),
    ],
)
def test_bad_numbers_fail_before_any_request(args, expected, measured):
    ok, out = call(args)
    assert not ok and expected in out["msg"]
    assert measured[1] == []


def test_never_changed_and_gates_skipped_without_thresholds(measured):
    measured[0]["http://127.0.0.1:30000"] = fake_result(96.1)
    ok, out = call({})
    assert ok and out["changed"] is False and out["passed"] is True
    assert [(g["name"], g["skipped"]) for g in out["gates"]] == [
        ("errors", False),
        ("regression", True),
        ("speculation", True),
    ]
    assert "96.1 output tok/s" in out["msg"]


def test_regression_against_a_saved_baseline_trips(tmp_path, measured):
    measured[0]["http://127.0.0.1:30000"] = fake_result(80.0)
    path = tmp_path / "bench.json"
    path.write_text(json.dumps({"changed": False, "bench": fake_result(96.1)}))
    ok, out = call({"baseline_path": str(path), "max_regression_pct": 5})
    assert not ok
    assert "regression: output throughput at concurrency 1 fell from 96.1 to 80.0 tok/s" in out["msg"]
    assert out["passed"] is False and out["bench"]["output_tok_s"] == 80.0


def test_regression_passes_and_fail_on_gate_false_records(tmp_path, measured):
    measured[0]["http://127.0.0.1:30000"] = fake_result(96.1)
    ok, out = call({"baseline": fake_result(54.1), "max_regression_pct": 5})
    assert ok and out["passed"] is True
    measured[0]["http://127.0.0.1:30000"] = fake_result(50.0)
    ok, out = call({"baseline": fake_result(54.1), "max_regression_pct": 5, "fail_on_gate": False})
    assert ok and out["passed"] is False


def test_speculation_gate_with_a_second_server(measured):
    results, seen = measured
    results["http://127.0.0.1:30000"] = fake_result(54.1)
    results["http://127.0.0.1:30001"] = fake_result(60.0, speculative=False, url="http://127.0.0.1:30001")
    ok, out = call({"nospec_server_url": "http://127.0.0.1:30001", "min_spec_speedup": 1.0})
    assert not ok
    assert "speculative decoding is a net loss" in out["msg"]
    assert seen == ["http://127.0.0.1:30000", "http://127.0.0.1:30001"]
    assert out["nospec_bench"]["output_tok_s"] == 60.0


def test_speculation_gate_with_a_saved_run_passes(tmp_path, measured):
    measured[0]["http://127.0.0.1:30000"] = fake_result(96.1)
    path = tmp_path / "nospec.json"
    path.write_text(json.dumps(fake_result(60.0, speculative=False)))
    ok, out = call({"nospec_path": str(path), "min_spec_speedup": 1.0})
    assert ok
    assert out["gates"][2]["checks"][0]["speedup"] == pytest.approx(96.1 / 60.0)


def test_unreadable_baseline_names_the_file(tmp_path, measured):
    path = tmp_path / "bench.json"
    path.write_text("{not json")
    ok, out = call({"baseline_path": str(path), "max_regression_pct": 5})
    assert not ok and str(path) in out["msg"] and "unreadable" in out["msg"]


def test_a_baseline_that_is_not_a_result_is_refused(measured):
    measured[0]["http://127.0.0.1:30000"] = fake_result(96.1)
    ok, out = call({"baseline": {"tok_s": 3}, "max_regression_pct": 5})
    assert not ok and "not a spec_decode_bench result" in out["msg"]


def test_mutually_exclusive_references():
    ok, out = call({"baseline": {}, "baseline_path": "/x"})
    assert not ok and "mutually exclusive" in out["msg"]
