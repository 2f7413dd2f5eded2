# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Kernel smoke-test worker, run by gpu_smoke_test as a script under the serving venv's Python.

It imports nothing from Ansible or the collection: only the standard library, torch and (optionally) flashinfer,
all imported inside functions so that the module can import this file to ship it. It measures and reports; the
module judges (plugins/module_utils/_smoke.py). Output: one JSON object per line on stdout:
  {"event": "start", "check": NAME}
  {"event": "result", "check": NAME, "status": "measured"|"info"|"error"|"out_of_memory"|"missing_package",
   "seconds": ..., "memory": {...} (per-GPU checks on a GPU: MemoryProbe), ...}

Modes:
  host                       torch/CUDA facts, arch list, flashinfer versions, peer access, symmetric memory
  gpu --index I --checks ..  per-GPU kernels against references
  allreduce --rank R --world-size N --init-file F --backend nccl|gloo
  build --target SM --variants sm_XX,sm_XXa --prefill-backends fa2[,fa3] --workdir D [--run-index I] --checks NAME
                             the toolkit's nvcc and flashinfer's JIT build for one target SM (flashinfer's target
                             arch comes from FLASHINFER_CUDA_ARCH_LIST, set by the module); cuobjdump lists the SASS;
                             with --run-index the freshly built flashinfer kernels also run on that GPU
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
import traceback

GPU_CHECKS = (
    "bf16_matmul",
    "flashinfer_single_decode",
    "flashinfer_single_prefill",
    "flashinfer_batch_decode",
    "capability_probes",
)
HOST_CHECKS = ("torch_env", "flashinfer_versions", "peer_access", "symmetric_memory")
FLASHINFER_DISTS = ("flashinfer-python", "flashinfer-cubin", "flashinfer-jit-cache")


class MissingPackage(Exception):
    def __init__(self, package, detail):
        super().__init__(f"{package}: {detail}")
        self.package = package
        self.detail = detail


def inject_fault(name, out):
    """GPUFLEET_SMOKE_INJECT_FAULT=check[,check] perturbs those outputs by about 3 %: proof that the gate catches
    a slightly wrong kernel, on any machine. Never set outside such a test."""
    if name not in os.environ.get("GPUFLEET_SMOKE_INJECT_FAULT", "").split(","):
        return out
    torch = need("torch")
    noise = torch.randn(out.shape, generator=torch.Generator().manual_seed(7)).to(out.device, out.dtype)
    return out + 0.03 * out.float().abs().mean().to(out.dtype) * noise


def emit(obj):
    sys.stdout.write(json.dumps(obj, default=str) + "\n")
    sys.stdout.flush()


def need(module_name, package=None):
    try:
        return __import__(module_name)
    except ImportError as exc:
        raise MissingPackage(package or module_name, str(exc)) from exc


def run_checks(names, table, memory_index=None, **kwargs):
    """Run each check, reporting its outcome; with ``memory_index`` (a GPU) also the memory it took there."""
    for name in names:
        emit({"event": "start", "check": name})
        began = time.perf_counter()
        probe = MemoryProbe(memory_index) if memory_index is not None else None
        try:
            result = table[name](**kwargs)
        except MissingPackage as exc:
            result = {"status": "missing_package", "package": exc.package, "error": exc.detail}
        except Exception as exc:  # a broken kernel must be reported, not crash the other checks
            result = failure(exc)
        result.setdefault("status", "measured")
        if probe is not None:
            result["memory"] = probe.finish()
        result.update(event="result", check=name, seconds=round(time.perf_counter() - began, 4))
        emit(result)


# What an allocation that did not fit says, whoever raised it: torch.cuda.OutOfMemoryError ("CUDA out of memory"),
# the CUDA runtime and driver ("out of memory", cudaErrorMemoryAllocation, CUDA_ERROR_OUT_OF_MEMORY) as flashinfer's
# and NCCL's checks pass them on, and cuBLAS failing to get its workspace.
OUT_OF_MEMORY = re.compile(
    r"out of memory|cudaErrorMemoryAllocation|CUDA_ERROR_OUT_OF_MEMORY|CUBLAS_STATUS_ALLOC_FAILED", re.IGNORECASE
)


def is_out_of_memory(exc) -> bool:
    """An exception that says the GPU had not the memory asked for (not that a kernel is wrong)."""
    if any(cls.__name__ == "OutOfMemoryError" for cls in type(exc).__mro__):
        return True
    return bool(OUT_OF_MEMORY.search(str(exc)))


def failure(exc) -> dict:
    text = "".join(traceback.format_exception_only(type(exc), exc)).strip()[-2000:]
    return {"status": "out_of_memory" if is_out_of_memory(exc) else "error", "error": text}


MIB = 2**20


