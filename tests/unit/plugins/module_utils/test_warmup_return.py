# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The return to service (module_utils/_return.py) and the warm-up (module_utils/_warmup.py, module serving_warmup):
edges from systemd's times, the gate against the host's figure from before, a cache read between passes; end to end
against the lab stand-in, whose lab mode writes a kernel into its JIT cache the first time it meets a shape.
Every time comes from an injected clock or from the stand-in's own cache entries, never from a wall-clock bound."""

from __future__ import annotations

import itertools
import json
import os
import re

import pytest
from lab_sglang.jit import LabJit, kernels_for
from lab_sglang.stack import STACKS

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _return, _warmup
from ansible_collections.gpufleet.upgrade.plugins.modules import serving_warmup as sw


@pytest.fixture
def stand_in_config():
    return {"rates": STACKS["new"]}


def ticking(step=1.0):
    counter = itertools.count()
    return lambda: next(counter) * step


# --------------------------------------------------------------------------- edges


def test_edges_come_from_systemds_monotonic_times_and_the_health_answer():
    wait = {
        "healthy": True,
        "health_monotonic": 130.5,
        "boot_id": "b1",
        "times": {
            "ActiveExitTimestampMonotonic": "100000000",
            "InactiveExitTimestampMonotonic": "101000000",
            "ExecMainStartTimestampMonotonic": "101500000",
        },
    }
    ret = _return.serving_return(wait, returned=True)
    assert ret["times"] == {"stop": 100.0, "process_up": 101.5, "health": 130.5}
    assert ret["edges"] == {"process_up": 1.5, "health": 29.0, "total_s": 30.5, "until": "health"}
    warm = _return.with_warm(ret, 160.5, "b1")
    assert warm["edges"]["warm"] == 30.0 and warm["edges"]["total_s"] == 60.5 and warm["edges"]["until"] == "warm"


def test_a_unit_that_never_stopped_starts_its_return_at_its_start_and_no_return_without_one():
    wait = {"healthy": True, "health_monotonic": 12.0, "boot_id": "b",
            "times": {"ActiveExitTimestampMonotonic": "0", "InactiveExitTimestampMonotonic": "10000000",
                      "ExecMainStartTimestampMonotonic": "10200000"}}  # fmt: skip
    assert _return.serving_return(wait, True)["times"]["stop"] == 10.0
    assert _return.serving_return(wait, False) == {"returned": False, "boot_id": "b", "times": {}}
    # monotonic times of another boot do not compare
    assert _return.with_warm(_return.serving_return(wait, True), 20.0, "other boot") is None


def test_the_return_gate_judges_against_the_figure_recorded_before():
    ret = _return.with_warm(
        {"returned": True, "boot_id": "b", "times": {"stop": 0.0, "process_up": 2.0, "health": 10.0}}, 33.0, "b"
    )
    # the server's own part (from its process's start) is compared: 31 s now against 28.2 s before
    before = {"total_s": 30.0, "recorded_at": "2026-12-01T00:00:00Z", "edges": {"process_up": 1.8}}
    assert _return.judge("n1", ret, before, 1.1) == {"status": "passed", "reasons": [], "ratio": 1.099, "notes": [
        "back to service in 33.0 s (stop -> process up 2.0 s, process up -> /health 8.0 s, /health -> warm 23.0 s); "
        "the server took 31.0 s from its start, 1.10x the 28.2 s recorded before (2026-12-01T00:00:00Z)"]}  # fmt: skip
    # an upgrade's stop -> process up holds its switch: a slow switch alone does not fail the stack
    switch = _return.with_warm({"returned": True, "boot_id": "b", "times": {"stop": -60.0, "process_up": 2.0,
                                "health": 10.0}}, 33.0, "b")  # fmt: skip
    assert _return.judge("n1", switch, before, 1.1)["status"] == "passed"
    slow = _return.judge("n1", ret, {"total_s": 20.0, "recorded_at": "x"}, 1.1)
    assert slow["status"] == "failed"
    assert slow["reasons"][0].startswith("n1: back to service in 33.0 s (stop -> process up 2.0 s, process up -> ")
    assert (
        "the server took 31.0 s from its start, 1.55x the 20.0 s recorded before (x); the limit is 1.1x"
        in (slow["reasons"][0])
    )
    assert _return.judge("n1", ret, {"total_s": 29.0}, 1.1)["status"] == "passed"
    skipped = _return.judge("n1", ret, None, 1.1, "no return recorded at /x")
    assert skipped["status"] == "skipped" and skipped["skipped_reason"] == "skipped: no return recorded at /x"
    assert _return.judge("n1", None, before, 1.1)["skipped_reason"] == "skipped: no return in this run"


