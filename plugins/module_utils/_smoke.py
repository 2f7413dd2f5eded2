# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Kernel smoke test: run the worker (_smoke_worker.py) per GPU in parallel with a time limit per check, and
judge what it measured. The judging functions are pure; the runner only needs the standard library."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

# NVLink multicast stays off in every environment the smoke test builds: a program that uses it can put a shared
# host's GPUs out of service. These win over anything the caller passes.
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}

DEFAULT_TOLERANCES = {
    # bf16 output of a bf16 product against the fp32 product of the same bf16 inputs: the output rounding alone
    # gives a relative error near 2**-9; 1e-2 leaves room for accumulation order and still catches a wrong kernel.
    "matmul_rel_err": 1e-2,
    # attention outputs are convex combinations of V ~ N(0, 1) values; bf16 inputs and outputs give max errors
    # of a few 1e-3 against an fp32 SDPA reference.
    "attention_atol": 2e-2,
    # decode outputs average thousands of values and are small, so an absolute bound alone is loose there;
    # flashinfer 0.6.4 on an H200 showed 0.0008 to 0.0023
    "attention_rel_err": 1e-2,
    "min_cosine": 0.999,
}

GPU_CHECKS = (
    "bf16_matmul",
    "flashinfer_single_decode",
    "flashinfer_single_prefill",
    "flashinfer_batch_decode",
    "capability_probes",
)
FLASHINFER_CHECKS = {c for c in GPU_CHECKS if c.startswith("flashinfer_")}
HOST_CHECKS = ("torch_env", "flashinfer_versions", "peer_access", "symmetric_memory")
# Checks as the module reports them (torch_env is split into cuda_version and arch_in_list).
ALL_CHECKS = (
    "torch_cuda_version",
    "arch_in_list",
    *GPU_CHECKS,
    "flashinfer_versions",
    "peer_access",
    "symmetric_memory",
    "nccl_allreduce",
)
FLASHINFER_DISTS = ("flashinfer-python", "flashinfer-cubin", "flashinfer-jit-cache")


def build_env(base: dict, extra: dict | None = None) -> dict:
    env = dict(base)
    env.update({k: str(v) for k, v in (extra or {}).items()})
    env.update(MULTICAST_OFF)
    # torch's device indices must match NVML's, which follow the PCI bus order
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def gpu_label(gpu: dict) -> str:
    return f"GPU {gpu.get('index')} ({gpu.get('uuid') or 'uuid unknown'})"


# ------------------------------------------------------------------------------------------------ judging


def outcome(status: str, message: str = "", **data) -> dict:
    return {"status": status, "message": message, **data}


def resolve_missing(package: str, required_packages, python: str) -> tuple[str, str]:
    """A check that cannot run for want of a package fails if the profile requires the package, else skips."""
    if package in set(required_packages or ()):
        return "failed", (
            f"{package} is not importable by {python} and the profile requires it (postcheck.smoke.required_packages);"
            f" rebuild the venv with {package}"
        )
    return "skipped", f"{package} is not installed in the venv (not required by the profile)"


def judge_close(stats: dict, kind: str, tolerances: dict | None = None) -> tuple[bool, str]:
    """Compare error statistics of a kernel against its reference. kind: 'matmul' or 'attention'."""
    tol = dict(DEFAULT_TOLERANCES, **(tolerances or {}))
    if stats.get("nonfinite", 0):
        return False, f"{stats['nonfinite']} of {stats.get('numel', '?')} outputs are NaN or Inf"
    cosine = stats.get("cosine", 0.0)
    if kind == "matmul":
        seen, limit = stats["rel_fro_err"], tol["matmul_rel_err"]
        numbers = f"relative error {seen:.3g} (tolerance {limit:g}), max abs error {stats['max_abs_err']:.3g}"
        numbers += f" at max |ref| {stats['max_abs_ref']:.3g}, cosine {cosine:.6f}"
        return seen <= limit and cosine >= tol["min_cosine"], numbers
    seen, limit = stats["max_abs_err"], tol["attention_atol"]
    rel, rel_limit = stats["rel_fro_err"], tol["attention_rel_err"]
    numbers = f"max abs error {seen:.3g} (tolerance {limit:g}), relative error {rel:.3g} (tolerance {rel_limit:g}),"
    numbers += f" cosine {cosine:.6f} (minimum {tol['min_cosine']:g})"
    return seen <= limit and rel <= rel_limit and cosine >= tol["min_cosine"], numbers


