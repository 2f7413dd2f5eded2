# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The worker's comparisons on the CPU with torch: a right kernel passes, a wrong one is caught.

Needs torch in the interpreter that runs pytest (the project's .venv has none on purpose); run with a scratch
venv holding torch (CPU) and pytest. The worker and the judge are loaded by path: neither needs Ansible.
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

UTILS = Path(__file__).resolve().parents[4] / "plugins" / "module_utils"


def load(name):
    spec = importlib.util.spec_from_file_location(name, UTILS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


worker = load("_smoke_worker")
smoke = load("_smoke")
CPU = torch.device("cpu")


def naive_attention(q, k, v, causal, sm_scale=None):
    """float64 attention written out by hand: the reference the worker's SDPA reference must agree with."""
    qo, hq, d = q.shape
    kv, hk, _head_dim = k.shape
    scale = sm_scale or 1 / math.sqrt(d)
    out = torch.empty(qo, hq, d, dtype=torch.float64)
    for h in range(hq):
        kh, vh = k[:, h // (hq // hk)].double(), v[:, h // (hq // hk)].double()
        logits = q[:, h].double() @ kh.T * scale
        if causal:
            allowed = torch.ones(qo, kv, dtype=torch.bool).tril(kv - qo)
            logits = logits.masked_fill(~allowed, float("-inf"))
        out[:, h] = torch.softmax(logits, dim=-1) @ vh
    return out


@pytest.mark.parametrize(("qo", "kv", "causal"), [(1, 300, False), (64, 64, True), (48, 200, True)])
def test_reference_attention_matches_hand_written_attention(qo, kv, causal):
    q, k, v = worker._attention_inputs(CPU, qo, kv, 8, 2, 32, seed=5)
    ok, message = smoke.judge_close(
        worker.error_stats(worker.reference_attention(q, k, v, causal=causal), naive_attention(q, k, v, causal)),
        "attention",
        {"attention_atol": 1e-5, "attention_rel_err": 1e-5, "min_cosine": 0.999999},
    )
    assert ok, message


def kernel_output(q, k, v, causal):
    """A right 'kernel': bf16 output of the exact result."""
    return naive_attention(q, k, v, causal).to(torch.bfloat16)


@pytest.mark.parametrize("causal", [False, True])
def test_right_attention_passes(causal):
    q, k, v = worker._attention_inputs(CPU, 48, 200, 8, 2, 32, seed=6)
    ok, message = smoke.judge_close(
        worker.error_stats(kernel_output(q, k, v, causal), worker.reference_attention(q, k, v, causal)), "attention"
    )
    assert ok, message


def wrong_scale(q, k, v):
    return naive_attention(q, k, v, True, sm_scale=1.05 / math.sqrt(q.shape[-1]))


def wrong_mask_alignment(q, k, v):
    # a causal mask aligned top-left instead of bottom-right
    return naive_attention(q[:, :], k[: q.shape[0]], v[: q.shape[0]], True)


def wrong_head_mapping(q, k, v):
    hq, hk = q.shape[1], k.shape[1]
    heads = torch.arange(hq) % hk  # interleaved instead of grouped heads
    return naive_attention(q, k[:, heads], v[:, heads], True)


def small_noise(q, k, v):
    ref = naive_attention(q, k, v, True)
    return ref + 0.02 * ref.abs().mean() * torch.randn(
        ref.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64
    )


@pytest.mark.parametrize("wrong", [wrong_scale, wrong_mask_alignment, wrong_head_mapping, small_noise])
def test_wrong_attention_is_caught(wrong):
    q, k, v = worker._attention_inputs(CPU, 48, 200, 8, 2, 32, seed=7)
    ok, message = smoke.judge_close(
        worker.error_stats(wrong(q, k, v).to(torch.bfloat16), worker.reference_attention(q, k, v, causal=True)),
        "attention",
    )
    assert not ok, message


def test_bf16_matmul_check_on_cpu_passes():
    result = worker.check_bf16_matmul(index=0, device_kind="cpu", matmul_size=256)
    ok, message = smoke.judge_close(result, "matmul")
    assert ok, message
    assert result["shape"] == [256, 256, 256]


def test_injected_matmul_fault_is_caught(monkeypatch):
    monkeypatch.setenv("GPUFLEET_SMOKE_INJECT_FAULT", "bf16_matmul")
    ok, message = smoke.judge_close(worker.check_bf16_matmul(index=0, device_kind="cpu", matmul_size=256), "matmul")
    assert not ok and "tolerance 0.01" in message


def test_transposed_operand_is_caught():
    a = torch.randn(128, 128).to(torch.bfloat16)
    b = torch.randn(128, 128).to(torch.bfloat16)
    ok, _reason = smoke.judge_close(worker.error_stats(a @ b.T, a.float() @ b.float()), "matmul")
    assert not ok


def test_error_stats_counts_nan_and_inf():
    out = torch.tensor([1.0, float("nan"), float("inf"), 4.0])
    stats = worker.error_stats(out, torch.tensor([1.0, 2.0, 3.0, 4.0]))
    assert stats["nonfinite"] == 2
    assert not smoke.judge_close(stats, "attention")[0]
