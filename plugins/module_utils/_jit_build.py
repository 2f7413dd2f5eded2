# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Build a serving stack's FlashInfer JIT kernels into its cache folder before the server needs them.

Run by module jit_cache with the new venv's python, as a script (``python _jit_build.py REQUEST_JSON``), while the
host still serves its old stack: it needs the new toolkit's nvcc (``CUDA_HOME``) and no GPU, since the SMs to build
for are given (``FLASHINFER_CUDA_ARCH_LIST``, e.g. ``9.0a``: FlashInfer then names its workspace ``90a``, as a
server on that GPU does). The cache folder is the one the new server will use: ``FLASHINFER_WORKSPACE_BASE`` (its
``.cache/flashinfer``). FlashInfer reads both at import, so they are set before it is imported.

Kernels are described as data (the profile's ``serving.jit_kernels``): ``{kind: single_decode | single_prefill |
sampling, dtype, head_dim, backend}``; each maps to the JIT spec FlashInfer builds when a server first runs that
kernel (``flashinfer.decode.get_single_decode_module`` and the like call the same ``gen_*`` functions).

Prints one JSON line: ``built`` (kernels compiled now), ``present`` (already in the cache), ``missing`` (with
``check_only``: what a build would compile; builds nothing), ``jit_dir``, ``seconds``, or ``error``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

POS_NONE = 0  # PosEncodingMode.NONE


def spec_of(jit, torch, kernel):
    kind = kernel.get("kind")
    dtype = getattr(torch, kernel.get("dtype", "bfloat16"))
    head = int(kernel.get("head_dim", 128))
    if kind == "single_decode":
        return jit.gen_single_decode_module(dtype, dtype, dtype, head, head, POS_NONE, False, False)
    if kind == "single_prefill":
        backend = kernel.get("backend", "fa2")
        return jit.gen_single_prefill_module(backend, dtype, dtype, dtype, head, head, POS_NONE, False, False, False)
    if kind == "sampling":
        from flashinfer.jit.sampling import gen_sampling_module

        return gen_sampling_module()
    raise ValueError(f"unknown kernel kind {kind!r} (single_decode, single_prefill, sampling)")


def build(request):
    os.environ["FLASHINFER_CUDA_ARCH_LIST"] = " ".join(request["archs"])
    os.environ["FLASHINFER_WORKSPACE_BASE"] = request["workspace_base"]
    started = time.monotonic()
    import torch
    from flashinfer import jit
    from flashinfer.jit import env

    specs = [spec_of(jit, torch, kernel) for kernel in request["kernels"]]
    present = [s.name for s in specs if s.jit_library_path.exists()]
    missing = [s for s in specs if not s.jit_library_path.exists()]
    if request.get("check_only"):
        return {"built": [], "present": present, "missing": [s.name for s in missing], "failed": [],
                "jit_dir": str(env.FLASHINFER_JIT_DIR), "seconds": round(time.monotonic() - started, 1)}  # fmt: skip
    # Each spec built as the server builds it (JitSpec.build: ninja run in the spec's own folder, whose .ninja_log the
    # server's ninja reads). One combined ninja file (core.build_jit_specs) keeps its log in the parent folder, and
    # the server's ninja, finding no log entry for the outputs, compiled every kernel again (seen on the GPU machine).
    with ThreadPoolExecutor(max_workers=max(1, len(missing))) as pool:
        list(pool.map(lambda spec: spec.build(verbose=False), missing))
    built = [s.name for s in missing if s.jit_library_path.exists()]
    failed = [s.name for s in missing if not s.jit_library_path.exists()]
    return {
        "built": built,
        "present": present,
        "missing": failed,
        "failed": failed,
        "jit_dir": str(env.FLASHINFER_JIT_DIR),
        "seconds": round(time.monotonic() - started, 1),
    }


def main(argv):
    try:
        result = build(json.loads(argv[1]))
    except Exception as exc:  # one line of JSON either way: the module turns it into the operator's message
        result = {"error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(result))  # pylint: disable=ansible-bad-function
    return 0 if "error" not in result and not result.get("failed") else 1


if __name__ == "__main__":
    # Run as a script in the serving venv's Python by module jit_cache, never as module code: its exit status and
    # its printed line are the protocol.
    sys.exit(main(sys.argv))  # pylint: disable=ansible-bad-function