def judge_kernel(name: str, raw: dict, gpu: dict, params: dict) -> dict:
    """One per-GPU check's outcome from the worker's raw result."""
    who = gpu_label(gpu)
    status = raw.get("status")
    if status in ("timeout", "not_run"):
        return outcome("failed" if status == "timeout" else "error", f"{who}: {name}: {raw.get('error')}", raw=raw)
    if status == "missing_package":
        st, why = resolve_missing(raw["package"], params.get("required_packages"), params.get("python", "python"))
        return outcome(st, f"{who}: {name}: {why}", raw=raw)
    if status == "error":
        return outcome("failed", f"{who}: {name} raised {raw.get('error')}", raw=raw)
    if status == "skipped":
        return outcome("skipped", raw.get("reason", ""), raw=raw)
    if name == "capability_probes":
        return outcome("info", "", raw=raw)
    ok, numbers = judge_close(raw, "matmul" if name == "bf16_matmul" else "attention", params.get("tolerances"))
    msg = f"{who}: {name}: {numbers}"
    return outcome("passed" if ok else "failed", msg, raw=raw)


def judge_cuda_version(torch_env: dict, expected: str | None) -> dict:
    seen = torch_env.get("torch_cuda")
    if expected is None:
        return outcome("info", f"torch.version.cuda is {seen}", seen=seen)
    if seen != expected:
        return outcome(
            "failed",
            f"torch.version.cuda is {seen!r} but the profile targets {expected!r} (cuda.version); the venv holds"
            f" torch {torch_env.get('torch_version')}: rebuild it with the cu{expected.replace('.', '')} torch",
            seen=seen,
            expected=expected,
        )
    return outcome("passed", f"torch.version.cuda is {seen}", seen=seen, expected=expected)


def judge_arch(device: dict, arch_list) -> dict:
    sm = device.get("sm")
    ptx = [a for a in arch_list if a.startswith("compute_")]
    if sm in arch_list:
        return outcome("passed", f"{gpu_label(device)}: {sm} is in torch.cuda.get_arch_list()", sm=sm)
    return outcome(
        "failed",
        f"{gpu_label(device)}: {sm} is not in torch.cuda.get_arch_list() {arch_list}"
        + (f" (only PTX {ptx} could be JIT-compiled, slowly)" if ptx else "")
        + "; install a torch build for this GPU",
        sm=sm,
        arch_list=arch_list,
    )


def judge_versions(raw: dict, expected_version: str | None, expected_cuda: str | None, params: dict) -> dict:
    """flashinfer-python, -cubin and -jit-cache agree (jit-cache by its public version), and match the profile."""
    if raw.get("status") == "missing_package":
        st, why = resolve_missing(raw["package"], params.get("required_packages"), params.get("python", "python"))
        return outcome(st, f"flashinfer_versions: {why}", raw=raw)
    if raw.get("status") in ("error", "timeout", "not_run"):
        return outcome("failed", f"flashinfer_versions: {raw.get('error')}", raw=raw)
    parsed = raw.get("parsed", {})
    problems = []
    base = parsed.get("flashinfer-python", {}).get("public")
    for dist in FLASHINFER_DISTS[1:]:
        entry = parsed.get(dist)
        if entry and entry["public"] != base:
            problems.append(f"{dist} {entry['version']} does not match flashinfer-python {base}")
    if expected_version and base != expected_version:
        problems.append(f"flashinfer-python is {base}, the profile pins {expected_version}")
    jit = parsed.get("flashinfer-jit-cache")
    if jit and expected_cuda and jit.get("local") and jit["local"] != "cu" + expected_cuda.replace(".", ""):
        problems.append(
            f"flashinfer-jit-cache {jit['version']} is built for {jit['local']}, the target is CUDA {expected_cuda}"
        )
    absent = [d for d in FLASHINFER_DISTS if d not in parsed]
    summary = ", ".join(f"{d} {parsed[d]['version']}" for d in FLASHINFER_DISTS if d in parsed)
    if absent:
        summary += f"; absent: {', '.join(absent)}"
    if problems:
        return outcome(
            "failed",
            "flashinfer_versions: " + "; ".join(problems) + " (flashinfer refuses to import a mismatched trio);"
            " reinstall the three at one version",
            raw=raw,
        )
    return outcome("passed", f"flashinfer_versions: {summary}", raw=raw)