def test_a_record_read_back_is_checked_before_it_is_the_figure_to_beat():
    with pytest.raises(_return.ReturnError, match="no positive total_s"):
        _return.check_record({"schema": _return.RECORD_SCHEMA, "total_s": 0}, "/r")
    with pytest.raises(_return.ReturnError, match="not a return record"):
        _return.check_record({"total_s": 3}, "/r")


# --------------------------------------------------------------------------- the cache between passes


def test_the_cache_folder_is_the_servers_flashinfer_workspace_or_its_users_home():
    assert _warmup.jit_cache_dirs({"FLASHINFER_WORKSPACE_BASE": "/w"}, "/home/s") == ["/w/.cache/flashinfer"]
    assert _warmup.jit_cache_dirs({}, "/home/s") == ["/home/s/.cache/flashinfer"]
    assert _warmup.kernel_name("0.6.4/90a/cached_ops/sampling/sampling.so") == "sampling"


def test_a_rewritten_kernel_counts_as_compiled(tmp_path):
    so = tmp_path / "0.6.4" / "90a" / "cached_ops" / "sampling" / "sampling.so"
    so.parent.mkdir(parents=True)
    so.write_text("a")
    before = _warmup.snapshot([str(tmp_path)])
    assert _warmup.compiled(before, _warmup.snapshot([str(tmp_path)]), [str(tmp_path)]) == []
    staging = so.with_name(".tmp")
    staging.write_text("b")
    os.replace(staging, so)  # a rebuild: a new inode under the same name
    assert _warmup.compiled(before, _warmup.snapshot([str(tmp_path)]), [str(tmp_path)]) == ["sampling"]


def test_passes_go_on_until_one_compiles_nothing():
    # the cache before the first pass, then after each pass: a built in pass 1, b in pass 2, nothing in pass 3
    caches = iter([{}, {"/c/v/a/cached_ops/a/a.so": (1, 1)}, {"/c/v/a/cached_ops/a/a.so": (1, 1),
                   "/c/v/a/cached_ops/b/b.so": (2, 2)}, {"/c/v/a/cached_ops/a/a.so": (1, 1),
                   "/c/v/a/cached_ops/b/b.so": (2, 2)}])  # fmt: skip
    result = _warmup.warm_up(lambda: {"requests": 4, "failed": 0}, lambda: next(caches), 5, ticking(), dirs=["/c"])
    assert [p["compiled"] for p in result["passes"]] == [["a"], ["b"], []]
    assert result["warm"] is True and result["kernels"] == ["a", "b"] and result["compiled_after_warmup"] == []


def test_a_server_that_still_compiles_in_the_last_pass_fails_naming_its_kernels():
    counter = itertools.count()
    result = _warmup.warm_up(
        lambda: {"requests": 4, "failed": 0},
        lambda: {f"/c/0.6/90a/cached_ops/k{n}/k{n}.so": (n, n) for n in range(next(counter) + 1)},
        2,
        ticking(0.5),
        dirs=["/c"],
    )
    assert result["warm"] is False and result["compiled_after_warmup"] == ["k2"]
    assert result["wall_s"] == 2.5
    gate = _warmup.judge("n1", result, ["/c"], 0)
    assert gate["status"] == "failed"
    assert gate["reasons"] == [
        "n1: the server still compiles after 2 warm-up pass(es): its last pass built k2 in /c; traffic would meet "
        "these compiles. Fix: build the stack's kernels before the drain (phase prepare), or raise "
        "postcheck.return.warmup_passes in the profile"
    ]


# --------------------------------------------------------------------------- end to end against the stand-in


class FakeModule:
    def get_bin_path(self, _name):
        return None

    def run_command(self, argv):
        raise AssertionError(argv)


def params(cache, **over):
    base = {name: spec.get("default") for name, spec in sw.argument_spec().items()}
    base.update(cache_dirs=[str(cache)], concurrency=[1, 2], max_new_tokens=4, passes=3, request_timeout=30)
    base.update(over)
    return base


