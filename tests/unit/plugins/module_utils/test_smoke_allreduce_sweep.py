# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The all-reduce sweep (1 KiB to 64 MiB): nccl-tests' bus bandwidth per size, the first size that breaks named,
each size from 1 MiB held to the host's own figure from before; and the worker's sweep run for real with gloo on
the CPU (.venv/torch) where that interpreter exists."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _smoke

ROOT = Path(__file__).resolve().parents[4]
KIB, MIB = 1024, 2**20
ILLEGAL = "RuntimeError: CUDA error: an illegal memory access was encountered"


def test_bus_bandwidth_is_nccl_tests_formula():
    algbw, busbw = _smoke.bus_bandwidth(64 * MIB, 0.010, 8)
    assert algbw == pytest.approx(6.7108864) and busbw == pytest.approx(6.7108864 * 2 * 7 / 8)
    assert _smoke.bus_bandwidth(64 * MIB, 0.010, 2)[1] == pytest.approx(6.7108864)  # 2(n-1)/n = 1 at two ranks


def test_default_sizes_span_1_kib_to_64_mib_and_hold_512_kib():
    sizes = _smoke.ALLREDUCE_SIZES
    assert sizes[0] == KIB and sizes[-1] >= 64 * MIB and 512 * KIB in sizes and list(sizes) == sorted(sizes)
    assert [_smoke.size_words(s) for s in (KIB, 512 * KIB, 64 * MIB, 1000)] == ["1 KiB", "512 KiB", "64 MiB", "1000 B"]


def rank(r, sweep, world=8):
    return {"rank": r, "status": "measured", "max_abs_err": 0.0, "size_mb": 256, "seconds_per_op": 0.1,
            "algbw_gbps": 2.7, "busbw_gbps": 4.7, "world_size": world, "sweep": sweep}  # fmt: skip


def sweep(seconds, upto=None, error_at=None):
    rows = []
    for s in _smoke.ALLREDUCE_SIZES:
        if error_at is not None and s == error_at:
            rows.append({"bytes": s, "status": "error", "error": ILLEGAL})
            break
        rows.append({"bytes": s, "max_abs_err": 0.0, "seconds_per_op": seconds(s)})
    return rows


def linear(gbps):
    return lambda s: 20e-6 + s / (gbps * 1e9)


def test_figures_take_the_slowest_rank_per_size():
    ranks = [rank(0, sweep(linear(20))), rank(1, sweep(linear(10)))]
    figures = _smoke.sweep_figures(ranks, 2)
    top = figures[-1]
    assert top["size"] == "64 MiB" and top["seconds_per_op"] == pytest.approx(20e-6 + 64 * MIB / 10e9)


def test_first_size_that_breaks_is_named_with_the_sizes_that_passed():
    """The RTX PRO 6000 + NCCL 2.26.2 shape (nccl #2418): every rank fails at 512 KiB after smaller sizes passed."""
    ranks = [rank(r, sweep(linear(20), error_at=512 * KIB)) for r in range(8)]
    ranks[3]["status"], ranks[3]["error"] = "error", "RuntimeError: all-reduce of 524288 bytes: " + ILLEGAL
    out = _smoke.judge_allreduce(ranks, 8, "nccl")
    assert out["status"] == "failed"
    assert out["message"].startswith(
        "nccl all-reduce over 8 rank(s): broke at 512 KiB (rank 0, GPU 0: "
        + ILLEGAL
        + ") after 1 KiB to 256 KiB passed"
    )
    assert "nccl #2418" in out["message"] and len(out["sweep"]) == 5


