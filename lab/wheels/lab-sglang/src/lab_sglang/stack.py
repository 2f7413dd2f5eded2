# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the installed stack is, and the token rates it stands for.

The rates are the figures of the real upgrade: the 0.5.3 stack ran EAGLE-3 at 54.1 tok/s, slower
than without speculation (60 tok/s); the 0.5.9 stack with flashinfer 0.6 ran it at 96.1 tok/s with an
accept length of about 3.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import os
import re

OWN_DISTRIBUTION = "lab-sglang"
FLASHINFER_DISTRIBUTION = "lab-flashinfer-python"
NEW_SGLANG = (0, 5, 9)
NEW_FLASHINFER = (0, 6)


@dataclasses.dataclass(frozen=True)
class Rates:
    """Decode rates of one request (tokens per second) and the mean accepted tokens per verify step."""

    stack: str
    nospec_tok_s: float
    spec_tok_s: float
    accept_length: float


STACKS = {
    "old": Rates("old", nospec_tok_s=60.0, spec_tok_s=54.1, accept_length=1.6),
    "new": Rates("new", nospec_tok_s=60.0, spec_tok_s=96.1, accept_length=3.0),
}


def version_tuple(text: str | None) -> tuple[int, ...]:
    """Leading numeric release of a version string: '0.6.4+cu130' -> (0, 6, 4); None -> ()."""
    if not text:
        return ()
    match = re.match(r"^\s*v?(\d+(?:\.\d+)*)", text)
    if not match:
        return ()
    return tuple(int(part) for part in match.group(1).split("."))


def distribution_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def own_version() -> str:
    """Version of the distribution that holds this package; 0.0.0 when run from a source tree."""
    try:  # written into the package by the lab wheel builder
        from lab_sglang._build_info import VERSION  # type: ignore[import-not-found]

        return str(VERSION)
    except ImportError:
        pass
    for dist_name in importlib.metadata.packages_distributions().get("lab_sglang", []):
        version = distribution_version(dist_name)
        if version:
            return version
    return distribution_version(OWN_DISTRIBUTION) or "0.0.0"


def detect_stack(sglang_version: str | None, flashinfer_version: str | None) -> str:
    """'new' only when both the server and flashinfer are the upgraded ones; anything else is 'old'."""
    server_new = version_tuple(sglang_version) >= NEW_SGLANG
    flashinfer_new = flashinfer_version is None or version_tuple(flashinfer_version) >= NEW_FLASHINFER
    return "new" if server_new and flashinfer_new else "old"


def _float_override(value: str | float | None, fallback: float) -> float:
    if value is None or value == "":
        return fallback
    number = float(value)
    if number <= 0:
        raise ValueError(f"rate override must be positive, got {value!r}")
    return number


def resolve_rates(
    stack: str | None = None,
    nospec_tok_s: float | None = None,
    spec_tok_s: float | None = None,
    accept_length: float | None = None,
    environ: dict[str, str] | None = None,
) -> Rates:
    """Rates from the installed stack, then LAB_SGLANG_* variables, then explicit arguments (flags)."""
    env = os.environ if environ is None else environ
    chosen = (
        stack
        or env.get("LAB_SGLANG_STACK")
        or detect_stack(own_version(), distribution_version(FLASHINFER_DISTRIBUTION))
    )
    if chosen not in STACKS:
        raise ValueError(f"unknown stack {chosen!r}; choose one of {sorted(STACKS)}")
    base = STACKS[chosen]
    nospec = _float_override(env.get("LAB_SGLANG_NOSPEC_TOK_S"), base.nospec_tok_s)
    spec = _float_override(env.get("LAB_SGLANG_SPEC_TOK_S"), base.spec_tok_s)
    accept = _float_override(env.get("LAB_SGLANG_ACCEPT_LENGTH"), base.accept_length)
    nospec = _float_override(nospec_tok_s, nospec)
    spec = _float_override(spec_tok_s, spec)
    accept = _float_override(accept_length, accept)
    if accept < 1.0:
        raise ValueError(f"accept length must be >= 1, got {accept}")
    return Rates(chosen, nospec_tok_s=nospec, spec_tok_s=spec, accept_length=accept)