def test_the_stand_in_compiles_a_shape_once_and_the_warm_up_stops_after_a_quiet_pass(serve, tmp_path):
    jit = LabJit(tmp_path, "0.6.4", compile_s=0.0)
    _server, url = serve(jit=jit)
    out = sw.run(FakeModule(), params(tmp_path, server_url=url), clock=ticking())
    passes = out["warmup"]["passes"]
    # The batch a request meets is how many requests the server holds at that moment, which the machine's load
    # decides (two concurrent requests may or may not overlap; a finished one may still be held): a decode kernel of
    # a larger batch is built in the first pass that met that batch, if any. The other kernels come with the first
    # pass; a kernel is built once; the warm-up ends on the first quiet pass.
    built = [p["compiled"] for p in passes]
    assert out["warmup"]["warm"] is True and built[-1] == [] and all(built[:-1])
    assert {"batch_prefill_ragged", "batch_decode_bs1", "sampling_top_k_top_p", "eagle_verify_d4"} <= set(built[0])
    every = [k for kernels in built for k in kernels]
    assert len(every) == len(set(every))
    assert {k for k in every if not k.startswith("batch_decode_bs")} == {
        "batch_prefill_ragged", "sampling_top_k_top_p", "eagle_verify_d4"
    }  # fmt: skip
    assert out["gates"]["warmup"]["status"] == "passed"
    assert out["gates"]["return"]["skipped_reason"] == "skipped: no return in this run"


def test_a_prepared_cache_compiles_nothing_and_the_return_is_recorded_for_the_next_run(serve, tmp_path):
    jit = LabJit(tmp_path, "0.6.4", compile_s=0.0)
    # Every batch a pass can meet (how many requests the server holds at once follows the machine's load), prepared.
    jit.ensure([k for batch in (1, 2, 4, 8) for sampled in (True, False) for k in kernels_for(sampled, batch, True, 4)])
    _server, url = serve(jit=jit)
    record = tmp_path / "state" / "serving-return.json"
    record.parent.mkdir()
    record.write_text(json.dumps({"schema": _return.RECORD_SCHEMA, "total_s": 100.0, "venv": "/v/old",
                                  "recorded_at": "then"}))  # fmt: skip
    serving = {"returned": True, "boot_id": "", "times": {"stop": 0.0, "process_up": 1.0, "health": 5.0}}
    out = sw.run(
        FakeModule(),
        params(tmp_path, server_url=url, serving_return=serving, record_path=str(record), venv="/v/new",
               max_return_ratio=1.1),
        clock=lambda: 50.0,
    )  # fmt: skip
    assert [p["compiled"] for p in out["warmup"]["passes"]] == [[]]
    assert out["gates"]["return"]["status"] == "passed" and out["gates"]["return"]["ratio"] == 0.49
    kept = json.loads(record.read_text())
    assert kept["total_s"] == 50.0 and kept["venv"] == "/v/new" and kept["edges"]["warm"] == 45.0


def test_a_server_that_keeps_compiling_fails_the_gate_naming_the_kernel(serve, tmp_path):
    class Forgetful(LabJit):
        def ensure(self, names):
            built = super().ensure(names)
            if "sampling_top_k_top_p" not in built:
                os.remove(self.path("sampling_top_k_top_p"))  # a kernel that never stays in the cache
            return built

    _server, url = serve(jit=Forgetful(tmp_path, "0.6.4", compile_s=0.0))
    out = sw.run(FakeModule(), params(tmp_path, server_url=url, concurrency=[1], passes=2), clock=ticking())
    assert out["warmup"]["warm"] is False
    assert out["gates"]["warmup"]["status"] == "failed"
    # The kernel that never stays is built in every pass, the last one included (a decode kernel of a batch that load
    # made larger may be built beside it: the reason names every kernel of the last pass).
    assert "sampling_top_k_top_p" in out["warmup"]["passes"][-1]["compiled"]
    assert re.search(r"its last pass built ([a-z0-9_]+, )*sampling_top_k_top_p(, [a-z0-9_]+)* in ",
                     out["gates"]["warmup"]["reasons"][0])  # fmt: skip


def test_the_stand_in_names_its_kernels_by_shape():
    assert kernels_for(False, 3, False, 16) == ("batch_prefill_ragged", "batch_decode_bs4")
    assert kernels_for(True, 100, True, 16)[1:] == ("batch_decode_bs64", "sampling_top_k_top_p", "eagle_verify_d16")
    slept = []
    jit = LabJit("/nonexistent-root", "0", compile_s=2.5, sleep=slept.append)
    jit.path = lambda name: type("P", (), {"exists": lambda self: True})()
    assert jit.ensure(["a"]) == [] and slept == []
