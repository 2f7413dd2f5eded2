#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: spec_decode_bench
short_description: Benchmark an SGLang server's speculative decoding and gate on regressions
description:
  - Sends the collection's fixed, versioned prompt set to an SGLang server on the managed host, the same way
    every time (temperature 0, C(ignore_eos), streamed), after O(warmup) warm-up requests, O(repeats) times at
    each level of O(concurrency).
  - Reports per run and per concurrency level output tokens/s, request throughput, accept length (per request
    from C(meta_info.spec_verify_ct) and the server average from C(/server_info)), TTFT, inter-token latency,
    time per output token and end-to-end latency (mean, p50, p95, p99, max, in ms), the coefficient of variation
    of throughput across repeats, and every error seen.
  - Gates. C(errors) fails when more than O(max_error_rate) of the requests failed. C(regression) compares with a
    baseline (the pre-upgrade result saved by the backup phase, O(baseline_path), or O(baseline)) and fails when
    output tok/s at a concurrency level fell by more than O(max_regression_pct). C(speculation) compares with a
    run without speculative decoding (O(nospec_server_url), measured now, or a saved O(nospec_path) /
    O(nospec)) and fails when speculation is slower than O(min_spec_speedup) times that run.
  - A benchmark changes nothing on the host, so the module never reports C(changed).
  - Uses SGLang's native C(POST /generate) (O(api=generate), the default, the only API that returns
    C(spec_verify_ct) per request) or the OpenAI-compatible C(POST /v1/completions) (O(api=completions)), both
    with C(stream=true) so TTFT and inter-token latency are measured on the host, plus C(GET /health) and
    C(GET /server_info) (C(GET /get_server_info) on servers older than SGLang 0.5.9).
version_added: 0.1.0
options:
  server_url:
    description: Base URL of the server, as seen from the managed host.
    type: str
    default: http://127.0.0.1:30000
  api:
    description: Which generation API the measured requests use.
    type: str
    choices: [generate, completions]
    default: generate
  model:
    description: C(model) field of O(api=completions) requests; defaults to the server's served model name.
    type: str
  prompt_set:
    description: Version of the prompt set shipped with the collection (C(plugins/module_utils/_prompts_<v>.py)).
    type: str
    choices: [v1]
    default: v1
  repeats:
    description: Measured runs per concurrency level (at least 1).
    type: int
    default: 3
  warmup:
    description: Warm-up requests before measuring (0 or more); their results are not counted.
    type: int
    default: 1
  concurrency:
    description: Concurrency levels; a run at level C(c) sends the prompt set C(c) times over C(c) streams.
    type: list
    elements: int
    default: [1]
  request_timeout:
    description: Seconds one request may wait for the next bytes of its answer.
    type: float
    default: 120
  health_timeout:
    description: Seconds to wait for C(GET /health) to answer 200 before the benchmark starts.
    type: float
    default: 60
  baseline_path:
    description: JSON file on the managed host holding an earlier result of this module (its whole return or its
      RV(bench)), for example C(/var/lib/gpufleet/backups/<id>/bench.json).
    type: path
  baseline:
    description: An earlier result of this module (its whole return or its RV(bench)).
    type: dict
  baseline_missing:
    description: What to do when O(baseline_path) does not exist.
    type: str
    choices: [fail, skip]
    default: fail
  max_regression_pct:
    description: Largest allowed fall of output tok/s against the baseline, in percent. Omit to skip the gate.
    type: float
  nospec_server_url:
    description: Base URL of a server of the same stack without speculative decoding, measured now with the same
      prompts, repeats and concurrency.
    type: str
  nospec_path:
    description: JSON file on the managed host holding a result of this module against the server without
      speculative decoding.
    type: path
  nospec:
    description: A result of this module against the server without speculative decoding.
    type: dict
  min_spec_speedup:
    description: Smallest allowed ratio of speculative to non-speculative output tok/s (1.0 = speculation must not
      be slower). Omit to skip the gate.
    type: float
  max_error_rate:
    description: Largest allowed share of failed measured requests (0 = any failed request fails the gate).
    type: float
    default: 0
  fail_on_gate:
    description: Fail the task when a gate fails. C(false) records a result (for example the pre-upgrade baseline,
      whose speculation may well be a net loss) and reports the gates without failing.
    type: bool
    default: true
  label:
    description: Free text stored in the result, for example C(pre-upgrade) or C(post-upgrade).
    type: str
attributes:
  check_mode:
    support: full
    description: Sends no request; returns RV(plan), what the benchmark would send, and whether the baseline file
      is there (a missing one is reported, not fatal, as the phase that writes it does not run in check mode).
  diff_mode:
    support: none
    description: Nothing on the host changes.
