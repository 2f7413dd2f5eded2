# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""After converge: one post-check result on the host and its copy on the controller; the GPU gates skipped (no GPU),
the benchmark measured the stand-in server at the rate it serves and passed the regression gate against prepare's
baseline. A post-check is a measurement: check mode sends no request, a second run adds only its own result."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

RESULTS = "/var/lib/gpufleet/results"
NODE = "molecule-postcheck"
# What a run writes: its result on the host and the copy on the controller (check mode: the first, reported only).
RESULT_TASKS = {"Write the result on the host", "Copy the result to the controller"}


def results(host) -> list[str]:
    return sorted(host.check_output(f"ls -1 {RESULTS}").split())


@pytest.fixture(scope="module")
def result(host):
    names = [n for n in results(host) if n.startswith("postcheck-")]
    assert len(names) == 1, names
    return names[0], json.loads(host.file(f"{RESULTS}/{names[0]}").content_string)


def test_result_passed_with_the_gpu_gates_skipped(result):
    _name, doc = result
    assert doc["host"] == NODE and doc["profile"]["name"] == "lab-cu128"
    assert doc["passed"] is True and doc["failures"] == []
    assert doc["gpu_required"] is False
    assert doc["gates"]["gpu_health"]["status"] == "skipped"
    assert doc["gates"]["smoke"] == {"status": "skipped", "reasons": [], "skipped_reason": "skipped: no GPU"}
    assert doc["gates"]["bench"]["status"] == "passed"


def test_the_benchmark_measured_the_stand_in_s_rate_against_the_baseline(host, result, server_info):
    _name, doc = result
    bench = doc["bench"]["bench"]
    served = server_info()["gpufleet_lab"]
    assert bench["speculative"] is True and served["stack"] == "old"
    # The stand-in's deterministic rate (54.1 tok/s on the old stack); a made-up number would not land within 5 %.
    assert abs(bench["output_tok_s"] - served["rate_in_effect_tok_s"]) / served["rate_in_effect_tok_s"] < 0.05
    assert bench["levels"][0]["failed"] == 0 and bench["levels"][0]["requests"] > 0
    regression = next(g for g in doc["bench"]["gates"] if g["name"] == "regression")
    assert regression["passed"] and not regression.get("skipped")
    baseline = json.loads(host.file(f"{RESULTS}/bench-pre-upgrade.json").content_string)
    assert baseline["label"] == "pre-upgrade" and bench["label"] == "post-upgrade"


def test_controller_copy_is_the_host_s_result(host, result):
    name, _doc = result
    local = Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"]) / "controller" / "results" / NODE / name
    assert hashlib.sha256(local.read_bytes()).hexdigest() == host.file(f"{RESULTS}/{name}").sha256sum


def test_check_mode_sends_no_request_and_writes_nothing(host, converge, server_info):
    before = server_info()["gpufleet_lab"]["requests"]
    files = results(host)
    check_run = converge(check=True)
    assert check_run.rc == 0, str(check_run)
    changed = {t.task.split(" : ")[-1] for t in check_run.changed_tasks()}
    assert changed <= RESULT_TASKS, changed
    assert server_info()["gpufleet_lab"]["requests"] == before
    assert results(host) == files


def test_a_second_run_adds_only_its_result(host, converge, server_info):
    before = server_info()["gpufleet_lab"]["requests"]
    files = results(host)
    again = converge()
    assert again.rc == 0, str(again)
    changed = {t.task.split(" : ")[-1] for t in again.changed_tasks()}
    assert changed == RESULT_TASKS, changed
    added = sorted(set(results(host)) - set(files))
    assert len(added) == 1 and added[0].startswith("postcheck-"), added
    assert server_info()["gpufleet_lab"]["requests"] > before