def test_bus_bandwidth_below_the_ratio_of_before_fails_per_size():
    before = _smoke.sweep_figures([rank(r, sweep(linear(20))) for r in range(8)], 8)
    now = [rank(r, sweep(linear(12))) for r in range(8)]
    out = _smoke.judge_allreduce(now, 8, "nccl", baseline=before, min_busbw_ratio=0.8)
    assert out["status"] == "failed"
    assert [c["bytes"] for c in out["busbw_compared"]] == [MIB, 4 * MIB, 16 * MIB, 64 * MIB]  # not below 1 MiB
    assert out["message"] == (
        "nccl all-reduce over 8 rank(s): all-reduce bus bandwidth below 0.8x of this host's own figures from before"
        " the upgrade (profile postcheck.smoke.allreduce_min_busbw_ratio) at 1 MiB 17.1 GB/s (0.67x of 25.3), 4 MiB"
        " 19.9 GB/s (0.62x of 32.0), 16 MiB 20.7 GB/s (0.61x of 34.2), 64 MiB 20.9 GB/s (0.60x of 34.8); fix: compare"
        " the venvs' NCCL versions and NCCL_* settings and read the GPUs' PCIe links (nvml_info) before putting the"
        " host back"
    )


def test_within_the_ratio_passes_and_says_so():
    before = {str(s): 30.0 for s in _smoke.ALLREDUCE_SIZES}  # a mapping bytes -> GB/s is taken too
    out = _smoke.judge_allreduce([rank(r, sweep(linear(20))) for r in range(8)], 8, "nccl", before, 0.8)
    assert out["status"] == "passed", out["message"]
    assert "1 KiB to 64 MiB swept, bus bandwidth 34.8 GB/s at 64 MiB, 0.84x of before at worst" in out["message"]


def test_one_gpu_and_no_baseline_compare_nothing():
    one = _smoke.judge_allreduce([rank(0, sweep(linear(20)), 1)], 1, "nccl", {str(MIB): 99.0}, 0.9)
    assert one["status"] == "passed" and one["busbw_compared"] == [] and one["sweep"] == []
    none = _smoke.judge_allreduce([rank(r, sweep(linear(20))) for r in range(2)], 2, "nccl", None, 0.9)
    assert none["status"] == "passed" and none["busbw_compared"] == []


TORCH = ROOT / ".venv" / "torch" / "bin" / "python"


@pytest.mark.skipif(not TORCH.exists(), reason="no .venv/torch (torch on the CPU)")
def test_worker_sweeps_every_size_with_gloo_on_the_cpu(tmp_path):
    worker = ROOT / "plugins" / "module_utils" / "_smoke_worker.py"
    sizes = ",".join(str(s) for s in _smoke.ALLREDUCE_SIZES)
    argv = [str(TORCH), str(worker), "allreduce", "--device", "cpu", "--size-mb", "1", "--iters", "2", "--sizes", sizes]
    env = _smoke.build_env(dict(os.environ, OMP_NUM_THREADS="1"))
    ranks = _smoke.run_allreduce(argv, env, 2, 300, "gloo")
    out = _smoke.judge_allreduce(ranks, 2, "gloo")
    assert out["status"] == "passed", out["message"]
    assert [r["bytes"] for r in out["sweep"]] == list(_smoke.ALLREDUCE_SIZES)
    assert all(r["busbw_gbps"] > 0 for r in out["sweep"])


def test_a_sweep_written_before_is_the_baseline_read_after(tmp_path):
    before = _smoke.judge_allreduce([rank(r, sweep(linear(20))) for r in range(8)], 8, "nccl")
    path = tmp_path / "state" / "allreduce-baseline.json"
    _smoke.write_sweep(str(path), before, now=lambda: 1.0)
    baseline, note = _smoke.read_baseline(str(path))
    assert note is None and baseline["world_size"] == 8 and len(baseline["sweep"]) == 10
    out = _smoke.judge_allreduce([rank(r, sweep(linear(12))) for r in range(8)], 8, "nccl", baseline, 0.8)
    assert out["status"] == "failed" and "0.60x of 34.8" in out["message"]
    missing, note = _smoke.read_baseline(str(tmp_path / "none.json"))
    assert missing is None and note.startswith("no all-reduce figures from before the upgrade (")