class MemoryProbe:
    """The GPU memory one check takes: torch's peaks (allocated by tensors, reserved by its caching allocator) and
    the device's used memory as the driver (and NVML) counts it, with what was free before and after.

    Memory the previous check left cached is given back first, so each figure is the check's own and the smoke
    test holds no more than its largest check beside a server. Never raises: a probe that fails says why.
    """

    def __init__(self, index):
        self.index = index
        self.out = {}
        try:
            torch = need("torch")
            import gc

            gc.collect()
            torch.cuda.init()  # the allocator's statistics need CUDA up; the first check may come first
            torch.cuda.set_device(index)
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(index)
            free, total = torch.cuda.mem_get_info(index)
            self.out.update(free_before_mib=free // MIB, total_mib=total // MIB)
        except Exception as exc:  # the check itself reports a broken GPU
            self.out["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"

    def finish(self) -> dict:
        if "error" in self.out:
            return self.out
        try:
            torch = need("torch")
            free, total = torch.cuda.mem_get_info(self.index)
            self.out.update(
                peak_allocated_mib=torch.cuda.max_memory_allocated(self.index) // MIB,
                peak_reserved_mib=torch.cuda.max_memory_reserved(self.index) // MIB,
                free_after_mib=free // MIB,
                device_used_after_mib=(total - free) // MIB,
            )
            own = own_nvml_mib(self.index)
            if own is not None:
                self.out["process_nvml_mib"] = own
        except Exception as exc:
            self.out["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        return self.out


def own_nvml_mib(index):
    """What NVML counts for this process on the GPU (CUDA context and libraries' buffers included), when the venv
    has nvidia-ml-py; None otherwise, or where NVML's pids are of another pid namespace."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        torch = need("torch")
        pynvml.nvmlInit()
        try:
            uuid = str(torch.cuda.get_device_properties(index).uuid)
            handle = pynvml.nvmlDeviceGetHandleByUUID(f"GPU-{uuid}")
            for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                if proc.pid == os.getpid() and isinstance(proc.usedGpuMemory, int):
                    return proc.usedGpuMemory // MIB
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # a figure for the report only; never a failure of the check
        return None
    return None


# ------------------------------------------------------------------------------------------- comparisons


def error_stats(out, ref):
    """Error of `out` against `ref` (any shapes that broadcast), computed in float64 on the tensors' device."""
    torch = need("torch")
    out64 = out.detach().to(torch.float64)
    ref64 = ref.detach().to(torch.float64)
    diff = (out64 - ref64).abs()
    nonfinite = int((~torch.isfinite(out64)).sum().item())
    ref_norm = float(torch.linalg.vector_norm(ref64).item())
    out_norm = float(torch.linalg.vector_norm(out64).item())
    finite_diff = torch.where(torch.isfinite(diff), diff, torch.zeros_like(diff))
    dot = float((out64 * ref64).nan_to_num().sum().item())
    return {
        "max_abs_err": float(finite_diff.max().item()) if diff.numel() else 0.0,
        "mean_abs_err": float(finite_diff.mean().item()) if diff.numel() else 0.0,
        "max_abs_ref": float(ref64.abs().max().item()) if ref64.numel() else 0.0,
        "rel_fro_err": float(torch.linalg.vector_norm(finite_diff).item()) / ref_norm if ref_norm else 0.0,
        "cosine": dot / (ref_norm * out_norm) if ref_norm and out_norm else 0.0,
        "nonfinite": nonfinite,
        "numel": int(diff.numel()),
    }


def reference_attention(q, k, v, causal=False, sm_scale=None):
    """fp32 attention through torch SDPA. q [qo_len, Hq, D], k/v [kv_len, Hkv, D] (NHD), grouped-query heads."""
    torch = need("torch")
    group = q.shape[1] // k.shape[1]
    qf = q.float().transpose(0, 1).unsqueeze(0)
    kf = k.float().repeat_interleave(group, dim=1).transpose(0, 1).unsqueeze(0)
    vf = v.float().repeat_interleave(group, dim=1).transpose(0, 1).unsqueeze(0)
    if causal and q.shape[0] != k.shape[0]:
        # flashinfer aligns the causal mask bottom-right: query i sees keys up to kv_len - qo_len + i
        offset = k.shape[0] - q.shape[0]
        mask = torch.ones(q.shape[0], k.shape[0], dtype=torch.bool, device=q.device).tril(offset)
        out = torch.nn.functional.scaled_dot_product_attention(qf, kf, vf, attn_mask=mask, scale=sm_scale)
    else:
        out = torch.nn.functional.scaled_dot_product_attention(qf, kf, vf, is_causal=causal, scale=sm_scale)
    return out.squeeze(0).transpose(0, 1)


# -------------------------------------------------------------------------------------------- GPU checks


def _device(index, device_kind):
    torch = need("torch")
    if device_kind == "cpu":
        return torch.device("cpu")
    torch.cuda.set_device(index)
    return torch.device(f"cuda:{index}")


def _sync(device):
    torch = need("torch")
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def check_bf16_matmul(index, device_kind, matmul_size, **_):
    torch = need("torch")
    device = _device(index, device_kind)
    n = matmul_size
    gen = torch.Generator(device=device).manual_seed(1234 + index)
    a = torch.randn(n, n, device=device, generator=gen).to(torch.bfloat16)
    b = torch.randn(n, n, device=device, generator=gen).to(torch.bfloat16)
    out = inject_fault("bf16_matmul", a @ b)
    prev_tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # the reference must be true fp32
    try:
        ref = a.float() @ b.float()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev_tf32
    _sync(device)
    result = {"shape": [n, n, n], "dtype": "bfloat16", **error_stats(out, ref)}
    iters = 20 if device.type == "cuda" else 2
    _sync(device)
    began = time.perf_counter()
    for _ in range(iters):
        a @ b
    _sync(device)
    elapsed = time.perf_counter() - began
    result["tflops"] = round(2 * n**3 * iters / elapsed / 1e12, 2)
    return result


def _flashinfer():
    need("torch")
    return need("flashinfer")


def _attention_inputs(device, qo_len, kv_len, heads_q, heads_kv, head_dim, seed):
    torch = need("torch")
    gen = torch.Generator(device=device).manual_seed(seed)

    def rnd(*shape):
        return torch.randn(*shape, device=device, generator=gen).to(torch.bfloat16)

    return rnd(qo_len, heads_q, head_dim), rnd(kv_len, heads_kv, head_dim), rnd(kv_len, heads_kv, head_dim)


def check_flashinfer_single_decode(index, device_kind, **_):
    fi = _flashinfer()
    device = _device(index, device_kind)
    q, k, v = _attention_inputs(device, 1, 2048, 32, 8, 128, seed=11)
    out = inject_fault("flashinfer_single_decode", fi.single_decode_with_kv_cache(q[0], k, v))
    ref = reference_attention(q, k, v)[0]
    _sync(device)
    return {"shape": {"kv_len": 2048, "heads_q": 32, "heads_kv": 8, "head_dim": 128}, **error_stats(out, ref)}


def check_flashinfer_single_prefill(index, device_kind, **_):
    fi = _flashinfer()
    device = _device(index, device_kind)
    q, k, v = _attention_inputs(device, 384, 512, 32, 8, 128, seed=12)
    out = inject_fault("flashinfer_single_prefill", fi.single_prefill_with_kv_cache(q, k, v, causal=True))
    ref = reference_attention(q, k, v, causal=True)
    _sync(device)
    shape = {"qo_len": 384, "kv_len": 512, "heads_q": 32, "heads_kv": 8, "head_dim": 128, "causal": True}
    return {"shape": shape, **error_stats(out, ref)}


def check_flashinfer_batch_decode(index, device_kind, **_):
    fi = _flashinfer()
    torch = need("torch")
    device = _device(index, device_kind)
    heads_q, heads_kv, head_dim, page = 32, 8, 128, 16
    kv_lens = [1, 16, 37, 128, 255, 300, 500, 1024]
    pages = [(n + page - 1) // page for n in kv_lens]
    gen = torch.Generator(device=device).manual_seed(13)
    total = sum(pages)
    cache = torch.randn(total, 2, page, heads_kv, head_dim, device=device, generator=gen).to(torch.bfloat16)
    q = torch.randn(len(kv_lens), heads_q, head_dim, device=device, generator=gen).to(torch.bfloat16)
    # pages handed out in reverse so the kernel must follow the page table, not assume contiguity
    indices = torch.arange(total - 1, -1, -1, dtype=torch.int32, device=device)
    indptr = torch.tensor([0, *_cumsum(pages)], dtype=torch.int32, device=device)
    last = torch.tensor(
        [n - (p - 1) * page for n, p in zip(kv_lens, pages, strict=True)], dtype=torch.int32, device=device
    )
    workspace = torch.empty(128 * 2**20, dtype=torch.uint8, device=device)
    wrapper = fi.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD")
    wrapper.plan(
        indptr,
        indices,
        last,
        heads_q,
        heads_kv,
        head_dim,
        page,
        q_data_type=torch.bfloat16,
        kv_data_type=torch.bfloat16,
    )
    out = inject_fault("flashinfer_batch_decode", wrapper.run(q, cache))
    refs = []
    for i, n in enumerate(kv_lens):
        ids = indices[indptr[i] : indptr[i + 1]].long()
        k = cache[ids, 0].reshape(-1, heads_kv, head_dim)[:n]
        v = cache[ids, 1].reshape(-1, heads_kv, head_dim)[:n]
        refs.append(reference_attention(q[i : i + 1], k, v)[0])
    ref = torch.stack(refs)
    _sync(device)
    shape = {"kv_lens": kv_lens, "page_size": page, "heads_q": heads_q, "heads_kv": heads_kv, "head_dim": head_dim}
    return {"shape": shape, **error_stats(out, ref)}


def _cumsum(values):
    total = 0
    for value in values:
        total += value
        yield total


def check_capability_probes(index, device_kind, **_):
    torch = need("torch")
    device = _device(index, device_kind)
    result = {"status": "info"}
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        result["sm"] = f"sm_{major}{minor}"
        result["torch_fp8_scaled_mm"] = _probe_scaled_mm(torch, device)
    if device.type != "cuda":
        return result
    try:
        fi = _flashinfer()
    except MissingPackage as exc:
        result["flashinfer"] = f"not installed ({exc.detail})"
        return result
    probes = {}
    for name in (
        "is_sm90a_supported",
        "is_sm100a_supported",
        "is_sm120a_supported",
        "is_sm121a_supported",
        "is_sm12x_supported",
    ):
        fn = getattr(fi.utils, name, None)
        probes[name] = "absent in this flashinfer" if fn is None else _safe(lambda fn=fn: bool(fn(device)))
    result["flashinfer_probes"] = probes
    cc = major * 10 + minor
    backends = {}
    for op in ("bmm_fp8", "mm_fp8", "mm_fp4", "mm_bf16"):
        fn = getattr(getattr(fi, "gemm", None), op, None) or getattr(fi, op, None)
        if fn is None or not hasattr(fn, "is_backend_supported"):
            backends[op] = "no backend table in this flashinfer"
            continue
        backends[op] = [
            b
            for b in ("cudnn", "cublas", "cutlass", "trtllm", "cute-dsl", "tgv")
            if _safe(lambda b=b, fn=fn: fn.is_backend_supported(b, cc)) is True
        ]
    result["flashinfer_gemm_backends"] = backends
    return result


def _probe_scaled_mm(torch, device):
    dtype = getattr(torch, "float8_e4m3fn", None)
    if dtype is None or not hasattr(torch, "_scaled_mm"):
        return "absent in this torch"

    def run():
        a = torch.randn(64, 64, device=device).to(dtype)
        b = torch.randn(64, 64, device=device).to(dtype).t()
        one = torch.tensor(1.0, device=device)
        torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
        torch.cuda.synchronize(device)
        return "runs"

    return _safe(run)


def _safe(fn):
    try:
        return fn()
    except Exception as exc:  # a probe reports what it saw; it never fails the worker
        return f"error: {type(exc).__name__}: {str(exc)[:200]}"


GPU_TABLE = {
    "bf16_matmul": check_bf16_matmul,
    "flashinfer_single_decode": check_flashinfer_single_decode,
    "flashinfer_single_prefill": check_flashinfer_single_prefill,
    "flashinfer_batch_decode": check_flashinfer_batch_decode,
    "capability_probes": check_capability_probes,
}


# ------------------------------------------------------------------------------------------- host checks


def check_torch_env(device_kind, **_):
    torch = need("torch")
    result = {
        "torch_version": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "python": sys.version.split()[0],
        "cuda_available": bool(torch.cuda.is_available()) if device_kind == "cuda" else False,
        "arch_list": torch.cuda.get_arch_list() if device_kind == "cuda" else [],
        "devices": [],
    }
    if result["cuda_available"]:
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            uuid = getattr(props, "uuid", None)
            result["devices"].append(
                {
                    "index": i,
                    "name": props.name,
                    "uuid": f"GPU-{uuid}" if uuid is not None else None,
                    "sm": f"sm_{props.major}{props.minor}",
                    "memory_mib": props.total_memory // 2**20,
                    "multiprocessors": props.multi_processor_count,
                }
            )
    return result


def check_flashinfer_versions(**_):
    from importlib import metadata

    versions = {}
    for dist in FLASHINFER_DISTS:
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = None
    if versions["flashinfer-python"] is None:
        raise MissingPackage("flashinfer", "flashinfer-python is not installed")
    parsed = {}
    try:
        from packaging.version import Version

        for dist, ver in versions.items():
            if ver is not None:
                v = Version(ver)
                parsed[dist] = {"version": ver, "public": v.public, "local": v.local}
    except ImportError:
        parsed = {d: {"version": v, "public": v.split("+")[0], "local": None} for d, v in versions.items() if v}
    imported = _safe(lambda: need("flashinfer").__version__)
    return {"versions": versions, "parsed": parsed, "import": imported}


def check_peer_access(device_kind, **_):
    torch = need("torch")
    if device_kind != "cuda":
        return {"status": "info", "count": 0, "pairs": {}}
    count = torch.cuda.device_count()
    pairs = {}
    for a in range(count):
        for b in range(count):
            if a != b:
                pairs[f"{a}->{b}"] = bool(torch.cuda.can_device_access_peer(a, b))
    return {"count": count, "pairs": pairs}


def check_symmetric_memory(device_kind, **_):
    torch = need("torch")
    result = {"status": "info", "multicast_disabled_by_env": os.environ.get("TORCH_SYMM_MEM_DISABLE_MULTICAST")}
    try:
        import torch.distributed._symmetric_memory as symm  # noqa: F401
    except ImportError as exc:
        result["available"] = False
        result["detail"] = str(exc)
        return result
    result["available"] = True
    if device_kind == "cuda":
        # Only a device attribute query: multicast objects are never created here (see KINDS/NVLS note in docs).
        probe = getattr(getattr(torch._C, "_distributed_c10d", None), "_SymmetricMemory", None)
        has_mc = getattr(probe, "has_multicast_support", None)
        result["multicast_support"] = (
            {
                i: _safe(lambda i=i: bool(has_mc(torch._C._autograd.DeviceType.CUDA, i)))
                for i in range(torch.cuda.device_count())
            }
            if has_mc
            else "no probe in this torch"
        )
    return result


HOST_TABLE = {
    "torch_env": check_torch_env,
    "flashinfer_versions": check_flashinfer_versions,
    "peer_access": check_peer_access,
    "symmetric_memory": check_symmetric_memory,
}


# ------------------------------------------------------------------------------------------- build check

# A kernel small enough to build in a second for any SM; what matters is that the toolkit emits SASS for the target.
KERNEL_SOURCE = """
extern "C" __global__ void gpufleet_axpy(float a, const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}
"""
_ELF_RE = re.compile(r"\b(sm_[0-9]+[af]?)\.cubin\b")
_SASS_ARCH_RE = re.compile(r"^\s*arch = (sm_[0-9]+[af]?)\s*$")
_SASS_INSN_RE = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s+\S")
_NVCC_RELEASE_RE = re.compile(r"release ([0-9]+\.[0-9]+), (V[0-9.]+)")


def _tail(text, limit=1500):
    text = (text or "").strip()
    return text[-limit:]


def _run(argv, timeout=600, env=None):
    # pylint: disable-next=ansible-bad-function
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env, check=False)
    return proc.returncode, proc.stdout, proc.stderr


def find_toolkit():
    """The toolkit flashinfer's JIT uses (its own order: CUDA_HOME, CUDA_PATH, nvcc on PATH, /usr/local/cuda)."""
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if not home:
        nvcc = shutil.which("nvcc")
        home = os.path.dirname(os.path.dirname(os.path.realpath(nvcc))) if nvcc else "/usr/local/cuda"
    bindir = os.path.join(home, "bin")

    def tool(name):
        path = os.path.join(bindir, name)
        return path if os.access(path, os.X_OK) else shutil.which(name)

    nvcc = os.path.join(bindir, "nvcc") if os.access(os.path.join(bindir, "nvcc"), os.X_OK) else None
    toolkit = {"cuda_home": home, "nvcc": nvcc, "cuobjdump": tool("cuobjdump"), "nvdisasm": tool("nvdisasm")}
    if nvcc:
        _rc, out, _err = _run([nvcc, "--version"], timeout=60)
        match = _NVCC_RELEASE_RE.search(out)
        toolkit["nvcc_release"], toolkit["nvcc_version"] = match.groups() if match else (None, _tail(out, 200))
    return toolkit


def _tool_env(toolkit):
    # cuobjdump --dump-sass runs nvdisasm, which it looks for on PATH
    env = dict(os.environ)
    if toolkit.get("nvdisasm"):
        env["PATH"] = os.path.dirname(toolkit["nvdisasm"]) + os.pathsep + env.get("PATH", "")
    return env


def parse_list_elf(text):
    """cuobjdump --list-elf: 'ELF file    1: k.1.sm_120a.cubin' -> ['sm_120a'] (sorted, unique)."""
    found = set()
    for line in (text or "").splitlines():
        match = _ELF_RE.search(line.strip())
        if match:
            found.add(match.group(1))
    return sorted(found)


def parse_sass(text):
    """cuobjdump --dump-sass: the archs of its 'arch = sm_XX' headers, its functions and instructions."""
    arches, functions, instructions = set(), 0, 0
    for line in (text or "").splitlines():
        match = _SASS_ARCH_RE.match(line)
        if match:
            arches.add(match.group(1))
        elif line.strip().startswith("Function :"):
            functions += 1
        elif _SASS_INSN_RE.match(line):
            instructions += 1
    return {"arches": sorted(arches), "functions": functions, "instructions": instructions}


def inspect_elf(toolkit, path, dump_sass):
    """What cuobjdump finds in a file: its SASS ELF images (and, for small files, the disassembly's figures).

    Returns (elf, sass): elf is None when there is no cuobjdump, else {"images": [...]}, with "error" when cuobjdump
    could not read the file (a failure to inspect is another finding than "no SASS for this arch").
    """
    if not toolkit.get("cuobjdump"):
        return None, {"skipped": "no cuobjdump in the toolkit or on PATH"}
    env = _tool_env(toolkit)
    rc, out, err = _run([toolkit["cuobjdump"], "--list-elf", path], timeout=120, env=env)
    elf = {"images": parse_list_elf(out)}
    if rc != 0:
        elf["error"] = f"cuobjdump --list-elf exited {rc}: {_tail(err or out, 400)}"
    if not dump_sass:
        return elf, {"skipped": "not disassembled (large file)"}
    if not toolkit.get("nvdisasm"):
        return elf, {"skipped": "no nvdisasm: --dump-sass needs it"}
    rc, out, err = _run([toolkit["cuobjdump"], "--dump-sass", path], timeout=120, env=env)
    if rc != 0:
        return elf, {"error": f"cuobjdump --dump-sass exited {rc}: {_tail(err, 400)}"}
    return elf, parse_sass(out)


def build_nvcc(toolkit, variants, workdir):
    src = os.path.join(workdir, "gpufleet_axpy.cu")
    with open(src, "w", encoding="utf-8") as handle:
        handle.write(KERNEL_SOURCE)
    out = {}
    for variant in variants:
        obj = os.path.join(workdir, f"gpufleet_axpy.{variant}.o")
        arch = variant.replace("sm_", "compute_")
        argv = [toolkit["nvcc"], "-c", f"-gencode=arch={arch},code={variant}", "-o", obj, src]
        began = time.perf_counter()
        rc, _out, err = _run(argv, timeout=300)
        entry = {"gencode": argv[2], "rc": rc, "seconds": round(time.perf_counter() - began, 3)}
        if rc != 0:
            entry["error"] = _tail(err, 800)
        else:
            entry["bytes"] = os.path.getsize(obj)
            entry["elf"], entry["sass"] = inspect_elf(toolkit, obj, dump_sass=True)
        out[variant] = entry
    return out


def _ninja_error(exc):
    text = str(exc)
    errors = [line for line in text.splitlines() if "error" in line.lower()][:6]
    return ("\n".join(errors) + "\n...\n" if errors else "") + _tail(text, 1200)


def _ninja_gencodes(path):
    """The -gencode flags flashinfer wrote into the module's build.ninja: what its nvcc was asked to emit."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except OSError:
        return None
    return sorted(set(re.findall(r"-gencode=arch=\S+", text)))


def flashinfer_specs(fi, torch, backends):
    """The JIT modules the smoke test's decode, prefill and batch-decode checks load, with the arguments flashinfer
    itself passes for bf16, head_dim 128, no RoPE, no sliding window, no soft cap (decode.py, prefill.py)."""
    bf16 = torch.bfloat16
    specs = {"single_decode": fi.jit.gen_single_decode_module(bf16, bf16, bf16, 128, 128, 0, False, False)}
    for backend in backends:
        specs[f"single_prefill_{backend}"] = fi.jit.gen_single_prefill_module(
            backend, bf16, bf16, bf16, 128, 128, 0, False, False, False
        )
    specs["batch_decode"] = fi.jit.gen_batch_decode_module(bf16, bf16, bf16, torch.int32, 128, 128, 0, False, False)
    return specs


def _build_module(toolkit, spec):
    entry = {"uri": spec.name, "aot_available": bool(spec.is_aot)}
    began = time.perf_counter()
    try:
        spec.build(verbose=False)
    except Exception as exc:  # a module that does not build is the finding, not a crash
        entry.update(built=False, error=_ninja_error(exc))
    else:
        lib = str(spec.jit_library_path)
        entry.update(built=os.path.exists(lib), so_bytes=os.path.getsize(lib) if os.path.exists(lib) else None)
        if not entry["built"]:
            entry["error"] = f"ninja finished but {lib} is not there"
        entry["gencode"] = _ninja_gencodes(spec.ninja_path)
        entry["elf"] = inspect_elf(toolkit, lib, dump_sass=False)[0] if entry["built"] else None
    entry["seconds"] = round(time.perf_counter() - began, 2)
    return entry


def build_flashinfer(toolkit, backends):
    """Build the modules at once, a thread each: a module has only a few translation units, so building one at a
    time leaves most cores idle; ninja and nvcc run outside the GIL."""
    from concurrent.futures import ThreadPoolExecutor

    torch = need("torch")
    fi = need("flashinfer.jit", "flashinfer")
    jit_env = fi.jit.env
    out = {
        "version": getattr(fi, "__version__", None),
        "arch_list": os.environ.get("FLASHINFER_CUDA_ARCH_LIST"),
        "workspace": str(jit_env.FLASHINFER_WORKSPACE_DIR),
    }
    specs = flashinfer_specs(fi, torch, backends)
    began = time.perf_counter()
    with ThreadPoolExecutor(max_workers=len(specs)) as pool:
        futures = {name: pool.submit(_build_module, toolkit, spec) for name, spec in specs.items()}
        out["modules"] = {name: future.result() for name, future in futures.items()}
    out["seconds"] = round(time.perf_counter() - began, 2)
    return out, fi, specs


def run_built(fi, specs, index, workdir):
    """Run the smoke test's flashinfer checks on this GPU with the modules just built: flashinfer loads a prebuilt
    (jit-cache) module before its JIT one, so the prebuilt folder is pointed at an empty one for this process."""
    torch = need("torch")
    from pathlib import Path

    fi.jit.env.FLASHINFER_AOT_DIR = Path(workdir) / "no-prebuilt"
    jit_dir = fi.jit.env.FLASHINFER_JIT_DIR
    before = set(os.listdir(jit_dir)) if os.path.isdir(jit_dir) else set()
    props = torch.cuda.get_device_properties(index)
    uuid = getattr(props, "uuid", None)
    out = {"index": index, "uuid": f"GPU-{uuid}" if uuid is not None else None, "name": props.name}
    out["sm"] = f"sm_{props.major}{props.minor}"
    for check in ("flashinfer_single_decode", "flashinfer_single_prefill", "flashinfer_batch_decode"):
        began = time.perf_counter()
        probe = MemoryProbe(index)
        try:
            got = GPU_TABLE[check](index=index, device_kind="cuda")
            got.setdefault("status", "measured")
        except Exception as exc:
            got = failure(exc)
        got["memory"] = probe.finish()
        got["seconds"] = round(time.perf_counter() - began, 3)
        out[check] = got
    built = {spec.name for spec in specs.values()}
    after = set(os.listdir(jit_dir)) if os.path.isdir(jit_dir) else set()
    out["extra_modules"] = sorted(after - before - built - {"tmp"})  # tmp holds flashinfer's build locks
    return out


def check_build(target, variants, prefill_backends, workdir, run_index, **_):
    os.makedirs(workdir, exist_ok=True)
    toolkit = find_toolkit()
    result = {"target": target, "toolkit": toolkit}
    result["nvcc"] = build_nvcc(toolkit, variants, workdir) if toolkit["nvcc"] else {}
    try:
        result["flashinfer"], fi, specs = build_flashinfer(toolkit, prefill_backends)
    except MissingPackage as exc:
        result["flashinfer"] = {"status": "missing_package", "package": exc.package, "error": exc.detail}
        return result
    except Exception as exc:
        result["flashinfer"] = {"error": "".join(traceback.format_exception_only(type(exc), exc)).strip()[-1500:]}
        return result
    if run_index is None or run_index < 0:
        return result
    failed = sorted(name for name, mod in result["flashinfer"]["modules"].items() if not mod.get("built"))
    if failed:
        # running would only compile them again, within this check's time, and fail the same way
        result["run"] = {"index": run_index, "not_run": f"modules that did not build: {', '.join(failed)}"}
    else:
        result["run"] = run_built(fi, specs, run_index, workdir)
    return result


# ------------------------------------------------------------------------------------------- all-reduce


def sweep_sizes(dist, torch, device, world_size, rank, sizes, iters):
    """All-reduce at each size (bytes, ascending): the sum checked, then timed. A size that raises ends the sweep (a
    crashed communicator or CUDA context serves no further size) and is recorded with its error, so the report names
    the first size that broke (RTX PRO 6000 with NCCL 2.26.2: 512 KiB, nccl #2418)."""
    out = []
    expected = world_size * (world_size + 1) / 2
    for nbytes in sizes:
        numel = max(1, nbytes // 4)
        try:
            x = torch.full((numel,), float(rank + 1), dtype=torch.float32, device=device)
            dist.all_reduce(x)
            _sync(device)
            err = float((x - expected).abs().max().item())
            dist.all_reduce(x)  # warm-up of the timed path
            _sync(device)
            t0 = time.perf_counter()
            for _iteration in range(iters):
                dist.all_reduce(x)
            _sync(device)
            per_op = (time.perf_counter() - t0) / iters
        except Exception as exc:
            out.append({"bytes": numel * 4, **failure(exc)})
            break
        out.append({"bytes": numel * 4, "max_abs_err": err, "seconds_per_op": per_op})
        del x
    return out


def allreduce(rank, world_size, init_file, backend, size_mb, device_kind, iters, sizes=()):
    torch = need("torch")
    import torch.distributed as dist

    device = _device(rank, device_kind)
    emit({"event": "start", "check": "nccl_allreduce"})
    began = time.perf_counter()
    result = {"rank": rank, "world_size": world_size, "backend": backend}
    probe = MemoryProbe(rank) if device_kind == "cuda" else None
    try:
        dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=world_size)
        if sizes:
            result["sweep"] = sweep_sizes(dist, torch, device, world_size, rank, sizes, iters)
            broken = [s for s in result["sweep"] if "error" in s]
            if broken:
                raise RuntimeError(f"all-reduce of {broken[0]['bytes']} bytes: {broken[0]['error']}")
        numel = size_mb * 2**20 // 4
        x = torch.full((numel,), float(rank + 1), dtype=torch.float32, device=device)
        dist.all_reduce(x)
        _sync(device)
        expected = world_size * (world_size + 1) / 2
        result.update(expected=expected, max_abs_err=float((x - expected).abs().max().item()), numel=numel)
        y = torch.ones(numel, dtype=torch.float32, device=device)
        dist.all_reduce(y)  # warm-up of the timed path
        _sync(device)
        t0 = time.perf_counter()
        for _iteration in range(iters):
            dist.all_reduce(y)
        _sync(device)
        per_op = (time.perf_counter() - t0) / iters
        nbytes = numel * 4
        result.update(
            seconds_per_op=per_op,
            algbw_gbps=nbytes / per_op / 1e9,
            # bus bandwidth as nccl-tests define it for all-reduce
            busbw_gbps=nbytes / per_op / 1e9 * (2 * (world_size - 1) / world_size),
            size_mb=size_mb,
            status="measured",
        )
        if probe is not None:
            result["memory"] = probe.finish()  # before the group goes: NCCL's buffers are part of the figure
        dist.destroy_process_group()
    except Exception as exc:
        result.update(failure(exc))
        if probe is not None:
            result["memory"] = probe.finish()
    result.update(event="result", check="nccl_allreduce", seconds=round(time.perf_counter() - began, 4))
    emit(result)


# ------------------------------------------------------------------------------------------------- main


def parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["host", "gpu", "allreduce", "build"])
    parser.add_argument("--checks", default="")
    parser.add_argument("--index", type=int, default=0)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--matmul-size", type=int, default=8192)
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--world-size", type=int, default=1)
    parser.add_argument("--init-file", default="")
    parser.add_argument("--backend", default="nccl")
    parser.add_argument("--size-mb", type=int, default=256)
    parser.add_argument("--iters", type=int, default=10)
    # all-reduce sizes in bytes, comma-separated, swept before the --size-mb check
    parser.add_argument("--sizes", default="")
    parser.add_argument("--target", default="")
    parser.add_argument("--variants", default="")
    parser.add_argument("--prefill-backends", default="fa2")
    parser.add_argument("--workdir", default="")
    parser.add_argument("--run-index", type=int, default=-1)
    return parser.parse_args(argv)


def main(argv=None):
    args = parse(argv if argv is not None else sys.argv[1:])
    if args.mode == "allreduce":
        sizes = [int(s) for s in args.sizes.split(",") if s]
        a = args
        allreduce(a.rank, a.world_size, a.init_file, a.backend, a.size_mb, a.device, a.iters, sizes)
        return 0
    if args.mode == "build":
        # one check per target SM, named by the module (build_sm_120)
        name = args.checks or f"build_{args.target}"
        run_checks(
            [name],
            {name: check_build},
            target=args.target,
            variants=[v for v in args.variants.split(",") if v],
            prefill_backends=[b for b in args.prefill_backends.split(",") if b],
            workdir=args.workdir,
            run_index=args.run_index,
        )
        return 0
    table = GPU_TABLE if args.mode == "gpu" else HOST_TABLE
    names = [c for c in args.checks.split(",") if c] or list(table)
    unknown = [c for c in names if c not in table]
    if unknown:
        emit({"event": "fatal", "error": f"unknown checks {unknown}; known: {sorted(table)}"})
        return 2
    memory_index = args.index if args.mode == "gpu" and args.device == "cuda" else None
    run_checks(
        names,
        table,
        memory_index=memory_index,
        index=args.index,
        device_kind=args.device,
        matmul_size=args.matmul_size,
    )
    return 0


if __name__ == "__main__":
    # Run as a standalone subprocess by the smoke runner, never as module code: the exit status is its protocol.
    sys.exit(main())  # pylint: disable=ansible-bad-function
