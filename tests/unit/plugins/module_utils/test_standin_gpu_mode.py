# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The stand-in's GPU mode (lab_sglang.gpu) without a GPU: its scheduler loop, worker protocol and HTTP path.

The workers here are processes that sleep for what a step would cost on the GPU (a target pass, a draft pass), so
the engine's batching, the per-chunk timing the benchmark reads and the speculation gate against a slowed draft are
exercised end to end; on the device machine bench/spec_decode_device.py runs the same with lab_sglang.gpu's real
worker (recorded in tests/data/device/h100-spec-decode-gate.json, replayed by test_device_spec_decode.py).
"""

from __future__ import annotations

import os
import time

import pytest
from lab_sglang import gpu
from lab_sglang.stack import STACKS
from lab_sglang.timing import step_sizes

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _bench
from ansible_collections.gpufleet.upgrade.plugins.modules import spec_decode_bench as sdb

TARGET_S = 0.002  # one target pass (memory-bound: the same for 1 or 64 rows)
DRAFT_S = 0.0002  # one draft pass


def sleeping_worker(rank, gpu_index, cfg, conn):
    """lab_sglang.gpu.worker_main's protocol, with sleeps for the passes of a step."""
    conn.send(("ready", {"rank": rank, "gpu": gpu_index, "pid": os.getpid(), "device": "sleeper",
                         "total_bytes": 2**30, "reserved_bytes": int(2**30 * cfg.mem_fraction_static),
                         "weight_bytes": 2**28, "target_cols": 1, "draft_cols": 1}))  # fmt: skip
    while True:
        message = conn.recv()
        if message[0] == "stop":
            return
        _kind, prefill, batch = message[:3]
        cost = TARGET_S * (prefill > 0)
        if batch:
            cost += TARGET_S + (cfg.draft_passes() * DRAFT_S if cfg.speculative else 0.0)
        time.sleep(cost)
        conn.send(("done",))


def failing_worker(rank, _gpu, _cfg, conn):
    conn.send(("error", f"TP{rank} (GPU 0): OutOfMemoryError: lab test"))


@pytest.fixture
def engines():
    started = []

    def start(worker=sleeping_worker, **fields):
        engine = gpu.Engine(gpu.GpuConfig(tp_size=2, **fields), worker=worker, start_method="fork")
        started.append(engine)
        engine.start(startup_timeout=30)
        return engine

    yield start
    for engine in started:
        engine.stop()


@pytest.fixture
def stand_in_config():
    return {"rates": STACKS["new"]}


def spec_fields(draft_tokens=16, slowdown=1.0):
    return {"speculative": True, "num_steps": 3, "topk": 4, "draft_tokens": draft_tokens, "draft_slowdown": slowdown}


def test_one_worker_per_gpu_each_a_child_of_the_launcher(engines):
    engine = engines()
    assert [w["rank"] for w in engine.workers] == [0, 1]
    for worker in engine.workers:
        with open(f"/proc/{worker['pid']}/stat") as handle:
            ppid = int(handle.read().rsplit(")", 1)[1].split()[1])
        assert ppid == os.getpid()


def test_a_worker_that_fails_to_start_fails_the_engine_with_its_message(engines):
    with pytest.raises(gpu.WorkerError, match="TP0 \\(GPU 0\\): OutOfMemoryError: lab test"):
        engines(worker=failing_worker)


def test_ticks_come_once_per_step_and_concurrent_requests_share_a_step(engines):
    engine = engines()
    began = time.monotonic()
    list(engine.ticks(10, [1] * 20))
    alone = time.monotonic() - began
    assert engine.steps == 20  # the prefill rides on the first decode step
    assert alone >= 20 * TARGET_S
    import threading

    threads = [threading.Thread(target=lambda: list(engine.ticks(10, [1] * 20))) for _n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # continuous batching: four requests take about as many steps as one, not four times as many
    assert engine.steps - 20 < 2 * 20


def test_draft_passes_scale_with_the_slowdown():
    assert gpu.GpuConfig(num_steps=3).draft_passes() == 3
    assert gpu.GpuConfig(num_steps=3, draft_slowdown=8).draft_passes() == 24
    assert gpu.GpuConfig(num_steps=3, draft_slowdown=0.1).draft_passes() == 1


def test_layout_fits_the_reservation_or_says_what_to_change():
    cfg = gpu.GpuConfig(weights_gib=1.0, draft_fraction=0.1)
    lay = gpu._layout(80 * 2**30, int(80 * 2**30 * 0.88), cfg)
    assert lay["sizes"]["target"] == 2**30
    assert lay["draft_cols"] == int(lay["target_cols"] * 0.1)
    assert lay["offsets"]["draft"] >= lay["sizes"]["target"]
    with pytest.raises(gpu.WorkerError, match="raise --mem-fraction-static or lower --lab-gpu-weights-gib"):
        gpu._layout(2**30, 2**29, cfg)


def bench_of(url, **over):
    params = {key: spec.get("default") for key, spec in sdb.argument_spec().items()}
    params.update(repeats=1, warmup=0, concurrency=[1, 4], label="t", **over)
    return sdb.Bench(params, url).measure()


@pytest.mark.parametrize(("slowdown", "caught"), [(1.0, False), (12.0, True)])
def test_the_speculation_gate_catches_a_slowed_draft(engines, serve, slowdown, caught):
    _nospec, nospec_url = serve(speculative_algorithm=None, engine=engines())
    _spec, spec_url = serve(engine=engines(**spec_fields(slowdown=slowdown)))
    nospec, spec = bench_of(nospec_url), bench_of(spec_url)
    accept = STACKS["new"].accept_length
    assert spec["accept_length"] == pytest.approx(208 / sum(len(step_sizes(n, accept)) for n in (16, 32, 32, 64, 64)))
    gate = _bench.spec_gate(spec, nospec, 1.0)
    assert gate["passed"] is not caught, gate["message"]


def test_server_info_reports_the_workers_and_their_memory(engines, serve):
    import json
    import urllib.request

    _server, url = serve(engine=engines(**spec_fields()))
    with urllib.request.urlopen(url + "/server_info") as answer:
        info = json.load(answer)
    assert info["tp_size"] == 2
    assert [w["rank"] for w in info["gpufleet_lab"]["gpu"]["workers"]] == [0, 1]
    assert info["internal_states"][0]["memory_usage"]["weight"] == 0.25


def test_a_worker_dying_fails_health_and_ends_requests(engines, serve):
    import urllib.request

    engine = engines()
    server, url = serve(engine=engine)
    gone = []
    engine.on_failure = lambda: gone.append(True)
    os.kill(engine.workers[0]["pid"], 9)
    with pytest.raises(gpu.WorkerError, match="TP0 exited"):
        list(engine.ticks(1, [1, 1]))
    assert gone == [True]
    with pytest.raises(urllib.error.HTTPError, match="503"):
        urllib.request.urlopen(url + "/health")
