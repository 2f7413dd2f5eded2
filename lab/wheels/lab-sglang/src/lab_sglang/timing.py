# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Deterministic schedule of one request: when each chunk of tokens is emitted.

The rate is end to end, as SGLang's own speed check computes it (completion_tokens / e2e_latency):
the last chunk of n tokens arrives n / rate seconds after the request, the first after the prefill
(TTFT), the others evenly between. Without speculation every step yields one token. With
speculation step k yields floor((k+1)*a) - floor(k*a) tokens (a = accept length), so the mean is a;
spec_verify_ct is the number of steps. When the prefill alone outlasts n / rate (a tiny n), steps
follow it at a / rate each.
"""

from __future__ import annotations

import dataclasses
import math


@dataclasses.dataclass(frozen=True)
class Schedule:
    chunks: tuple[int, ...]  # tokens per chunk
    offsets: tuple[float, ...]  # seconds from request start at which each chunk is sent
    verify_ct: int

    @property
    def completion_tokens(self) -> int:
        return sum(self.chunks)

    @property
    def e2e_latency(self) -> float:
        return self.offsets[-1] if self.offsets else 0.0


def prompt_token_count(text: str) -> int:
    """About four characters per token, as for English text with a BPE tokenizer."""
    return max(1, math.ceil(len(text) / 4))


def step_sizes(n_tokens: int, accept_length: float) -> list[int]:
    sizes: list[int] = []
    produced = 0
    step = 0
    while produced < n_tokens:
        size = math.floor((step + 1) * accept_length + 1e-9) - math.floor(step * accept_length + 1e-9)
        size = max(1, min(size, n_tokens - produced))
        sizes.append(size)
        produced += size
        step += 1
    return sizes


def build_schedule(
    n_tokens: int,
    prompt_tokens: int,
    *,
    speculative: bool,
    rate_tok_s: float,
    accept_length: float,
    ttft_base_s: float,
    prefill_s_per_token: float,
    slowdown: float = 1.0,
) -> Schedule:
    """slowdown >= 1 stretches every decode step (used for concurrent requests)."""
    accept = accept_length if speculative else 1.0
    sizes = step_sizes(max(0, n_tokens), accept)
    ttft = ttft_base_s + prompt_tokens * prefill_s_per_token
    budget = n_tokens / rate_tok_s * slowdown
    if len(sizes) > 1 and budget > ttft:
        step_s = (budget - ttft) / (len(sizes) - 1)
    else:
        step_s = accept / rate_tok_s * slowdown
    offsets = tuple(ttft + index * step_s for index in range(len(sizes)))
    return Schedule(chunks=tuple(sizes), offsets=offsets, verify_ct=len(sizes))
