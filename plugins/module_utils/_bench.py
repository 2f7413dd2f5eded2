# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Benchmark statistics and gates for spec_decode_bench: plain functions, no Ansible, no I/O.

A *request record* is a dict of one request's outcome:
  ok (bool), error (str|None), prompt_tokens, completion_tokens, spec_verify_ct (int|None),
  ttft_s, e2e_s (float|None), itl_s (list of gaps between streamed chunks, seconds).
A *run* is one pass over the prompt set at one concurrency: its records and its wall time.
Latencies are reported in milliseconds, as sglang.bench_serving does.
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics

RESULT_SCHEMA = "gpufleet.spec_decode_bench/1"


def prompt_set_info(prompt_set):
    """Name, sha256 of the canonical JSON of the prompts, and their count: what makes results comparable."""
    canonical = json.dumps(list(prompt_set["prompts"]), sort_keys=True, separators=(",", ":"))
    return {
        "name": prompt_set["name"],
        "sha256": hashlib.sha256(canonical.encode()).hexdigest(),
        "prompts": len(prompt_set["prompts"]),
        "output_tokens": sum(p["max_new_tokens"] for p in prompt_set["prompts"]),
    }


def run_requests(prompts, concurrency):
    """One run at concurrency c sends the prompt set c times, so every one of the c streams is busy."""
    return [p for _copy in range(concurrency) for p in prompts]


def warmup_requests(prompts, warmup):
    """The first `warmup` prompts of the set, cycling when warmup exceeds its size."""
    return [prompts[i % len(prompts)] for i in range(warmup)] if prompts else []


def plan(prompt_set, repeats, warmup, concurrency):
    """What a benchmark sends: per concurrency level, repeats x (prompts x concurrency) requests."""
    prompts = list(prompt_set["prompts"])
    levels = [
        {
            "concurrency": c,
            "repeats": repeats,
            "requests_per_run": len(run_requests(prompts, c)),
            "output_tokens_per_run": sum(p["max_new_tokens"] for p in run_requests(prompts, c)),
        }
        for c in concurrency
    ]
    return {
        "prompt_set": prompt_set_info(prompt_set),
        "warmup_requests": len(warmup_requests(prompts, warmup)),
        "levels": levels,
        "total_requests": len(warmup_requests(prompts, warmup))
        + sum(lv["requests_per_run"] * repeats for lv in levels),
    }


def server_summary(info):
    """What a result keeps of /server_info: fields of SGLang's ServerArgs, its version and internal_states[0]."""
    internal = (info.get("internal_states") or [{}])[0] or {}
    return {
        "version": info.get("version"),
        "model_path": info.get("model_path"),
        "served_model_name": info.get("served_model_name"),
        "speculative_algorithm": info.get("speculative_algorithm"),
        "speculative_draft_model_path": info.get("speculative_draft_model_path"),
        "speculative_num_steps": info.get("speculative_num_steps"),
        "speculative_eagle_topk": info.get("speculative_eagle_topk"),
        "speculative_num_draft_tokens": info.get("speculative_num_draft_tokens"),
        "avg_spec_accept_length": internal.get("avg_spec_accept_length"),
    }


def percentile(values, pct):
    """Percentile with linear interpolation between closest ranks (numpy's default); None when empty."""
    ordered = sorted(values)
    if not ordered:
        return None
    rank = (len(ordered) - 1) * pct / 100.0
    low = math.floor(rank)
    high = math.ceil(rank)
    if low == high:
        return float(ordered[low])
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summarize(values, scale=1.0):
    """count, mean, p50, p95, p99, max of values multiplied by scale (None fields when empty)."""
    scaled = [v * scale for v in values if v is not None]
    if not scaled:
        return {"count": 0, "mean": None, "p50": None, "p95": None, "p99": None, "max": None}
    return {
        "count": len(scaled),
        "mean": statistics.fmean(scaled),
        "p50": percentile(scaled, 50),
        "p95": percentile(scaled, 95),
        "p99": percentile(scaled, 99),
        "max": max(scaled),
    }


def coefficient_of_variation(values):
    """Sample standard deviation / mean; None with fewer than two values or a zero mean."""
    values = [v for v in values if v is not None]
    if len(values) < 2:
        return None
    mean = statistics.fmean(values)
    if mean == 0:
        return None
    return statistics.stdev(values) / mean


def accept_length(record):
    """Tokens accepted per verify step of one request (completion_tokens / spec_verify_ct)."""
    verify = record.get("spec_verify_ct")
    if not record.get("ok") or not verify:
        return None
    return record["completion_tokens"] / verify


