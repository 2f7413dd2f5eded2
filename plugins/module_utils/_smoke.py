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
# The build check for the fleet's SMs: one worker per target SM (flashinfer fixes its target archs at import).
BUILD_CHECK = "build_targets"
# Checks as the module reports them (torch_env is split into cuda_version and arch_in_list).
ALL_CHECKS = (
    "torch_cuda_version",
    "arch_in_list",
    *GPU_CHECKS,
    "flashinfer_versions",
    "peer_access",
    "symmetric_memory",
    "nccl_allreduce",
    BUILD_CHECK,
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
    if status == "out_of_memory":
        return outcome("out_of_memory", oom_message(f"{who}: {name}", raw, params.get("held")), raw=raw)
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


KIB, MIB = 2**10, 2**20
# The all-reduce sweep: 1 KiB to 64 MiB by fourfold steps, with 512 KiB, where RTX PRO 6000 with NCCL 2.26.2 starts
# to fail (illegal memory access on collectives of 512 KiB and more: nccl #2418, fixed in 2.31.2).
ALLREDUCE_SIZES = (KIB, 4 * KIB, 16 * KIB, 64 * KIB, 256 * KIB, 512 * KIB, MIB, 4 * MIB, 16 * MIB, 64 * MIB)
# Below 1 MiB an all-reduce's time is latency, which moves between runs more than a regression would: shown, not
# held to the host's figure from before.
BUSBW_COMPARED_FROM = MIB


def size_words(nbytes: int) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", MIB), ("KiB", KIB)):
        if nbytes >= size and nbytes % size == 0:
            return f"{nbytes // size} {unit}"
    return f"{nbytes} B"


def bus_bandwidth(nbytes: int, seconds: float, world_size: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s as nccl-tests define them for all-reduce: algbw = bytes / time, busbw = algbw * 2(n-1)/n
    (what each rank's link carries, comparable across GPU counts)."""
    algbw = nbytes / seconds / 1e9 if seconds > 0 else 0.0
    return algbw, algbw * (2 * (world_size - 1) / world_size)


def sweep_figures(rank_results: list, world_size: int) -> list[dict]:
    """Per size, the slowest rank's time (a collective ends when its last rank does) and its bandwidths."""
    per_size: dict = {}
    for res in rank_results:
        for row in res.get("sweep") or ():
            if "seconds_per_op" in row:
                per_size[row["bytes"]] = max(per_size.get(row["bytes"], 0.0), row["seconds_per_op"])
    out = []
    for nbytes, seconds in sorted(per_size.items()):
        algbw, busbw = bus_bandwidth(nbytes, seconds, world_size)
        out.append(
            {"bytes": nbytes, "size": size_words(nbytes), "seconds_per_op": seconds, "algbw_gbps": algbw,
             "busbw_gbps": busbw}
        )  # fmt: skip
    return out


def sweep_failure(rank_results: list) -> dict | None:
    """The smallest size at which a rank's all-reduce raised or summed wrong: ``{bytes, rank, error}``."""
    broken = []
    for res in rank_results:
        for row in res.get("sweep") or ():
            if "error" in row:
                broken.append({"bytes": row["bytes"], "rank": res.get("rank"), "error": row["error"]})
            elif row.get("max_abs_err", 0.0) != 0.0:
                err = f"wrong sum, max abs error {row['max_abs_err']}"
                broken.append({"bytes": row["bytes"], "rank": res.get("rank"), "error": err})
    return min(broken, key=lambda b: (b["bytes"], b["rank"] if b["rank"] is not None else -1), default=None)


def sweep_failure_message(broken: dict, passed: list[dict]) -> str:
    ok = f" after {passed[0]['size']} to {passed[-1]['size']} passed" if passed else ""
    return (
        f"broke at {size_words(broken['bytes'])} (rank {broken['rank']},"
        f" GPU {broken['rank']}: {broken['error'][-400:]}){ok}; a size that breaks where smaller ones pass is the"
        " communication library's fault (NCCL 2.26.2 on RTX PRO 6000 fails from 512 KiB, nccl #2418, fixed in 2.31.2):"
        " install the NCCL the profile pins, or set NCCL_P2P_DISABLE=1 where P2P over PCIe hangs"
    )


def baseline_busbw(baseline) -> dict[int, float]:
    """The host's figures from before, as bytes -> busbw: a sweep list (this module's result) or a mapping."""
    if isinstance(baseline, dict):
        baseline = baseline.get("sweep", baseline)
    if isinstance(baseline, dict):
        return {int(k): float(v) for k, v in baseline.items()}
    return {int(r["bytes"]): float(r["busbw_gbps"]) for r in baseline or () if "busbw_gbps" in r}


def read_baseline(value) -> tuple:
    """``(baseline, note)``: a path is read as the JSON write_sweep wrote; a missing or unreadable file is no baseline,
    with the reason."""
    if not isinstance(value, str):
        return value, None
    try:
        with open(value, encoding="utf-8") as fh:
            return json.load(fh), None
    except (OSError, ValueError) as exc:
        return None, f"no all-reduce figures from before the upgrade ({value}: {getattr(exc, 'strerror', None) or exc})"


def write_sweep(path: str, allreduce: dict, now=time.time) -> None:
    """Keep a passing sweep where the next run's post-check reads it (staging name, then rename)."""
    doc = {"world_size": allreduce["world_size"], "backend": allreduce["backend"], "recorded_at": now(),
           "sweep": allreduce.get("sweep") or []}  # fmt: skip
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    staging = f"{path}.partial-{os.getpid()}"
    with open(staging, "w", encoding="utf-8") as fh:
        json.dump(doc, fh, indent=2, sort_keys=True)
    os.replace(staging, path)


def judge_busbw(figures: list[dict], baseline, min_ratio: float | None, world_size: int) -> tuple[list, list]:
    """``(problems, compared)``: every size from BUSBW_COMPARED_FROM whose bus bandwidth fell below ``min_ratio``
    times this host's own figure from before. Nothing to compare (one GPU, no figure before, no ratio): empty."""
    before = baseline_busbw(baseline)
    if not (min_ratio and before and world_size > 1):
        return [], []
    compared = []
    for row in figures:
        old = before.get(row["bytes"])
        if row["bytes"] >= BUSBW_COMPARED_FROM and old:
            ratio = row["busbw_gbps"] / old
            compared.append({"bytes": row["bytes"], "size": row["size"], "busbw_gbps": row["busbw_gbps"],
                             "before_gbps": old, "ratio": ratio})  # fmt: skip
    low = [c for c in compared if c["ratio"] < min_ratio]
    if not low:
        return [], compared
    sizes = ", ".join(
        f"{c['size']} {c['busbw_gbps']:.1f} GB/s ({c['ratio']:.2f}x of {c['before_gbps']:.1f})" for c in low
    )
    return [
        f"all-reduce bus bandwidth below {min_ratio:g}x of this host's own figures from before the upgrade (profile"
        f" postcheck.smoke.allreduce_min_busbw_ratio) at {sizes}; fix: compare the venvs' NCCL versions and NCCL_*"
        " settings and read the GPUs' PCIe links (nvml_info) before putting the host back"
    ], compared


def judge_allreduce(
    rank_results: list, world_size: int, backend: str, baseline=None, min_busbw_ratio: float | None = None
) -> dict:
    """All ranks must report the sum 1 + 2 + ... + world_size in every element, at every size of the sweep; the
    sweep's bus bandwidth from 1 MiB on must stay above ``min_busbw_ratio`` times the host's ``baseline``."""
    expected = world_size * (world_size + 1) / 2
    by_rank = {r.get("rank"): r for r in rank_results}
    problems = []
    sweep = sweep_figures(rank_results, world_size) if world_size > 1 else []
    broken = sweep_failure(rank_results)
    if broken:
        passed = [row for row in sweep if row["bytes"] < broken["bytes"]]
        problems.append(sweep_failure_message(broken, passed))
        rank_results = [r for r in rank_results if not any("error" in row for row in r.get("sweep") or ())]
        by_rank = {r.get("rank"): r for r in rank_results}
    slow, compared = judge_busbw(sweep, baseline, min_busbw_ratio, world_size)
    problems += slow
    for rank in range(world_size) if not broken else ():
        res = by_rank.get(rank)
        if res is None:
            problems.append(f"rank {rank} (GPU {rank}) reported nothing")
        elif res.get("status") == "out_of_memory":
            problems.append(oom_message(f"rank {rank} (GPU {rank})", res, None))
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
    data.update(sweep=sweep, busbw_compared=compared)
    if problems:
        return outcome("failed", f"{backend} all-reduce over {world_size} rank(s): " + "; ".join(problems), **data)
    note = " (one GPU: the single-rank path only, no bandwidth to measure)" if world_size == 1 else ""
    bw = f", bus bandwidth {figures['busbw_gbps']:.1f} GB/s" if "busbw_gbps" in figures else ""
    if sweep:
        top = sweep[-1]
        bw += (
            f"; {sweep[0]['size']} to {top['size']} swept, bus bandwidth {top['busbw_gbps']:.1f} GB/s at {top['size']}"
        )
    if compared:
        bw += f", {min(c['ratio'] for c in compared):.2f}x of before at worst"
    return outcome("passed", f"{backend} all-reduce over {world_size} rank(s) gave {expected:g}{bw}{note}", **data)


FAILED = ("failed", "error", "out_of_memory")


def summarize(host_checks: dict, gpus: list, allreduce: dict | None) -> dict:
    failures = [c["message"] for c in host_checks.values() if c["status"] in FAILED]
    for gpu in gpus:
        failures += [c["message"] for c in gpu["checks"].values() if c["status"] in FAILED]
    if allreduce and allreduce["status"] in FAILED:
        failures.append(allreduce["message"])
    return {"passed": not failures, "failures": failures}


# ------------------------------------------------------------------------------------------------- memory


def oom_message(what: str, raw: dict, held: dict | None) -> str:
    """An allocation that did not fit, told as that: what was free, what the server and others hold, the fix."""
    mem = raw.get("memory") or {}
    seen = []
    if "free_before_mib" in mem:
        seen.append(f"{mem['free_before_mib']} MiB of {mem.get('total_mib', '?')} MiB were free when it started")
    if "free_after_mib" in mem:
        seen.append(f"{mem['free_after_mib']} MiB when it failed (its own peak: {mem.get('peak_reserved_mib')} MiB)")
    seen.append(holders_text(held))
    error = str(raw.get("error") or raw.get("status"))[-300:]
    return (
        f"{what}: out of memory, not a kernel error: " + "; ".join(seen) + "; fix: leave the smoke test room beside"
        " the server (the server's --mem-fraction-static, postcheck_smoke_matmul_size,"
        f" postcheck_smoke_allreduce_size_mb) or stop what else holds the GPU (error: {error})"
    )


def holders_text(held: dict | None) -> str:
    if not held:
        return "what the server holds is unknown (NVML was not readable before the run)"
    parts = []
    if held.get("server_pids") is None:
        parts.append(f"processes {_pids(held['other_pids'])} hold {held['other_mib']} MiB (the server was not named)")
    else:
        parts.append(f"the serving unit's processes {_pids(held['server_pids'])} hold {held['server_mib']} MiB")
        if held["other_pids"]:
            parts.append(f"other processes {_pids(held['other_pids'])} {held['other_mib']} MiB")
    return ", ".join(parts) + f" ({held['used_mib']} of {held['total_mib']} MiB in use before the smoke test)"


def _pids(pids) -> str:
    return ", ".join(str(p) for p in pids) if pids else "(none)"


def check_memory(checks: dict) -> dict:
    """Per check the memory figures its worker measured on this GPU (MemoryProbe), and the largest."""
    per_check = {name: c.get("raw", {}).get("memory") for name, c in checks.items()}
    per_check = {name: m for name, m in per_check.items() if isinstance(m, dict) and "peak_reserved_mib" in m}
    if not per_check:
        return {"checks": {}}
    peak = max(per_check, key=lambda n: per_check[n]["peak_reserved_mib"])
    return {
        "checks": per_check,
        "peak_check": peak,
        "peak_reserved_mib": per_check[peak]["peak_reserved_mib"],
        "peak_allocated_mib": max(m.get("peak_allocated_mib", 0) for m in per_check.values()),
        "peak_device_used_mib": max(m.get("device_used_after_mib", 0) for m in per_check.values()),
    }


def memory_summary(gpus: list, allreduce: dict | None) -> dict:
    """The smoke test's largest footprint on any GPU, which check it was, and the all-reduce's (a separate process
    per GPU, after the per-GPU checks): what must fit beside a server."""
    out = {"peak_reserved_mib": None, "peak": None, "allreduce_peak_reserved_mib": None}
    for gpu in gpus:
        mem = gpu.get("memory") or {}
        if mem.get("peak_reserved_mib") is not None and (
            out["peak_reserved_mib"] is None or mem["peak_reserved_mib"] > out["peak_reserved_mib"]
        ):
            out["peak_reserved_mib"] = mem["peak_reserved_mib"]
            out["peak"] = f"GPU {gpu.get('index')} {mem['peak_check']}"
    ranks = [r.get("memory") for r in (allreduce or {}).get("ranks", []) if isinstance(r.get("memory"), dict)]
    reserved = [m["peak_reserved_mib"] for m in ranks if "peak_reserved_mib" in m]
    if reserved:
        out["allreduce_peak_reserved_mib"] = max(reserved)
        out["allreduce_peak_device_used_mib"] = max(m.get("device_used_after_mib", 0) for m in ranks)
    return out


def out_of_memory_messages(host_checks: dict, gpus: list, allreduce: dict | None) -> list[str]:
    """The failures that were a GPU running out of memory, not a wrong kernel."""
    out = [c["message"] for c in host_checks.values() if c["status"] == "out_of_memory"]
    for gpu in gpus:
        out += [c["message"] for c in gpu["checks"].values() if c["status"] == "out_of_memory"]
    ranks = (allreduce or {}).get("ranks", [])
    if any(r.get("status") == "out_of_memory" for r in ranks):
        out.append(allreduce["message"])
    return out


def env_report(serving_env: dict, env: dict, extra: dict, source: dict) -> dict:
    """Where the workers' environment came from and what the module changed in it (names and values of those
    only: the serving environment may hold secrets)."""
    changed = {k: env[k] for k in sorted(env) if serving_env.get(k) != env[k]}
    return {
        "source": source,
        "changed": changed,
        "from_caller": sorted(extra or {}),
        "names": sorted(env),
    }


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
    proc = popen(  # pylint: disable=ansible-bad-function
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
            popen(  # pylint: disable=ansible-bad-function
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


# ------------------------------------------------------------------------------------------ per-SM settings

TOLERANCE_KEYS = tuple(DEFAULT_TOLERANCES)
# Single-prefill backends flashinfer 0.6 picks per SM: fa3 (wgmma, TMA) exists for Hopper only; every SM >= 7.5
# runs fa2. A profile's postcheck.smoke.per_sm[].prefill_backends replaces this.
FA3_MAJORS = (9,)


def sm_key(value) -> str | None:
    """One spelling of an SM for comparisons: '9.0', 'sm_90', 'sm_90a', '90', (9, 0) -> '9.0'; '12.0' stays."""
    if value is None:
        return None
    if isinstance(value, (tuple, list)) and len(value) == 2:
        return f"{int(value[0])}.{int(value[1])}"
    text = str(value).strip().lower()
    if text.startswith(("sm_", "compute_")):
        text = text.split("_", 1)[1].rstrip("af")
        if not text.isdigit() or len(text) < 2:
            return None
        return f"{int(text[:-1])}.{text[-1]}"  # the last digit is the minor version: sm_120 -> 12.0
    major, minor = text.partition(".")[::2]
    if major.isdigit() and minor.isdigit() and len(minor) == 1:
        return f"{int(major)}.{minor}"
    if text.isdigit() and len(text) >= 2:
        return f"{int(text[:-1])}.{text[-1]}"
    return None


def sm_major(sm: str) -> int:
    return int(sm.split(".")[0])


def sm_name(sm: str, suffix: str = "") -> str:
    """'12.0' -> 'sm_120' (suffix 'a' -> 'sm_120a')."""
    major, minor = sm.split(".")
    return f"sm_{major}{minor}{suffix}"


def arch_variants(sm: str) -> list[str]:
    """What nvcc must build for a target: sm_XX, and the arch-specific sm_XXa that every SM from Hopper on has
    (wgmma, tcgen05 and the like live only there; flashinfer builds its kernels for it)."""
    return [sm_name(sm), sm_name(sm, "a")] if sm_major(sm) >= 9 else [sm_name(sm)]


def flashinfer_arch(sm: str) -> str:
    """The FLASHINFER_CUDA_ARCH_LIST entry flashinfer itself picks for a GPU of this SM (compilation_context.py)."""
    return f"{sm}a" if sm_major(sm) >= 9 else sm


def per_sm_settings(per_sm, sm: str | None) -> dict:
    """The profile's settings for one SM (postcheck.smoke.per_sm[] with that sm), or {}."""
    for entry in per_sm or ():
        if sm_key(entry.get("sm")) == sm:
            return entry
    return {}


def tolerances_for(base: dict | None, per_sm, sm: str | None) -> dict:
    """The run's tolerances, with the profile's per-SM values for this SM winning where set."""
    entry = per_sm_settings(per_sm, sm)
    extra = {k: entry[k] for k in TOLERANCE_KEYS if entry.get(k) is not None}
    return dict(base or {}, **extra)


def prefill_backends_for(per_sm, sm: str) -> list[str]:
    entry = per_sm_settings(per_sm, sm)
    if entry.get("prefill_backends"):
        return list(entry["prefill_backends"])
    return ["fa2", "fa3"] if sm_major(sm) in FA3_MAJORS else ["fa2"]


def judge_probes(raw: dict, gpu: dict, expected) -> dict:
    """capability_probes is reported; a profile's per-SM expected_probes must read true on a GPU of that SM."""
    if not expected:
        return outcome("info", "", raw=raw)
    probes = raw.get("flashinfer_probes")
    if not isinstance(probes, dict):
        return outcome(
            "failed",
            f"{gpu_label(gpu)}: capability_probes: flashinfer's probes were not read ({raw.get('flashinfer')}),"
            f" the profile expects {', '.join(expected)} (postcheck.smoke.per_sm)",
            raw=raw,
        )
    wrong = {name: probes.get(name, "absent") for name in expected if probes.get(name) is not True}
    if wrong:
        seen = ", ".join(f"{name} = {value}" for name, value in wrong.items())
        return outcome(
            "failed",
            f"{gpu_label(gpu)} ({gpu.get('sm')}): capability_probes: {seen}, the profile expects true"
            " (postcheck.smoke.per_sm[].expected_probes); a torch or flashinfer build without this SM's"
            " arch-specific kernels is the usual cause",
            raw=raw,
        )
    return outcome("passed", f"{gpu_label(gpu)}: {', '.join(expected)} true", raw=raw)


# ------------------------------------------------------------------------------------------ build check


def build_plan(target_sms, devices, per_sm=None) -> list[dict]:
    """One entry per SM to build for: the profile's targets and the SMs of this host's GPUs, in SM order.

    A target with a GPU here is compiled and run on the first such GPU; the others are compiled and inspected only.
    """
    wanted = {}
    for sm in target_sms or ():
        key = sm_key(sm)
        if key is None:
            raise ValueError(f"target SM {sm!r} is not an SM such as '9.0' or '12.0'")
        wanted.setdefault(key, {"from_profile": True, "gpus": []})
    for device in devices:
        key = sm_key(device.get("sm"))
        if key is not None:
            wanted.setdefault(key, {"from_profile": False, "gpus": []})["gpus"].append(device["index"])
    plan = []
    for sm in sorted(wanted, key=lambda k: tuple(int(p) for p in k.split("."))):
        gpus = wanted[sm]["gpus"]
        plan.append(
            {
                "sm": sm,
                "check": f"build_{sm_name(sm)}",
                "variants": arch_variants(sm),
                "flashinfer_arch": flashinfer_arch(sm),
                "prefill_backends": prefill_backends_for(per_sm, sm),
                "from_profile": wanted[sm]["from_profile"],
                "host_gpus": gpus,
                "run_index": gpus[0] if gpus else None,
            }
        )
    return plan


def target_env(env: dict, target: dict, workspace: str) -> dict:
    """The worker's environment for one target: the serving environment as it is, with flashinfer building for that
    arch only, into a scratch workspace (so nothing is left in the serving user's cache for an SM the host does not
    have). Nothing is taken out: a variable that turns the JIT off makes the build fail here as it would for the
    server (judge_build names it)."""
    out = dict(env)
    out["FLASHINFER_CUDA_ARCH_LIST"] = target["flashinfer_arch"]
    out["FLASHINFER_WORKSPACE_BASE"] = workspace
    return out


def _judge_toolkit(toolkit: dict, expected_cuda: str | None, problems: list):
    if not toolkit.get("nvcc"):
        problems.append(f"no nvcc found (CUDA_HOME={toolkit.get('cuda_home')!r}); set CUDA_HOME to the new toolkit")
    elif expected_cuda and toolkit.get("nvcc_release") != expected_cuda:
        problems.append(
            f"nvcc {toolkit['nvcc']} is release {toolkit.get('nvcc_release')}, the profile targets {expected_cuda};"
            f" set CUDA_HOME to the CUDA {expected_cuda} toolkit"
        )


def _elf_problem(what, arch, elf) -> str | None:
    """None when cuobjdump lists SASS for arch in the file (or there is no cuobjdump: reported elsewhere)."""
    if elf is None:
        return None
    if elf.get("error"):
        return f"cuobjdump could not read {what}: {elf['error']}"
    if arch not in elf.get("images", []):
        return f"cuobjdump finds no {arch} SASS in {what} (ELF images: {elf.get('images')})"
    return None


def _judge_nvcc(raw_nvcc: dict, target: dict, problems: list, inspected: list) -> list:
    built = []
    for variant in target["variants"]:
        got = raw_nvcc.get(variant) or {"rc": None, "error": "not attempted"}
        if got.get("rc") != 0:
            problems.append(f"nvcc cannot build {variant}: {str(got.get('error') or '').strip()[-300:]}")
            continue
        built.append(variant)
        elf = got.get("elf")
        problem = _elf_problem("nvcc's output", variant, elf)
        sass = got.get("sass") or {}
        if problem is None and "instructions" in sass:
            if sass["instructions"] <= 0 or variant not in sass.get("arches", []):
                problem = f"cuobjdump --dump-sass shows no {variant} instructions ({sass})"
        if problem:
            problems.append(problem)
        elif elf is not None:
            inspected.append(variant)
    return built


def _judge_flashinfer(raw_fi: dict, target: dict, params: dict, problems: list, inspected: list) -> list:
    if raw_fi.get("status") == "missing_package":
        package = raw_fi.get("package") or "flashinfer"
        status, why = resolve_missing(package, params.get("required_packages"), params.get("python", "python"))
        if status == "failed":
            problems.append(why)
        return []
    if raw_fi.get("error"):
        problems.append(f"flashinfer could not be prepared: {raw_fi['error'][-400:]}")
        return []
    if not raw_fi.get("modules"):
        problems.append("flashinfer's JIT built no module (the worker reported none)")
        return []
    built = []
    arch = sm_name(target["sm"], "a" if target["flashinfer_arch"].endswith("a") else "")
    for name, mod in sorted(raw_fi["modules"].items()):
        if not mod.get("built"):
            problems.append(f"flashinfer's JIT cannot build {name} for {target['flashinfer_arch']}: {mod.get('error')}")
            continue
        built.append(name)
        problem = _elf_problem(f"flashinfer's {name}", arch, mod.get("elf"))
        if problem:
            problems.append(problem)
        elif mod.get("elf") is not None:
            inspected.append(f"flashinfer {name}")
    return built


def _judge_run(raw_run: dict | None, target: dict, params: dict, problems: list) -> list:
    """The freshly built kernels on this host's GPU of the target SM; a target with such a GPU must have run them."""
    if not raw_run:
        problems.append(
            f"the freshly built kernels did not run on GPU {target['run_index']} (the worker reported no run)"
        )
        return []
    if raw_run.get("not_run"):
        problems.append(f"not run on GPU {target['run_index']}: {raw_run['not_run']}")
        return []
    if raw_run.get("sm") and sm_key(raw_run["sm"]) != target["sm"]:
        problems.append(f"the run landed on GPU {raw_run.get('index')} of {raw_run['sm']}, not SM {target['sm']}")
    ran = []
    gpu = {"index": raw_run.get("index"), "uuid": raw_run.get("uuid")}
    for check in sorted(FLASHINFER_CHECKS):
        got = raw_run.get(check)
        if got is None:
            problems.append(f"freshly built, {gpu_label(gpu)}: {check} did not run")
            continue
        verdict = judge_kernel(check, got, gpu, params)
        if verdict["status"] == "passed":
            ran.append(check.replace("flashinfer_", ""))
        elif verdict["status"] != "skipped":
            problems.append(f"freshly built, {verdict['message']}")
    return ran


def judge_build_target(raw: dict, target: dict, arch_list, expected_cuda: str | None, params: dict) -> dict:
    """What the stack built, inspected and ran for one target SM; failed when it cannot build for it."""
    problems, inspected = [], []
    status = raw.get("status")
    if status in ("timeout", "error", "not_run"):
        problems.append(f"the build worker: {raw.get('error')}")
        raw = {}
    _judge_toolkit(raw.get("toolkit", {}), expected_cuda, problems)
    nvcc_built = _judge_nvcc(raw.get("nvcc", {}), target, problems, inspected)
    fi_built = _judge_flashinfer(raw.get("flashinfer", {}), target, params, problems, inspected)
    ran = []
    if target["run_index"] is not None and fi_built:
        ran = _judge_run(raw.get("run"), target, params, problems)
    if sm_name(target["sm"]) not in (arch_list or []):
        problems.append(
            f"torch.cuda.get_arch_list() {arch_list} lacks {sm_name(target['sm'])}: torch has no kernels for it;"
            " install a torch build that lists it"
        )
    no_inspector = (raw.get("toolkit") or {}).get("cuobjdump") is None and bool(raw)
    summary = _build_summary(target, nvcc_built, fi_built, inspected, ran, no_inspector)
    if _extra_modules(raw):
        summary += f" (the run also compiled {', '.join(_extra_modules(raw))})"
    who = f"SM {target['sm']}"
    data = {
        "sm": target["sm"],
        "built": {"nvcc": nvcc_built, "flashinfer": fi_built, "flashinfer_arch": target["flashinfer_arch"]},
        "inspected": inspected,
        "ran": ran,
        "run_on": None if target["run_index"] is None else f"GPU {target['run_index']}",
        "not_run_reason": None if target["run_index"] is not None else f"no SM {target['sm']} GPU on this host",
        "raw": raw,
    }
    if problems:
        return outcome("failed", f"{who}: the stack cannot build or run kernels for it: " + "; ".join(problems), **data)
    return outcome("passed", f"{who}: {summary}", **data)


def _build_summary(target, nvcc_built, fi_built, inspected, ran, no_inspector) -> str:
    parts = [f"built by nvcc for {', '.join(nvcc_built)}"]
    if fi_built:
        parts.append(f"flashinfer JIT built {', '.join(fi_built)} for {target['flashinfer_arch']}")
    else:
        parts.append("no flashinfer module built (flashinfer is not installed and not required)")
    if no_inspector:
        parts.append("SASS not inspected (no cuobjdump in the toolkit: add the cuda_cuobjdump component)")
    elif inspected:
        parts.append(f"cuobjdump shows {sm_name(target['sm'])}* SASS in {', '.join(inspected)}")
    if target["run_index"] is None:
        done = "built and inspected" if inspected else "built"
        parts.append(f"{done}, not run (no SM {target['sm']} GPU on this host)")
    elif ran:
        parts.append(f"ran on GPU {target['run_index']} within tolerance: {', '.join(ran)}")
    return "; ".join(parts)


def _extra_modules(raw: dict) -> list:
    """Modules the run compiled besides the built ones: its kernels then differ from what the build step proved."""
    return list((raw.get("run") or {}).get("extra_modules") or [])


def judge_build(results: dict, plan: list, arch_list, expected_cuda: str | None, params: dict, per_sm=None) -> dict:
    """The host check build_targets: every target's outcome and the targets the stack cannot build for."""
    targets = {}
    for target in plan:
        tol = tolerances_for(params.get("tolerances"), per_sm, target["sm"])
        raw = results.get(target["check"], {"status": "not_run", "error": "the build worker reported nothing"})
        targets[target["sm"]] = judge_build_target(raw, target, arch_list, expected_cuda, dict(params, tolerances=tol))
    cannot = [sm for sm, got in targets.items() if got["status"] != "passed"]
    data = {"targets": targets, "cannot_build": cannot, "run_on_host": [t["sm"] for t in plan if t["host_gpus"]]}
    messages = [got["message"] for got in targets.values()]
    if cannot:
        # what in the serving environment turns the JIT off (params env_flags): the likely cause, named
        flags = "".join(f"; the serving environment sets {flag}" for flag in params.get("env_flags") or ())
        return outcome(
            "failed",
            "build_targets: " + " | ".join(targets[sm]["message"] for sm in cannot) + flags,
            **data,
        )
    return outcome("passed", "build_targets: " + " | ".join(messages), **data)
