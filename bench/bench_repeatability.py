# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Repeatability of spec_decode_bench on a controlled server, and the regression threshold it supports.

    .venv/bin/python bench/bench_repeatability.py [--runs 10] [--profile cu130] [--stack new] [--max-cv-pct 2]

Starts the lab's SGLang stand-in on loopback (a subprocess, EAGLE-3, as bench/spec_decode_lab.py does) and runs
the benchmark the post-check runs (the module's own Bench class, with the prompt set, repeats, warm-up and
concurrency levels of the profile's postcheck.bench) --runs times, each against a fresh server. It prints each
run's output tok/s per level (the mean over the run's repeats: the figure the regression gate compares) and, per
level, the mean, standard deviation, coefficient of variation (CV) and the largest |run - median| in %. It exits
1 when the CV of any level exceeds --max-cv-pct.

The stand-in's timing is deterministic (lab_sglang/timing.py), so what varies here is the benchmark itself: the
client, HTTP on loopback and the machine's scheduler, and other work on the machine, which slows the client's
threads as it would on a busy host (the load average is printed at the start and the end; compare figures taken
at a low load). The stand-in has no jitter option, so a real server's own noise (clocks, batching) is not
measured: the threshold derived on a quiet machine is a floor, the smallest max_regression_pct this benchmark can
resolve, not proof that a real fleet is that quiet.

Threshold. The regression gate fails a host when (current - baseline) / baseline < -max_regression_pct at any
level, comparing two runs' means. With no real change, that difference has a standard deviation of sqrt(2) x
CV (two independent runs). It must not fire on noise, so

    threshold >= k x CV,  k = z(1 - alpha) x sqrt(2) x u

- alpha = 1e-5, z = 4.26: the chance that one level's check fires on noise alone. An upgrade of 500 hosts gated at
  two levels makes 1000 checks; with this alpha it fails a healthy host spuriously with a chance of about 1 %.
- u = sqrt((n - 1) / chi2(0.05; n - 1)): the CV is estimated from n runs only; u turns it into its one-sided 95 %
  upper confidence bound (1.64 for n = 10), so a lucky quiet sample does not set the threshold.

k is about 9.9 for 10 runs. The threshold printed is the larger of k x CV (worst level) and the largest drop seen
between any two of the runs (max - min) / max, rounded up to 0.5 %, and is compared with the profile's
max_regression_pct.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COLLECTIONS = REPO / ".venv" / "collections"
sys.path.insert(0, str(COLLECTIONS))

from spec_decode_lab import start  # noqa: E402

ALPHA = 1e-5
CONFIDENCE = 0.95
# The post-check's arguments that come from the profile's postcheck.bench (roles/postcheck/vars/main.yml).
PROFILE_ARGS = ("prompt_set", "repeats", "warmup", "concurrency")


def collection():
    """The module code, imported as the collection; `make setup` links the checkout under .venv/collections."""
    if (COLLECTIONS / "ansible_collections" / "gpufleet" / "upgrade").resolve() != REPO:
        sys.exit(f"{COLLECTIONS} does not link this checkout as gpufleet.upgrade: run `make setup` first")
    from ansible_collections.gpufleet.upgrade.plugins.module_utils import _bench
    from ansible_collections.gpufleet.upgrade.plugins.modules import spec_decode_bench
    from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _profile

    return _bench, spec_decode_bench, _profile


def bench_params(spec_decode_bench, bench_profile, label):
    """The module's defaults, overridden by the profile as the post-check role does."""
    params = {name: option.get("default") for name, option in spec_decode_bench.argument_spec().items()}
    params.update({name: bench_profile[name] for name in PROFILE_ARGS if name in bench_profile})
    params.update(label=label, fail_on_gate=False)
    problems = spec_decode_bench.check_numbers(params)
    if problems:
        sys.exit("the profile's postcheck.bench is not usable: " + "; ".join(problems))
    return params


def chi2_quantile(p, dof):
    """Wilson-Hilferty approximation of the chi-square quantile: 0.3 % low at dof 9, 7 % at dof 3 (a larger k)."""
    z = statistics.NormalDist().inv_cdf(p)
    return dof * (1 - 2 / (9 * dof) + z * math.sqrt(2 / (9 * dof))) ** 3


def noise_factor(runs):
    """k of the docstring: how many CVs a regression threshold must span not to fire on noise."""
    z = statistics.NormalDist().inv_cdf(1 - ALPHA)
    upper = math.sqrt((runs - 1) / chi2_quantile(1 - CONFIDENCE, runs - 1))
    return z * math.sqrt(2) * upper


def level_figures(_bench, values):
    median = statistics.median(values)
    return {
        "mean": statistics.fmean(values),
        "stdev": statistics.stdev(values),
        "cv_pct": _bench.coefficient_of_variation(values) * 100,
        "max_dev_pct": max(abs(v - median) for v in values) / median * 100,
        "worst_drop_pct": (max(values) - min(values)) / max(values) * 100,
    }