def tpot_s(record):
    """Time per output token after the first: (e2e - ttft) / (completion_tokens - 1)."""
    if not record.get("ok") or record.get("ttft_s") is None or record.get("e2e_s") is None:
        return None
    if record.get("completion_tokens", 0) < 2:
        return None
    return (record["e2e_s"] - record["ttft_s"]) / (record["completion_tokens"] - 1)


def run_stats(records, wall_s):
    """Statistics of one run: throughput over the run's wall time, latency summaries, accept length."""
    ok = [r for r in records if r.get("ok")]
    tokens = sum(r["completion_tokens"] for r in ok)
    verify = sum(r["spec_verify_ct"] for r in ok if r.get("spec_verify_ct"))
    verified_tokens = sum(r["completion_tokens"] for r in ok if r.get("spec_verify_ct"))
    per_request_accept = [a for a in (accept_length(r) for r in ok) if a is not None]
    return {
        "requests": len(records),
        "completed": len(ok),
        "failed": len(records) - len(ok),
        "wall_s": wall_s,
        "input_tokens": sum(r.get("prompt_tokens") or 0 for r in ok),
        "output_tokens": tokens,
        "output_tok_s": tokens / wall_s if wall_s > 0 else None,
        "request_throughput": len(ok) / wall_s if wall_s > 0 else None,
        "accept_length": verified_tokens / verify if verify else None,
        "accept_length_per_request": summarize(per_request_accept),
        "ttft_ms": summarize([r.get("ttft_s") for r in ok], 1000.0),
        "itl_ms": summarize([gap for r in ok for gap in r.get("itl_s") or []], 1000.0),
        "tpot_ms": summarize([tpot_s(r) for r in ok], 1000.0),
        "e2e_ms": summarize([r.get("e2e_s") for r in ok], 1000.0),
        "errors": [r["error"] for r in records if not r.get("ok")],
    }


def level_stats(concurrency, runs):
    """Aggregate of the repeats at one concurrency.

    runs: list of (records, wall_s). Throughput is averaged over runs (with its coefficient of
    variation across repeats); latency percentiles pool every request of every run.
    """
    per_run = [run_stats(records, wall_s) for records, wall_s in runs]
    pooled = [r for records, _wall in runs for r in records]
    pooled_stats = run_stats(pooled, sum(wall for _records, wall in runs))
    throughputs = [s["output_tok_s"] for s in per_run]
    request_rates = [s["request_throughput"] for s in per_run]
    valid = [t for t in throughputs if t is not None]
    return {
        "concurrency": concurrency,
        "repeats": len(per_run),
        "output_tok_s": {
            "mean": statistics.fmean(valid) if valid else None,
            "min": min(valid) if valid else None,
            "max": max(valid) if valid else None,
            "cv": coefficient_of_variation(throughputs),
        },
        "request_throughput": {
            "mean": statistics.fmean([r for r in request_rates if r is not None]) if valid else None,
            "cv": coefficient_of_variation(request_rates),
        },
        "accept_length": pooled_stats["accept_length"],
        "accept_length_per_request": pooled_stats["accept_length_per_request"],
        "ttft_ms": pooled_stats["ttft_ms"],
        "itl_ms": pooled_stats["itl_ms"],
        "tpot_ms": pooled_stats["tpot_ms"],
        "e2e_ms": pooled_stats["e2e_ms"],
        "requests": pooled_stats["requests"],
        "failed": pooled_stats["failed"],
        "errors": pooled_stats["errors"],
        "runs": per_run,
    }


def headline(levels):
    """Output tok/s of the lowest concurrency: the single-stream figure the upgrade is judged by."""
    measured = [lv for lv in levels if lv["output_tok_s"]["mean"] is not None]
    if not measured:
        return None
    return min(measured, key=lambda lv: lv["concurrency"])["output_tok_s"]["mean"]


def _by_concurrency(levels):
    return {lv["concurrency"]: lv for lv in levels or [] if lv.get("output_tok_s", {}).get("mean") is not None}


def extract_result(data):
    """Accept a result in the forms it is stored in: the module's whole return, or its `bench`."""
    if isinstance(data, dict) and isinstance(data.get("bench"), dict):
        data = data["bench"]
    if not isinstance(data, dict) or not isinstance(data.get("levels"), list):
        raise ValueError("not a spec_decode_bench result: expected a mapping with a 'levels' list")
    return data


def comparability(current, other):
    """Reasons two results cannot be compared (different prompt set, API, speculation mode)."""
    reasons = []
    cur_set, oth_set = current.get("prompt_set") or {}, other.get("prompt_set") or {}
    if cur_set.get("name") != oth_set.get("name") or cur_set.get("sha256") != oth_set.get("sha256"):
        reasons.append(
            f"prompt set differs ({cur_set.get('name')}/{str(cur_set.get('sha256'))[:12]} vs "
            f"{oth_set.get('name')}/{str(oth_set.get('sha256'))[:12]})"
        )
    if current.get("api") != other.get("api"):
        reasons.append(f"API differs ({current.get('api')} vs {other.get('api')})")
    return reasons


