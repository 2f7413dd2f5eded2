# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""dcgmi diag -j output (tests/data/dcgm, sources in SOURCES.md) parsed and judged; the level per batch; the
smoke test's DCGM step with dcgmi present, absent, failing."""

from __future__ import annotations

from pathlib import Path

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _dcgm
from ansible_collections.gpufleet.upgrade.plugins.modules import gpu_smoke_test

DATA = Path(__file__).resolve().parents[3] / "data" / "dcgm"


def read(name):
    return (DATA / name).read_text()


def test_real_3_1_output_with_a_stray_line_and_nulls_passes():
    parsed = _dcgm.parse(read("dcgm-3.1.0-pass-8gpu.txt"))
    assert parsed["version"] == "3.1.0" and len(parsed["results"]) == 9 + 8
    assert {r["status"] for r in parsed["results"]} == {"pass"}
    assert parsed["results"][-1] == {"category": "Custom", "test": "software", "gpu": 7, "status": "pass", "detail": ""}
    verdict = _dcgm.judge(parsed, "gpu-07", 1)
    assert verdict["passed"] and verdict["counts"] == {"pass": 17}


def test_skipped_tests_do_not_fail_but_are_counted():
    verdict = _dcgm.judge(_dcgm.parse(read("dcgm-3.x-r3-skip-t400.json")), "h", 3)
    assert verdict["passed"] and verdict["counts"] == {"skip": 5}


def test_a_failed_test_names_gpu_test_category_and_dcgm_text():
    verdict = _dcgm.judge(_dcgm.parse(read("dcgm-derived-fail-gpu0.json")), "gpu-07", 2)
    assert not verdict["passed"]
    (reason,) = verdict["reasons"]
    assert reason.startswith("gpu-07: dcgmi diag -r 2: GPU 0 GPU Memory (Hardware) failed: GPU 0 Error using CUDA API")
    assert "busy or unavailable" in reason and "run the diagnostic again" in reason


def test_no_result_is_not_a_pass():
    verdict = _dcgm.judge(
        _dcgm.parse("Error: unable to establish a connection to the specified host: localhost"), "h", 1
    )
    assert (
        not verdict["passed"]
        and "reported no test result (Error: unable to establish a connection" in verdict["reasons"][0]
    )


def test_canary_runs_deeper():
    assert [_dcgm.level_for(i, 1, 3) for i in range(3)] == [3, 1, 1]
    assert _dcgm.level_for(0, 0) == 0 and _dcgm.command(2) == ["dcgmi", "diag", "-r", "2", "-j"]


class FakeModule:
    def __init__(self, tools, answer=(0, "", "")):
        self.tools, self.answer, self.ran = tools, answer, []
        self.params = {"dcgm_timeout_s": 600}

    def get_bin_path(self, name):
        return f"/usr/bin/{name}" if name in self.tools else None

    def run_command(self, argv):
        self.ran.append(argv)
        return self.answer


def test_smoke_test_runs_dcgmi_under_a_time_limit_and_judges_it():
    module = FakeModule({"dcgmi", "timeout"}, (226, read("dcgm-derived-fail-gpu0.json"), ""))
    out = gpu_smoke_test.run_dcgm(module, 2, "gpu-07")
    assert module.ran == [["/usr/bin/timeout", "600", "/usr/bin/dcgmi", "diag", "-r", "2", "-j"]]
    assert out["status"] == "failed" and out["rc"] == 226 and "GPU 0 GPU Memory" in out["reasons"][0]
    absent = gpu_smoke_test.run_dcgm(FakeModule(set()), 1, "h")
    assert absent["status"] == "skipped" and absent["notes"] == ["h: dcgmi is not installed"]