def measure(args, spec_decode_bench, params, workdir):
    """One benchmark per run, each against a fresh server (as each upgrade phase meets a restarted unit)."""
    results = []
    for index in range(args.runs):
        proc, url = start(args.stack, True, workdir)
        try:
            results.append(spec_decode_bench.Bench(params, url).measure())
        except spec_decode_bench.BenchAbort as exc:
            sys.exit(f"run {index + 1}: {exc}")
        finally:
            proc.terminate()
            proc.wait(timeout=10)
        levels = results[-1]["levels"]
        cells = "  ".join(
            f"c={lv['concurrency']} {lv['output_tok_s']['mean']:7.2f} (cv {lv['output_tok_s']['cv'] * 100:.2f}%)"
            for lv in levels
        )
        failed = sum(lv["failed"] for lv in levels)
        print(f"run {index + 1:2d}  {cells}  failed {failed}", flush=True)
        if failed:
            sys.exit(f"run {index + 1}: {failed} request(s) failed: {levels[0]['errors'][:1]}")
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--profile", default="cu130", help="stack profile whose postcheck.bench is measured")
    parser.add_argument("--stack", choices=["old", "new"], default="new", help="the stand-in's rates")
    parser.add_argument("--max-cv-pct", type=float, default=2.0)
    args = parser.parse_args()
    if args.runs < 4:
        parser.error(f"--runs must be at least 4 to estimate a CV, got {args.runs}")
    _bench, spec_decode_bench, _profile = collection()
    print(f"load average {os.getloadavg()[0]:.2f} (1 min) on {os.cpu_count()} cores at the start")
    bench_profile = _profile.load_profile(name=args.profile)["postcheck"]["bench"]
    params = bench_params(spec_decode_bench, bench_profile, f"repeatability-{args.stack}")
    plan = _bench.plan(spec_decode_bench.PROMPT_SETS[params["prompt_set"]], **{k: params[k] for k in PROFILE_ARGS[1:]})
    print(
        f"profile {args.profile}: prompt set {params['prompt_set']} ({plan['prompt_set']['prompts']} prompts), "
        f"repeats {params['repeats']}, warmup {params['warmup']}, concurrency {params['concurrency']}, "
        f"api {params['api']}; stand-in stack {args.stack}, EAGLE3; {args.runs} runs of "
        f"{plan['total_requests']} requests; output tok/s per level (cv across the run's repeats)"
    )
    with tempfile.TemporaryDirectory(prefix="bench-repeatability-") as workdir:
        results = measure(args, spec_decode_bench, params, workdir)
    # Other work on the machine is noise this script cannot remove: say how busy it was.
    print(f"load average {os.getloadavg()[0]:.2f} (1 min) on {os.cpu_count()} cores at the end")
    figures = {}
    for position, level in enumerate(params["concurrency"]):
        values = [result["levels"][position]["output_tok_s"]["mean"] for result in results]
        figures[level] = level_figures(_bench, values)
    print(f"\n{'level':>5} {'mean tok/s':>10} {'stdev':>7} {'CV %':>6} {'max |run-median| %':>19} {'max drop %':>10}")
    for level, fig in figures.items():
        print(
            f"{'c=' + str(level):>5} {fig['mean']:10.2f} {fig['stdev']:7.3f} {fig['cv_pct']:6.3f} "
            f"{fig['max_dev_pct']:19.3f} {fig['worst_drop_pct']:10.3f}"
        )
    cv = max(fig["cv_pct"] for fig in figures.values())
    drop = max(fig["worst_drop_pct"] for fig in figures.values())
    k = noise_factor(args.runs)
    supported = math.ceil(max(k * cv, drop) * 2) / 2
    current = bench_profile.get("max_regression_pct")
    print(
        f"\nregression threshold: k = {k:.2f} (alpha {ALPHA:g}, {CONFIDENCE:.0%} upper bound of the CV over "
        f"{args.runs} runs); k x CV = {k * cv:.2f}%, largest drop between two runs {drop:.2f}% -> at least "
        f"{supported:g}%"
    )
    if current is None:
        print(f"profile {args.profile}: max_regression_pct is not set, so the regression gate is skipped")
    elif current >= supported:
        print(
            f"profile {args.profile}: max_regression_pct {current:g}% >= {supported:g}%: the gate does not fire on "
            f"this benchmark's own noise; it holds on a real server whose CV over {args.runs} runs is at most "
            f"{current / k:.2f}%"
        )
    else:
        print(
            f"profile {args.profile}: max_regression_pct {current:g}% < {supported:g}%: the gate would fire on the "
            f"benchmark's own noise; raise postcheck.bench.max_regression_pct to {supported:g}"
        )
    if cv > args.max_cv_pct:
        print(f"FAIL: CV {cv:.3f}% exceeds {args.max_cv_pct:g}%")
        return 1
    print(f"ok: CV {cv:.3f}% <= {args.max_cv_pct:g}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