def judge_peer_access(raw: dict, gpu_count: int) -> dict:
    if gpu_count < 2:
        return outcome("skipped", "peer access needs two GPUs; this host has one", raw=raw)
    if raw.get("status") in ("error", "timeout", "not_run", "missing_package"):
        return outcome("failed", f"peer_access: {raw.get('error')}", raw=raw)
    denied = [pair for pair, ok in raw.get("pairs", {}).items() if not ok]
    if denied:
        return outcome(
            "info",
            f"peer access is not available for {', '.join(denied)} (PCIe without P2P: NCCL falls back to host copies)",
            raw=raw,
        )
    return outcome("passed", f"peer access between all {gpu_count} GPUs", raw=raw)


def judge_allreduce(rank_results: list, world_size: int, backend: str) -> dict:
    """All ranks must report the sum 1 + 2 + ... + world_size in every element."""
    expected = world_size * (world_size + 1) / 2
    by_rank = {r.get("rank"): r for r in rank_results}
    problems = []
    for rank in range(world_size):
        res = by_rank.get(rank)
        if res is None:
            problems.append(f"rank {rank} (GPU {rank}) reported nothing")
        elif res.get("status") != "measured":
            problems.append(f"rank {rank} (GPU {rank}): {res.get('error') or res.get('status')}")
        elif res.get("max_abs_err", 1.0) != 0.0:
            problems.append(
                f"rank {rank} (GPU {rank}): wrong sum, max abs error {res['max_abs_err']} against {expected}"
            )
    figures = {}
    if by_rank.get(0, {}).get("status") == "measured" and world_size > 1:
        # one rank moves nothing between GPUs: its time and bandwidth measure a local no-op
        r0 = by_rank[0]
        figures = {k: r0[k] for k in ("size_mb", "seconds_per_op", "algbw_gbps", "busbw_gbps") if k in r0}
    data = dict(world_size=world_size, backend=backend, expected=expected, ranks=rank_results, **figures)
    if problems:
        return outcome("failed", f"{backend} all-reduce over {world_size} rank(s): " + "; ".join(problems), **data)
    note = " (one GPU: the single-rank path only, no bandwidth to measure)" if world_size == 1 else ""
    bw = f", bus bandwidth {figures['busbw_gbps']:.1f} GB/s" if "busbw_gbps" in figures else ""
    return outcome("passed", f"{backend} all-reduce over {world_size} rank(s) gave {expected:g}{bw}{note}", **data)


def summarize(host_checks: dict, gpus: list, allreduce: dict | None) -> dict:
    failures = [c["message"] for c in host_checks.values() if c["status"] in ("failed", "error")]
    for gpu in gpus:
        failures += [c["message"] for c in gpu["checks"].values() if c["status"] in ("failed", "error")]
    if allreduce and allreduce["status"] in ("failed", "error"):
        failures.append(allreduce["message"])
    return {"passed": not failures, "failures": failures}


# ------------------------------------------------------------------------------------------------- running


def run_stream(argv, env, checks, timeout_s, popen=subprocess.Popen, clock=time.monotonic):
    """Run the worker for `checks`; each check gets `timeout_s` from its start (and the start-up as long).

    A check that overruns is killed with its worker and marked timeout; the worker is started again for the
    checks after it, so one hung kernel does not hide the others. Returns {check: raw result}.
    """
    results: dict = {}
    pending = list(checks)
    while pending:
        _run_once(argv, env, pending, timeout_s, popen, clock, results)
        pending = [c for c in pending if c not in results]
    return results