def _pct_change(before, after):
    return (after - before) / before * 100.0


def _regression_text(check, limit):
    verb = "fell" if check["change_pct"] < 0 else "went"
    return (
        f"output throughput at concurrency {check['concurrency']} {verb} from {check['baseline_tok_s']:.1f} "
        f"to {check['current_tok_s']:.1f} tok/s ({check['change_pct']:+.1f}%, limit -{limit:g}%)"
    )


def _spec_text(check, minimum):
    loss = ": speculative decoding is a net loss" if check["speedup"] < 1 else ""
    return (
        f"at concurrency {check['concurrency']} speculation gives {check['spec_tok_s']:.1f} tok/s vs "
        f"{check['nospec_tok_s']:.1f} without (x{check['speedup']:.3f}, minimum x{minimum:g}){loss}"
    )


def regression_gate(current, baseline, max_regression_pct):
    """Fail when output tok/s at a concurrency measured in both fell more than max_regression_pct."""
    gate = {"name": "regression", "limit_pct": max_regression_pct, "checks": [], "skipped": False}
    reasons = comparability(current, baseline)
    if current.get("speculative") != baseline.get("speculative"):
        reasons.append(
            f"speculation differs (current {current.get('speculative')}, baseline {baseline.get('speculative')})"
        )
    if reasons:
        gate.update(passed=False, message="baseline is not comparable: " + "; ".join(reasons))
        return gate
    cur, base = _by_concurrency(current["levels"]), _by_concurrency(baseline["levels"])
    for conc in sorted(set(cur) & set(base)):
        before, after = base[conc]["output_tok_s"]["mean"], cur[conc]["output_tok_s"]["mean"]
        change = _pct_change(before, after)
        gate["checks"].append(
            {
                "concurrency": conc,
                "baseline_tok_s": before,
                "current_tok_s": after,
                "change_pct": change,
                "passed": -change <= max_regression_pct,
            }
        )
    if not gate["checks"]:
        gate.update(passed=False, message="no concurrency level was measured in both the baseline and this run")
        return gate
    failed = [c for c in gate["checks"] if not c["passed"]]
    gate["passed"] = not failed
    gate["message"] = "; ".join(_regression_text(c, max_regression_pct) for c in (failed or gate["checks"]))
    return gate


def spec_gate(spec, nospec, min_spec_speedup):
    """Fail when speculative decoding is slower than min_spec_speedup x the run without speculation."""
    gate = {"name": "speculation", "min_speedup": min_spec_speedup, "checks": [], "skipped": False}
    reasons = comparability(spec, nospec)
    if not spec.get("speculative"):
        reasons.append("the measured server does not run speculative decoding")
    if nospec.get("speculative"):
        reasons.append("the reference run used speculative decoding too")
    if reasons:
        gate.update(passed=False, message="cannot judge speculation: " + "; ".join(reasons))
        return gate
    sp, ns = _by_concurrency(spec["levels"]), _by_concurrency(nospec["levels"])
    for conc in sorted(set(sp) & set(ns)):
        with_spec, without = sp[conc]["output_tok_s"]["mean"], ns[conc]["output_tok_s"]["mean"]
        speedup = with_spec / without
        gate["checks"].append(
            {
                "concurrency": conc,
                "spec_tok_s": with_spec,
                "nospec_tok_s": without,
                "speedup": speedup,
                "passed": speedup >= min_spec_speedup,
            }
        )
    if not gate["checks"]:
        gate.update(passed=False, message="no concurrency level was measured both with and without speculation")
        return gate
    failed = [c for c in gate["checks"] if not c["passed"]]
    gate["passed"] = not failed
    gate["message"] = "; ".join(_spec_text(c, min_spec_speedup) for c in (failed or gate["checks"]))
    return gate


def error_gate(levels, max_error_rate):
    """Fail when the share of failed requests exceeds max_error_rate (0 = any error fails)."""
    total = sum(lv["requests"] for lv in levels)
    failed = sum(lv["failed"] for lv in levels)
    rate = failed / total if total else 1.0
    first = next((e for lv in levels for e in lv["errors"]), None)
    passed = total > 0 and rate <= max_error_rate
    message = f"{failed} of {total} requests failed ({rate * 100:.1f}%, limit {max_error_rate * 100:.1f}%)"
    if first:
        message += "; first error: " + first
    return {
        "name": "errors",
        "passed": passed,
        "skipped": False,
        "failed": failed,
        "requests": total,
        "error_rate": rate,
        "limit": max_error_rate,
        "message": message,
    }


def skipped_gate(name, why):
    return {"name": name, "passed": True, "skipped": True, "checks": [], "message": why}
