# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The JIT cache builder (module_utils/_jit_build.py, what module jit_cache runs in the new venv) against a FlashInfer
stand-in with FlashInfer's layout (<base>/.cache/flashinfer/<version>/<archs>/cached_ops/<name>/<name>.so): it sets the
SMs and the workspace before FlashInfer reads them, builds only what is missing, leaves other versions' caches alone;
the real FlashInfer build ran on the GPU machine (tests/data/device/, test_device_return.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from ansible_collections.gpufleet.upgrade.plugins.modules.jit_cache import flashinfer_archs

BUILDER = Path(__file__).resolve().parents[4] / "plugins" / "module_utils" / "_jit_build.py"

FAKE_ENV = """
import os, pathlib
arch = "_".join(a.replace(".", "") for a in sorted(os.environ["FLASHINFER_CUDA_ARCH_LIST"].split(" ")))
FLASHINFER_JIT_DIR = pathlib.Path(os.environ["FLASHINFER_WORKSPACE_BASE"]) / ".cache" / "flashinfer" / "0.6.4" / arch / "cached_ops"
"""  # noqa: E501
FAKE_CORE = """
def build_jit_specs(specs, verbose=False, skip_prebuilt=True):
    raise AssertionError("one combined ninja file keeps its log where the server's ninja does not read it")
"""
FAKE_JIT = """
from flashinfer.jit import env, core
class Spec:
    def __init__(self, name):
        self.name = name
    @property
    def jit_library_path(self):
        return env.FLASHINFER_JIT_DIR / self.name / (self.name + ".so")
    def build(self, verbose=False):
        # as FlashInfer's JitSpec.build: ninja in the spec's own folder, its log beside the output the server reads
        self.jit_library_path.parent.mkdir(parents=True, exist_ok=True)
        (self.jit_library_path.parent / ".ninja_log").write_text("log")
        self.jit_library_path.write_text("built")
def gen_single_decode_module(dq, dkv, do, hqk, hvo, pos, window, cap):
    return Spec(f"single_decode_with_kv_cache_dtype_q_{dq}_head_dim_qk_{hqk}")
def gen_single_prefill_module(backend, dq, dkv, do, hqk, hvo, pos, window, cap, fp16):
    return Spec(f"single_prefill_with_kv_cache_dtype_q_{dq}_head_dim_qk_{hqk}_{backend}")
"""
FAKE_SAMPLING = "from flashinfer.jit.core import *\nfrom flashinfer.jit import Spec\ndef gen_sampling_module():\n    return Spec('sampling')\n"  # noqa: E501
KERNELS = [
    {"kind": "single_decode", "dtype": "bfloat16", "head_dim": 128},
    {"kind": "single_prefill", "dtype": "bfloat16", "head_dim": 128, "backend": "fa2"},
    {"kind": "sampling"},
]


def fake_site(tmp_path):
    site = tmp_path / "site"
    (site / "flashinfer" / "jit").mkdir(parents=True, exist_ok=True)
    (site / "torch.py").write_text("bfloat16 = 'bf16'\n")
    (site / "flashinfer" / "__init__.py").write_text("")
    (site / "flashinfer" / "jit" / "env.py").write_text(FAKE_ENV)
    (site / "flashinfer" / "jit" / "core.py").write_text(FAKE_CORE)
    (site / "flashinfer" / "jit" / "__init__.py").write_text(FAKE_JIT)
    (site / "flashinfer" / "jit" / "sampling.py").write_text(FAKE_SAMPLING)
    return site


def build(tmp_path, **request):
    request = {"archs": ["9.0a"], "workspace_base": str(tmp_path / "home"), "kernels": KERNELS, **request}
    res = subprocess.run(
        [sys.executable, str(BUILDER), json.dumps(request)],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(fake_site(tmp_path))},
        check=False,
    )
    return res.returncode, json.loads(res.stdout.strip().splitlines()[-1])


def test_it_builds_what_is_missing_for_the_given_sm_into_the_servers_workspace(tmp_path):
    old = tmp_path / "home" / ".cache" / "flashinfer" / "0.2.14" / "90a" / "cached_ops" / "sampling" / "sampling.so"
    old.parent.mkdir(parents=True)
    old.write_text("old stack")
    rc, check = build(tmp_path, check_only=True)
    assert rc == 0 and check["built"] == [] and len(check["missing"]) == 3
    assert check["jit_dir"] == str(tmp_path / "home" / ".cache" / "flashinfer" / "0.6.4" / "90a" / "cached_ops")
    rc, done = build(tmp_path)
    assert rc == 0 and sorted(done["built"]) == sorted(check["missing"]) and done["present"] == []
    rc, again = build(tmp_path)
    assert again["built"] == [] and len(again["present"]) == 3
    for name in done["built"]:  # each kernel's ninja log beside it, where the server's own ninja run reads it
        assert (Path(done["jit_dir"]) / name / ".ninja_log").exists()
    assert old.read_text() == "old stack"  # the old stack's cache, which a rollback needs, is left as it was


def test_an_unknown_kernel_is_an_error_line_and_sm_12_is_spelled_as_flashinfer_does(tmp_path):
    rc, out = build(tmp_path, kernels=[{"kind": "fp4_gemm"}])
    assert rc == 1 and out["error"].startswith("ValueError: unknown kernel kind 'fp4_gemm'")
    assert flashinfer_archs(["9.0", "12.0", "9.0", "8.6"]) == ["9.0a", "12.0a", "8.6"]