def _run_once(argv, env, pending, timeout_s, popen, clock, results):
    stderr = tempfile.TemporaryFile()
    proc = popen(
        [*argv, "--checks", ",".join(pending)],
        stdout=subprocess.PIPE,
        stderr=stderr,
        env=env,
        start_new_session=True,
        text=True,
    )
    lines: queue.Queue = queue.Queue()
    reader = threading.Thread(target=_pump, args=(proc.stdout, lines), daemon=True)
    reader.start()
    current, deadline = None, clock() + timeout_s
    before = len(results)
    while True:
        try:
            line = lines.get(timeout=max(0.0, deadline - clock()))
        except queue.Empty:
            _kill(proc)
            if current:
                results[current] = {"status": "timeout", "error": f"did not finish within {timeout_s} s; killed"}
            else:  # nothing would start in a new worker either
                for check in pending:
                    results.setdefault(
                        check, {"status": "timeout", "error": f"worker did not start a check within {timeout_s} s"}
                    )
            break
        if line is None:  # the worker ended
            proc.wait()
            if current is not None or len(results) == before:
                who = current or pending[0]
                results[who] = {
                    "status": "error",
                    "error": f"worker exited with code {proc.returncode} during this check: {_tail(stderr)}",
                }
            break
        event = _parse(line)
        if event is None:
            continue
        if event.get("event") == "start":
            current, deadline = event["check"], clock() + timeout_s
        elif event.get("event") == "result":
            results[event["check"]] = event
            current, deadline = None, clock() + timeout_s
        elif event.get("event") == "fatal":
            for check in pending:
                results.setdefault(check, {"status": "error", "error": event.get("error")})
    proc.wait()
    stderr.close()


def _pump(stream, lines):
    for line in stream:
        lines.put(line)
    lines.put(None)


def _parse(line):
    try:
        event = json.loads(line)
    except ValueError:
        return None  # a library printed to stdout; only the worker's JSON lines count
    return event if isinstance(event, dict) else None


def _kill(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # already gone
    proc.wait()


def _tail(fileobj, limit=1500):
    fileobj.seek(0)
    data = fileobj.read().decode(errors="replace")
    return data[-limit:].strip() or "(no stderr)"


def run_allreduce(argv, env, world_size, timeout_s, backend, popen=subprocess.Popen):
    """One worker process per rank (GPU), all started at once; every rank must finish within timeout_s."""
    tmpdir = tempfile.mkdtemp(prefix="gpufleet-allreduce-")
    init_file = os.path.join(tmpdir, "rendezvous")
    procs = []
    for rank in range(world_size):
        cmd = [*argv, "--rank", str(rank), "--world-size", str(world_size), "--init-file", init_file]
        cmd += ["--backend", backend]
        procs.append(
            popen(
                cmd,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
                start_new_session=True,
                text=True,
            )
        )
    deadline = time.monotonic() + timeout_s
    results = []
    for rank, proc in enumerate(procs):
        try:
            out, err = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for other in procs:
                _kill(other)
            results.append({"rank": rank, "status": "timeout", "error": f"did not finish within {timeout_s} s"})
            continue
        events = [e for e in map(_parse, out.splitlines()) if e and e.get("event") == "result"]
        if events:
            results.append(events[-1])
        else:
            tail = (err or "").strip()[-1500:] or "(no stderr)"
            results.append({"rank": rank, "status": "error", "error": f"exited with code {proc.returncode}: {tail}"})
    try:
        os.unlink(init_file)
    except OSError:
        pass
    os.rmdir(tmpdir) if not os.listdir(tmpdir) else None
    return results


def run_parallel(jobs: dict, max_workers: int | None = None) -> dict:
    """jobs: key -> zero-argument callable; runs them all at once, returns key -> result."""
    if not jobs:
        return {}
    with ThreadPoolExecutor(max_workers=max_workers or len(jobs)) as pool:
        futures = {key: pool.submit(fn) for key, fn in jobs.items()}
        return {key: fut.result() for key, fut in futures.items()}