notes:
  - Results are comparable only with the same prompt set version and content hash, API and speculation mode; the
    C(regression) gate fails with the reason when they differ.
  - Requests bypass HTTP proxies, so the server is measured directly.
  - The module only sends requests; the kernels measured run in the server, with the serving unit's own environment
    (nothing of the module's environment reaches them). The run without speculation that role serving starts for
    O(nospec_server_url) is a transient unit with the same environment file.
author:
  - gpufleet maintainers (@gpufleet)
"""

EXAMPLES = r"""
- name: Record the pre-upgrade baseline without gating
  gpufleet.upgrade.spec_decode_bench:
    server_url: "http://127.0.0.1:{{ gpufleet_serving_port }}"
    repeats: 3
    fail_on_gate: false
    label: pre-upgrade
  register: __backup_bench

- name: Benchmark after the upgrade against the baseline and a run without speculation
  gpufleet.upgrade.spec_decode_bench:
    server_url: "http://127.0.0.1:{{ gpufleet_serving_port }}"
    prompt_set: "{{ gpufleet_stack.postcheck.bench.prompt_set }}"
    repeats: "{{ gpufleet_stack.postcheck.bench.repeats }}"
    warmup: "{{ gpufleet_stack.postcheck.bench.warmup }}"
    concurrency: "{{ gpufleet_stack.postcheck.bench.concurrency }}"
    baseline_path: "/var/lib/gpufleet/backups/{{ backup_id }}/bench.json"
    max_regression_pct: "{{ gpufleet_stack.postcheck.bench.max_regression_pct }}"
    nospec_path: /var/lib/gpufleet/results/bench-nospec.json
    min_spec_speedup: "{{ gpufleet_stack.postcheck.bench.min_spec_speedup }}"
    label: post-upgrade
"""

RETURN = r"""
bench:
  description: The result; save it as JSON to use it later as O(baseline) or O(nospec).
  returned: success or gate failure
  type: dict
  contains:
    schema:
      description: Result format, C(gpufleet.spec_decode_bench/1).
      type: str
    label:
      description: O(label).
      type: str
    server_url:
      description: The server measured.
      type: str
    api:
      description: O(api).
      type: str
    prompt_set:
      description: Name, sha256, prompt count and output tokens of the prompt set.
      type: dict
    speculative:
      description: Whether the server runs speculative decoding (C(speculative_algorithm) set).
      type: bool
    server:
      description: Version, model, speculative settings and C(avg_spec_accept_length) from /server_info.
      type: dict
    output_tok_s:
      description: Output tok/s at the lowest concurrency level (mean over repeats).
      type: float
    accept_length:
      description: Accept length over all requests of the lowest level (tokens / verify steps).
      type: float
    warmup:
      description: Warm-up requests sent and failed.
      type: dict
    levels:
      description: Per concurrency level, the aggregate over repeats and, in C(runs), each run's statistics.
      type: list
      elements: dict
      sample:
        - concurrency: 1
          repeats: 3
          output_tok_s: {mean: 96.1, min: 95.8, max: 96.4, cv: 0.003}
          request_throughput: {mean: 2.1, cv: 0.004}
          accept_length: 3.0
          accept_length_per_request: {count: 15, mean: 3.0, p50: 3.0, p95: 3.0, p99: 3.0, max: 3.0}
          ttft_ms: {count: 15, mean: 25.1, p50: 24.0, p95: 32.0, p99: 32.5, max: 32.6}
          itl_ms: {count: 60, mean: 31.2, p50: 31.2, p95: 31.5, p99: 31.9, max: 32.0}
          tpot_ms: {count: 15, mean: 10.4, p50: 10.4, p95: 10.5, p99: 10.5, max: 10.5}
          e2e_ms: {count: 15, mean: 500.0, p50: 400.0, p95: 690.0, p99: 700.0, max: 700.0}
          requests: 15
          failed: 0
          errors: []
nospec_bench:
  description: The result of O(nospec_server_url) when given, in the same form as RV(bench).
  returned: when nospec_server_url is given
  type: dict
gates:
  description: Each gate with C(name), C(passed), C(skipped), C(message) and its per-level C(checks).
  returned: success or gate failure
  type: list
  elements: dict
passed:
  description: Whether every gate passed (skipped gates pass).
  returned: success or gate failure
  type: bool
plan:
  description: Prompt set, warm-up requests, per-level requests and the total the benchmark sends.
  returned: always
  type: dict
"""

import json
import os
import socket
import time
from concurrent.futures import ThreadPoolExecutor

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _bench
from ansible_collections.gpufleet.upgrade.plugins.module_utils._prompts_v1 import PROMPT_SET as PROMPTS_V1
from ansible_collections.gpufleet.upgrade.plugins.module_utils._sglang_client import Client, ServerError

PROMPT_SETS = {"v1": PROMPTS_V1}


class BenchAbort(Exception):
    """The benchmark cannot go on; the message says why and what to do."""


def argument_spec():
    return {
        "server_url": {"type": "str", "default": "http://127.0.0.1:30000"},
        "api": {"type": "str", "choices": ["generate", "completions"], "default": "generate"},
        "model": {"type": "str"},
        "prompt_set": {"type": "str", "choices": sorted(PROMPT_SETS), "default": "v1"},
        "repeats": {"type": "int", "default": 3},
        "warmup": {"type": "int", "default": 1},
        "concurrency": {"type": "list", "elements": "int", "default": [1]},
        "request_timeout": {"type": "float", "default": 120},
        "health_timeout": {"type": "float", "default": 60},
        "baseline_path": {"type": "path"},
        "baseline": {"type": "dict"},
        "baseline_missing": {"type": "str", "choices": ["fail", "skip"], "default": "fail"},
        "max_regression_pct": {"type": "float"},
        "nospec_server_url": {"type": "str"},
        "nospec_path": {"type": "path"},
        "nospec": {"type": "dict"},
        "min_spec_speedup": {"type": "float"},
        "max_error_rate": {"type": "float", "default": 0},
        "fail_on_gate": {"type": "bool", "default": True},
        "label": {"type": "str"},
    }


def build_module():
    return AnsibleModule(
        argument_spec=argument_spec(),
        mutually_exclusive=[("baseline_path", "baseline"), ("nospec_server_url", "nospec_path", "nospec")],
        supports_check_mode=True,
    )


def check_numbers(params):
    problems = []
    if params["repeats"] < 1:
        problems.append(f"repeats must be at least 1, got {params['repeats']}")
    if params["warmup"] < 0:
        problems.append(f"warmup must be 0 or more, got {params['warmup']}")
    if not params["concurrency"] or any(c < 1 for c in params["concurrency"]):
        problems.append(f"concurrency must list levels of 1 or more, got {params['concurrency']}")
    if params["request_timeout"] <= 0 or params["health_timeout"] < 0:
        problems.append("request_timeout must be positive and health_timeout 0 or more")
    if not 0 <= params["max_error_rate"] <= 1:
        problems.append(f"max_error_rate is a share between 0 and 1, got {params['max_error_rate']}")
    return problems


def load_result_file(path, what, missing_ok):
    """(result, note): a saved result from the host, or None with why when allowed to be missing."""
    if not os.path.exists(path):
        if missing_ok:
            return None, f"no {what} at {path}"
        raise BenchAbort(
            f"{what} {path} does not exist on {socket.gethostname()}: run the phase that saves it first, "
            f"pass another file, or set baseline_missing=skip to benchmark without it"
        )
    try:
        with open(path, encoding="utf-8") as handle:
            return _bench.extract_result(json.load(handle)), None
    except (OSError, ValueError) as exc:
        raise BenchAbort(f"{what} {path} on {socket.gethostname()} is unreadable: {exc}") from exc


class Bench:
    """One benchmark of one server: health, server info, warm-up, runs per level."""

    def __init__(self, params, server_url):
        self.params = params
        self.client = Client(server_url, timeout=params["request_timeout"])
        self.prompt_set = PROMPT_SETS[params["prompt_set"]]
        self.model = params["model"]

    def server_info(self):
        try:
            return self.client.server_info()
        except ServerError as exc:
            raise BenchAbort(f"cannot read the server's info: {exc}") from exc

    def one(self, prompt):
        if self.params["api"] == "generate":
            return self.client.generate(prompt["text"], prompt["max_new_tokens"])
        return self.client.completion(prompt["text"], prompt["max_new_tokens"], self.model)

    def run(self, concurrency):
        requests = _bench.run_requests(list(self.prompt_set["prompts"]), concurrency)
        start = time.monotonic()
        with ThreadPoolExecutor(max_workers=concurrency) as pool:
            records = list(pool.map(self.one, requests))
        return records, time.monotonic() - start

    def measure(self):
        url = self.client.base_url
        healthy, seen = self.client.wait_healthy(self.params["health_timeout"])
        if not healthy:
            raise BenchAbort(
                f"server {url} on {socket.gethostname()} is not healthy after {self.params['health_timeout']:g}s "
                f"(GET /health: {seen}); check the serving unit (systemctl status, journalctl -u) and its port"
            )
        info = self.server_info()
        if self.model is None:
            self.model = info.get("served_model_name") or info.get("model_path") or "default"
        prompts = list(self.prompt_set["prompts"])
        warm = [self.one(p) for p in _bench.warmup_requests(prompts, self.params["warmup"])]
        warm_failed = [r["error"] for r in warm if not r["ok"]]
        if warm and len(warm_failed) == len(warm):
            raise BenchAbort(f"every warm-up request to {url} failed; first error: {warm_failed[0]}")
        levels = []
        for concurrency in self.params["concurrency"]:
            runs = []
            for _repeat in range(self.params["repeats"]):
                records, wall = self.run(concurrency)
                if not any(r["ok"] for r in records):
                    raise BenchAbort(
                        f"every request of a run at concurrency {concurrency} to {url} failed; "
                        f"first error: {records[0]['error']}"
                    )
                runs.append((records, wall))
            levels.append(_bench.level_stats(concurrency, runs))
        after = self.server_info()
        lowest = min(levels, key=lambda lv: lv["concurrency"])
        return {
            "schema": _bench.RESULT_SCHEMA,
            "label": self.params["label"],
            "server_url": url,
            "api": self.params["api"],
            "prompt_set": _bench.prompt_set_info(self.prompt_set),
            "speculative": bool(after.get("speculative_algorithm")),
            "server": _bench.server_summary(after),
            "output_tok_s": _bench.headline(levels),
            "accept_length": lowest["accept_length"],
            "warmup": {"requests": len(warm), "failed": len(warm_failed), "errors": warm_failed},
            "levels": levels,
            "finished_at": time.time(),
        }


def baseline_of(params, check_mode=False):
    """In check mode a missing file is reported, not fatal: the phase that writes it did not really run."""
    if params["baseline"] is not None:
        return _bench.extract_result(params["baseline"]), None
    if params["baseline_path"]:
        missing_ok = check_mode or params["baseline_missing"] == "skip"
        return load_result_file(params["baseline_path"], "baseline", missing_ok)
    return None, "no baseline given"


def nospec_of(params, bench_nospec):
    if bench_nospec is not None:
        return bench_nospec, None
    if params["nospec"] is not None:
        return _bench.extract_result(params["nospec"]), None
    if params["nospec_path"]:
        return load_result_file(params["nospec_path"], "result without speculation", False)
    return None, "no run without speculation given"


def judge(params, bench, baseline, why_no_baseline, nospec, why_no_nospec):
    gates = [_bench.error_gate(bench["levels"], params["max_error_rate"])]
    if params["max_regression_pct"] is None:
        gates.append(_bench.skipped_gate("regression", "max_regression_pct not set"))
    elif baseline is None:
        gates.append(_bench.skipped_gate("regression", why_no_baseline))
    else:
        gates.append(_bench.regression_gate(bench, baseline, params["max_regression_pct"]))
    if params["min_spec_speedup"] is None:
        gates.append(_bench.skipped_gate("speculation", "min_spec_speedup not set"))
    elif nospec is None:
        gates.append(_bench.skipped_gate("speculation", why_no_nospec))
    else:
        gates.append(_bench.spec_gate(bench, nospec, params["min_spec_speedup"]))
    return gates


def main():
    module = build_module()
    params = module.params
    problems = check_numbers(params)
    if problems:
        module.fail_json(msg="; ".join(problems))
    prompt_set = PROMPT_SETS[params["prompt_set"]]
    plan = _bench.plan(prompt_set, params["repeats"], params["warmup"], params["concurrency"])
    plan["server_url"] = params["server_url"]
    plan["api"] = params["api"]
    plan["nospec_server_url"] = params["nospec_server_url"]
    try:
        baseline, why_no_baseline = baseline_of(params, module.check_mode)
        if module.check_mode:
            plan["baseline"] = why_no_baseline or "found"
            module.exit_json(changed=False, plan=plan, msg="check mode: no request sent")
        bench = Bench(params, params["server_url"]).measure()
        nospec_bench = Bench(params, params["nospec_server_url"]).measure() if params["nospec_server_url"] else None
        nospec, why_no_nospec = nospec_of(params, nospec_bench)
    except BenchAbort as exc:
        module.fail_json(msg=str(exc), plan=plan)
    except ValueError as exc:
        module.fail_json(msg=f"a given result is not usable: {exc}", plan=plan)
    gates = judge(params, bench, baseline, why_no_baseline, nospec, why_no_nospec)
    passed = all(g["passed"] for g in gates)
    result = {"changed": False, "bench": bench, "gates": gates, "passed": passed, "plan": plan}
    if nospec_bench is not None:
        result["nospec_bench"] = nospec_bench
    failed = [g for g in gates if not g["passed"]]
    if failed and params["fail_on_gate"]:
        module.fail_json(
            msg=f"benchmark gate failed on {socket.gethostname()}: "
            + " | ".join(f"{g['name']}: {g['message']}" for g in failed),
            **result,
        )
    summary = f"{bench['output_tok_s']:.1f} output tok/s" if bench["output_tok_s"] is not None else "no throughput"
    module.exit_json(
        msg=f"{summary}; gates: "
        + ", ".join(
            f"{g['name']} {'skipped' if g['skipped'] else 'passed' if g['passed'] else 'FAILED'}" for g in gates
        ),
        **result,
    )


if __name__ == "__main__":
    main()
