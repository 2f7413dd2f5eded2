# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The stand-in's JIT cache (lab mode): a kernel "compiled" the first time the server meets its shape.

A real server (SGLang on FlashInfer) JIT-compiles a kernel the first time it meets a shape (a sampled request, a
batch size, a speculative verify) and writes it to FlashInfer's cache folder,
``$FLASHINFER_WORKSPACE_BASE/.cache/flashinfer/<version>/<archs>/cached_ops/<kernel>/<kernel>.so`` (the server user's
home without the variable). The stand-in does the same in lab mode: the first request of a shape waits
``compile_s`` per kernel it lacks (the request that meets it pays, as on a real server) and the kernel's entry is
written there; a kernel already in the folder (a prepared cache) costs nothing.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path

LOG = logging.getLogger("lab_sglang")
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)


def cache_root(env=None) -> Path:
    env = os.environ if env is None else env
    base = env.get("FLASHINFER_WORKSPACE_BASE") or env.get("HOME") or os.path.expanduser("~")
    return Path(base) / ".cache" / "flashinfer"


def kernels_for(sampled: bool, batch: int, speculative: bool, draft_tokens: int) -> tuple:
    """The kernels one request of this shape needs: prefill, the decode of its batch-size bucket (as CUDA graphs
    are captured per batch size), the sampler when sampled, the verify pass when speculative."""
    bucket = next((b for b in BATCH_BUCKETS if b >= max(1, batch)), BATCH_BUCKETS[-1])
    names = ["batch_prefill_ragged", f"batch_decode_bs{bucket}"]
    if sampled:
        names.append("sampling_top_k_top_p")
    if speculative:
        names.append(f"eagle_verify_d{draft_tokens}")
    return tuple(names)


class LabJit:
    """Compiles (sleeps) and records kernels; one compile at a time, as FlashInfer's JIT lock does."""

    def __init__(self, root: Path, version: str, compile_s: float, arch: str = "lab", sleep=time.sleep):
        self.folder = Path(root) / version / arch / "cached_ops"
        self.compile_s = compile_s
        self.sleep = sleep
        self.lock = threading.Lock()
        self.compiled: list[str] = []

    def path(self, name: str) -> Path:
        return self.folder / name / f"{name}.so"

    def ensure(self, names) -> list:
        """Compile the kernels of ``names`` the cache lacks; returns those compiled now."""
        built = []
        with self.lock:
            for name in names:
                target = self.path(name)
                if target.exists():
                    continue
                started = time.monotonic()
                self.sleep(self.compile_s)
                target.parent.mkdir(parents=True, exist_ok=True)
                staging = target.with_name(f".{name}.so.tmp")
                staging.write_text(f"lab compiled kernel {name}\n", encoding="utf-8")
                os.replace(staging, target)
                built.append(name)
                self.compiled.append(name)
                LOG.info("JIT: compiled %s in %.1f s into %s", name, time.monotonic() - started, self.folder)
        return built
