# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The smoke test's runner: real subprocesses (stand-in workers and the real worker without torch)."""

from __future__ import annotations

import json
import sys
import threading
import time

import pytest

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _smoke, _smoke_worker

FAKE_WORKER = r"""
import json, os, sys, time
plan = json.loads(os.environ["FAKE_PLAN"])
checks = sys.argv[sys.argv.index("--checks") + 1].split(",")
if plan.get("_startup") == "hang":
    time.sleep(60)
with open(os.environ["FAKE_LOG"], "a") as log:
    log.write(",".join(checks) + "\n")
for check in checks:
    print(json.dumps({"event": "start", "check": check}), flush=True)
    what = plan.get(check, "ok")
    if what == "hang":
        time.sleep(60)
    if what == "crash":
        sys.stderr.write("Segmentation fault in kernel\n")
        sys.stderr.flush()
        os._exit(139)
    if what == "noise":
        print("a library printed this", flush=True)
    print(json.dumps({"event": "result", "check": check, "status": "measured", "pid": os.getpid()}), flush=True)
"""


@pytest.fixture
def worker(tmp_path, monkeypatch):
    script = tmp_path / "worker.py"
    script.write_text(FAKE_WORKER)
    log = tmp_path / "launches.log"
    monkeypatch.setenv("FAKE_LOG", str(log))

    def run(plan, checks, timeout_s=5):
        env = _smoke.build_env(dict(__import__("os").environ, FAKE_PLAN=json.dumps(plan)))
        began = time.monotonic()
        results = _smoke.run_stream([sys.executable, str(script), "gpu"], env, checks, timeout_s)
        launches = log.read_text().splitlines() if log.exists() else []
        return results, launches, time.monotonic() - began

    return run


def test_all_checks_in_one_worker(worker):
    results, launches, _elapsed = worker({"b": "noise"}, ["a", "b", "c"])
    assert [results[c]["status"] for c in "abc"] == ["measured"] * 3
    assert launches == ["a,b,c"]


def test_a_hung_check_is_killed_and_the_rest_still_run(worker):
    results, launches, _elapsed = worker({"b": "hang"}, ["a", "b", "c"], timeout_s=1)
    assert results["a"]["status"] == "measured"
    assert results["b"]["status"] == "timeout" and "within 1 s" in results["b"]["error"]
    assert results["c"]["status"] == "measured"
    assert launches == ["a,b,c", "c"]  # restarted for what was left


def test_a_crash_is_reported_with_stderr_and_the_rest_still_run(worker):
    results, launches, _elapsed = worker({"a": "crash"}, ["a", "b"])
    assert results["a"]["status"] == "error"
    assert "exited with code 139" in results["a"]["error"] and "Segmentation fault" in results["a"]["error"]
    assert results["b"]["status"] == "measured"
    assert launches == ["a,b", "b"]


def test_a_worker_that_never_starts_times_every_check_out_once(worker):
    results, launches, _elapsed = worker({"_startup": "hang"}, ["a", "b"], timeout_s=1)
    assert {results[c]["status"] for c in "ab"} == {"timeout"}
    assert "did not start" in results["a"]["error"]


def test_gpus_run_in_parallel(worker):
    # Every GPU's check waits for all four to be running at once: run one after another, the barrier breaks.
    together = threading.Barrier(4, timeout=30)

    def check(gpu):
        together.wait()
        return gpu

    out = _smoke.run_parallel({i: (lambda i=i: check(i)) for i in range(4)})
    assert out == {0: 0, 1: 1, 2: 2, 3: 3}


def test_real_worker_without_torch_reports_the_missing_package():
    """The worker under an interpreter without torch (this venv) says so instead of crashing."""
    try:
        import torch  # noqa: F401

        pytest.skip("this interpreter has torch")
    except ImportError:
        pass
    argv = [sys.executable, _smoke_worker.__file__, "host", "--device", "cuda"]
    results = _smoke.run_stream(argv, _smoke.build_env(dict(__import__("os").environ)), ["torch_env"], 60)
    assert results["torch_env"]["status"] == "missing_package"
    assert results["torch_env"]["package"] == "torch"


def test_real_worker_rejects_an_unknown_check():
    argv = [sys.executable, _smoke_worker.__file__, "gpu"]
    results = _smoke.run_stream(argv, _smoke.build_env({}), ["no_such_check"], 60)
    assert results["no_such_check"]["status"] == "error"
    assert "unknown checks" in results["no_such_check"]["error"]


ALLREDUCE_FAKE = r"""
import json, sys
args = sys.argv
rank = int(args[args.index("--rank") + 1]); world = int(args[args.index("--world-size") + 1])
assert args[args.index("--backend") + 1] == "gloo"
print(json.dumps({"event": "result", "check": "nccl_allreduce", "rank": rank, "status": "measured",
                  "max_abs_err": 0.0 if rank != 1 else 2.0}), flush=True)
"""


def test_allreduce_launches_one_process_per_rank(tmp_path):
    script = tmp_path / "ar.py"
    script.write_text(ALLREDUCE_FAKE)
    ranks = _smoke.run_allreduce([sys.executable, str(script), "allreduce"], _smoke.build_env({}), 3, 30, "gloo")
    assert [r["rank"] for r in ranks] == [0, 1, 2]
    verdict = _smoke.judge_allreduce(ranks, 3, "gloo")
    assert verdict["status"] == "failed" and "rank 1 (GPU 1): wrong sum" in verdict["message"]
