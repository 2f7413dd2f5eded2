# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The lab's SGLang stand-in: which stack it believes it runs, its rate overrides and its command line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "lab" / "wheels" / "lab-sglang" / "src"
sys.path.insert(0, str(SRC))

from lab_sglang import stack  # noqa: E402
from lab_sglang.__main__ import build_parser, check_speculative  # noqa: E402


@pytest.mark.parametrize(
    ("sglang", "flashinfer", "expected"),
    [
        ("0.5.3", "0.2.14", "old"),
        ("0.5.9", "0.6.4", "new"),
        ("0.5.9", "0.2.14", "old"),  # the new server on a stale flashinfer is no faster
        ("0.5.3", "0.6.4", "old"),
        ("0.5.10", None, "new"),
        ("0.0.0", None, "old"),
    ],
)
def test_detect_stack(sglang, flashinfer, expected):
    assert stack.detect_stack(sglang, flashinfer) == expected


def test_version_tuple():
    assert stack.version_tuple("0.6.4+cu130") == (0, 6, 4)
    assert stack.version_tuple("2.11.0.dev20260620+cu130") == (2, 11, 0)
    assert stack.version_tuple(None) == ()


def test_rates_from_stack_then_environment_then_flags():
    assert stack.resolve_rates("new", environ={}) == stack.STACKS["new"]
    env = {"LAB_SGLANG_STACK": "old", "LAB_SGLANG_SPEC_TOK_S": "70", "LAB_SGLANG_ACCEPT_LENGTH": "2.5"}
    rates = stack.resolve_rates(environ=env)
    assert (rates.stack, rates.nospec_tok_s, rates.spec_tok_s, rates.accept_length) == ("old", 60.0, 70.0, 2.5)
    assert stack.resolve_rates(environ=env, spec_tok_s=80).spec_tok_s == 80
    with pytest.raises(ValueError, match="accept length must be >= 1"):
        stack.resolve_rates("new", accept_length=0.5, environ={})
    with pytest.raises(ValueError, match="unknown stack"):
        stack.resolve_rates("newest", environ={})


def test_speculative_flags_all_or_none():
    parse = build_parser().parse_known_args
    args, unknown = parse(["--model-path", "m", "--speculative-algorithm", "EAGLE3", "--mem-fraction-static", "0.8"])
    assert check_speculative(args) == "--speculative-algorithm EAGLE3 needs --speculative-draft-model-path"
    assert unknown == ["--mem-fraction-static", "0.8"]
    args, _unknown = parse(
        [
            "--model-path",
            "m",
            "--speculative-algorithm",
            "EAGLE3",
            "--speculative-draft-model-path",
            "d",
            "--speculative-num-steps",
            "3",
        ]
    )
    assert "set all three" in check_speculative(args)


def test_exit_on_start_logs_and_exits_non_zero():
    proc = subprocess.run(
        [sys.executable, "-m", "lab_sglang", "--model-path", "/m", "--lab-fault", "exit_on_start"],
        env={"PYTHONPATH": str(SRC)},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert proc.returncode == 1
    assert "the scheduler died while loading /m" in proc.stderr
