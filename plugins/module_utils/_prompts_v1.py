# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Prompt set v1 of spec_decode_bench. Frozen: results are only comparable within one version.

Changing a prompt or a length here changes the set's sha256, and the regression gate then refuses to
compare against older results; write a _prompts_v2.py instead. Input lengths span short to long
prefill; output lengths are short so a pass takes seconds at 50-100 tok/s.
"""

from __future__ import annotations

_CONTEXT = (
    "A fleet of GPU servers runs an inference engine from a Python virtual environment built against one CUDA "
    "toolkit. Upgrading the toolkit means installing the new one beside the old, rebuilding the environment "
    "with wheels compiled for it, switching the service to the new environment, and measuring that the service "
    "is at least as fast as before. "
)

PROMPTS = (
    {
        "id": "short-qa",
        "text": "What does a speculative decoding draft model do? Answer in one sentence.",
        "max_new_tokens": 16,
    },
    {
        "id": "short-list",
        "text": "List five checks to run on a GPU server after a driver upgrade.",
        "max_new_tokens": 32,
    },
    {
        "id": "medium-summary",
        "text": _CONTEXT * 3 + "Summarise the procedure above in two sentences.",
        "max_new_tokens": 32,
    },
    {
        "id": "medium-explain",
        "text": _CONTEXT * 2 + "Explain why each step of the procedure above is needed.",
        "max_new_tokens": 64,
    },
    {"id": "long-review", "text": _CONTEXT * 12 + "Write a short review of the procedure above.", "max_new_tokens": 64},
)

PROMPT_SET = {"name": "v1", "prompts": PROMPTS}
