# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Replay of bench/return_device.py's run on the GPU machine (tests/data/device/*-return.json): the post-check's
warm-up against the GPU-resident stand-in, whose worker runs FlashInfer 0.6.4's decode, prefill and sampler, first with
an empty JIT cache, then with the cache the collection's builder (_jit_build.py, module jit_cache) prepared while
another process held most of the GPU. The recorded passes are judged again by today's gates."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _return, _warmup

DATA = sorted((Path(__file__).resolve().parents[3] / "data" / "device").glob("*-return.json"))


@pytest.fixture(params=DATA, ids=[p.name for p in DATA])
def runs(request):
    doc = json.loads(request.param.read_text())
    return doc, {r["mode"]: r for r in doc["runs"]}


def test_cold_the_server_compiled_its_kernels_in_the_first_pass_and_nothing_after(runs):
    _doc, by_mode = runs
    cold = by_mode["cold"]
    passes = cold["warmup"]["passes"]
    built = set(passes[0]["compiled"])
    assert len(built) == 3 and {k.split("_with_")[0] for k in built if "_with_" in k} == {
        "single_decode", "single_prefill"
    } and "sampling" in built  # fmt: skip
    assert passes[-1]["compiled"] == [] and cold["compiled_after_undrain"] == []
    assert _warmup.judge("gpu", cold["warmup"], ["cache"], 0)["status"] == "passed"


def test_prepared_the_builder_made_exactly_the_servers_kernels_and_nothing_compiled_after_the_undrain(runs):
    _doc, by_mode = runs
    cold, prepared = by_mode["cold"], by_mode["prepared"]
    assert prepared["prepare"]["rc"] == 0 and prepared["prepare"]["beside"].startswith("holding")
    assert sorted(prepared["prepare"]["built"]) == sorted(cold["warmup"]["passes"][0]["compiled"])
    assert [p["compiled"] for p in prepared["warmup"]["passes"]] == [[]]
    assert prepared["compiled_after_undrain"] == []


def test_the_return_gate_would_catch_a_cold_cache_against_a_prepared_host(runs):
    _doc, by_mode = runs
    cold, prepared = by_mode["cold"], by_mode["prepared"]
    before = {"total_s": prepared["edges"]["total_s"], "edges": prepared["edges"], "recorded_at": "prepared run"}
    cold_ret = {"edges": cold["edges"]}
    assert _return.judge("gpu", cold_ret, before, 1.1)["status"] == "failed"
    assert cold["edges"]["warm"] > prepared["edges"]["warm"]


def test_a_cache_built_through_one_combined_ninja_file_was_compiled_again_by_the_server():
    """The first device run: the builder then ran core.build_jit_specs (one ninja file, its log in the parent folder);
    the server's own ninja, run in each kernel's folder, found no log entry and compiled all three again. Hence the
    builder now builds each spec as the server does (JitSpec.build)."""
    doc = json.loads((DATA[0].parent / "h100-return-run1-ninja-log.json").read_text())
    prepared = next(r for r in doc["runs"] if r["mode"] == "prepared")
    assert sorted(prepared["warmup"]["passes"][0]["compiled"]) == sorted(prepared["prepare"]["built"])
    assert _warmup.judge("gpu", prepared["warmup"], ["cache"], 0)["status"] == "passed"  # warm, but only after them
