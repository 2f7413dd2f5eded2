# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The benchmark gate's statistics against the GPU-resident stand-in, on the device machine.

    python3 bench/spec_decode_device.py OUTDIR [--profile cu130] [--pairs 20] [--restart-pairs 5] [--slow-runs 10]
    device run (carry .whl): python3 bench/spec_decode_device.py $OUT

Starts lab-sglang in GPU mode (`--lab-gpu`: one worker per GPU holding --mem-fraction-static of its memory, every
token made by GPU work) as a plain process tree, as the serving unit would start it, and runs the collection's own
benchmark (spec_decode_bench's Bench and judge, the profile's postcheck.bench settings and gates) against it:

- A/A: pairs of before-vs-before runs on one server, and pairs across a server restart (the post-check measures a
  restarted server against a baseline taken before); a false alarm is a pair the regression gate fails at the
  profile's max_regression_pct;
- speculation: each run of the healthy server against a run of the same server without speculation (the
  speculation gate at min_spec_speedup must pass), then runs of a server whose draft is slowed on purpose
  (`--lab-draft-slowdown`, raised until the speed-up falls below min_spec_speedup): the share the gate catches;
- the NVML answers and the process table while the server runs alone and with a foreign GPU process beside it
  (replayed by the unit tests through the NVML gate and the process tree).

Writes to OUTDIR: spec-decode-gate.json (figures and every run's headline numbers), nvml-server.json,
nvml-server-foreign.json (bench/smoke_nvml_record.py recordings with the process table), and the servers' logs.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
STANDIN_SRC = os.path.join(REPO, "lab", "wheels", "lab-sglang", "src")
sys.path.insert(0, HERE)

from smoke_device import MULTICAST_OFF, collection_path, install_wheels  # noqa: E402

# A stand-in model path: the stand-in loads no weights, it sizes its own (--lab-gpu-weights-gib).
MODEL = "/models/lab-target"
DRAFT = "/models/lab-draft"
# A foreign process beside the server: a little memory, as a stray notebook or a left-over job holds.
FOREIGN = (
    "import sys, time, torch\n"
    "x = torch.empty(int(sys.argv[1]) * 2**20, dtype=torch.uint8, device='cuda')\n"
    "torch.cuda.synchronize()\n"
    "print('holding', x.numel() >> 20, 'MiB', flush=True)\n"
    "time.sleep(3600)\n"
)


def profile_settings(name):
    import yaml

    with open(os.path.join(REPO, "stacks", f"{name}.yml"), encoding="utf-8") as handle:
        profile = yaml.safe_load(handle)
    return profile["serving"], profile["postcheck"]["bench"]


class Server:
    """One stand-in process tree: the launcher (the unit's main pid) and its per-GPU workers."""

    def __init__(self, out, port, serving, speculative=True, slowdown=1.0, tp_size=None, tag="server", gpu=True):
        argv = [sys.executable, "-m", "lab_sglang", *(["--lab-gpu"] if gpu else []), "--host", "127.0.0.1"]
        argv += ["--port", str(port)]
        argv += ["--model-path", MODEL]
        if speculative:
            spec = serving["speculative"]
            argv += ["--speculative-algorithm", spec["algorithm"], "--speculative-draft-model-path", DRAFT]
            argv += ["--speculative-num-steps", str(spec["num_steps"]), "--speculative-eagle-topk"]
            argv += [str(spec["eagle_topk"]), "--speculative-num-draft-tokens", str(spec["num_draft_tokens"])]
        argv += ["--lab-draft-slowdown", str(slowdown), "--lab-stack", "new"]
        if tp_size:
            argv += ["--tp-size", str(tp_size)]
        self.url = f"http://127.0.0.1:{port}"
        self.argv = argv
        self.log_path = os.path.join(out, f"{tag}.log")
        # The caller's PYTHONPATH stays: it is the server's "venv" (the smoke test runs with the server's environment).
        path = os.pathsep.join(p for p in (STANDIN_SRC, os.environ.get("PYTHONPATH")) if p)
        env = dict(os.environ, PYTHONPATH=path, PYTHONUNBUFFERED="1", **MULTICAST_OFF)
        self.log = open(self.log_path, "a", encoding="utf-8")  # closed in stop()
        began = time.monotonic()
        # A session of its own: the tree is the server's alone, as a unit's cgroup would be.
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.start_s = self._wait_healthy(began)

    @property
    def pid(self):
        return self.proc.pid

    def _wait_healthy(self, began, timeout=300):
        while time.monotonic() - began < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the stand-in exited with {self.proc.returncode}; see {self.log_path}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as answer:
                    if answer.status == 200:
                        return round(time.monotonic() - began, 2)
            except OSError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"the stand-in did not become healthy in {timeout} s; see {self.log_path}")

    def info(self):
        with urllib.request.urlopen(self.url + "/server_info", timeout=10) as answer:
            return json.load(answer)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)  # our own session: the launcher and its workers
                self.proc.wait(10)
        self.log.close()


def bench_params(bench_profile):
    from ansible_collections.gpufleet.upgrade.plugins.modules import spec_decode_bench as sdb

    params = {key: spec.get("default") for key, spec in sdb.argument_spec().items()}
    params.update(
        prompt_set=bench_profile["prompt_set"],
        repeats=bench_profile["repeats"],
        warmup=bench_profile["warmup"],
        concurrency=list(bench_profile["concurrency"]),
        max_regression_pct=float(bench_profile["max_regression_pct"]),
        min_spec_speedup=float(bench_profile["min_spec_speedup"]),
        label="device",
    )
    return sdb, params


def compact(result):
    """What the gates read of a result (and the unit tests replay): prompt set, API, speculation, per-level tok/s."""
    return {
        "prompt_set": result["prompt_set"],
        "api": result["api"],
        "speculative": result["speculative"],
        "accept_length": result["accept_length"],
        "levels": [
            {
                "concurrency": lv["concurrency"],
                "output_tok_s": {k: lv["output_tok_s"][k] for k in ("mean", "min", "max", "cv")},
                "failed": lv["failed"],
                "requests": lv["requests"],
                "tpot_ms_p50": lv["tpot_ms"]["p50"],
                "ttft_ms_p50": lv["ttft_ms"]["p50"],
            }
            for lv in result["levels"]
        ],
    }


def proc_table():
    """Every process's /proc/<pid>/stat line: the unit tests rebuild the tree of the server's main pid from it."""
    table = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", encoding="utf-8", errors="replace") as handle:
                    table[name] = handle.read().strip()
            except OSError:
                continue
    return table


def record_nvml(path, server, extra):
    from smoke_nvml_record import main as record

    record(path)
    with open(path, encoding="utf-8") as handle:
        data = json.load(handle)
    data.update(extra, server_main_pid=server.pid, server_argv=server.argv, proc_stat=proc_table())
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(data, handle, indent=1)


def spread(values):
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {
        "n": len(values),
        "mean": statistics.fmean(values),
        "min": min(values),
        "max": max(values),
        "sd": statistics.stdev(values) if len(values) > 1 else 0.0,
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--profile", default="cu130")
    parser.add_argument("--pairs", type=int, default=20, help="A/A pairs on one server")
    parser.add_argument("--restart-pairs", type=int, default=5, help="A/A pairs across a server restart")
    parser.add_argument("--slow-runs", type=int, default=10)
    parser.add_argument("--draft-slowdown", type=float, default=8.0, help="first slowdown tried; raised until caught")
    parser.add_argument("--foreign-mib", type=int, default=2048)
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--budget-s", type=float, default=500)
    parser.add_argument("--no-install", action="store_true")
    parser.add_argument(
        "--cpu", action="store_true", help="dry run without a GPU: the stand-in's CPU mode (its rates), no NVML"
    )
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    began = time.monotonic()
    os.environ.update(MULTICAST_OFF)
    if not args.no_install:
        install_wheels()
    sys.path.insert(0, collection_path())
    sys.path.insert(0, "/tmp/site")
    from ansible_collections.gpufleet.upgrade.plugins.module_utils import _bench

    serving, bench_profile = profile_settings(args.profile)
    sdb, params = bench_params(bench_profile)
    limit, minimum = params["max_regression_pct"], params["min_spec_speedup"]
    report = {
        "profile": args.profile,
        "bench_settings": {k: params[k] for k in ("prompt_set", "repeats", "warmup", "concurrency")},
        "max_regression_pct": limit,
        "min_spec_speedup": minimum,
        "nvidia_smi": subprocess.run(
            "nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1",
            shell=True,
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip(),
        "servers": [],
        "phases": {},
    }

    def measure(server, label):
        bench = sdb.Bench(dict(params, label=label), server.url).measure()
        return compact(bench)

    def over_budget():
        return time.monotonic() - began > args.budget_s

    def launch(tag, **kw):
        return Server(args.out, args.port, serving, tag=tag, gpu=not args.cpu, **kw)

    def started(server, what):
        report["servers"].append({"what": what, "pid": server.pid, "start_s": server.start_s})
        print(f"{what}: pid {server.pid}, healthy after {server.start_s} s", flush=True)
        return server

    def save():
        with open(os.path.join(args.out, "spec-decode-gate.json"), "w", encoding="utf-8") as handle:
            json.dump(report, handle, indent=1)

    # 1. the reference without speculation
    nospec_runs = []
    server = started(launch("nospec", speculative=False), "nospec")
    try:
        for i in range(max(args.slow_runs, 3)):
            nospec_runs.append(measure(server, f"nospec-{i}"))
    finally:
        server.stop()
    report["phases"]["nospec"] = {"runs": nospec_runs}

    # 2. the healthy speculative server: its processes on the GPU, then A/A pairs on it
    server = started(launch("spec"), "spec")
    aa = []
    try:
        info = server.info()
        report["server_info_gpu"] = info.get("gpufleet_lab", {}).get("gpu")
        report["server_memory_usage"] = info["internal_states"][0].get("memory_usage")
        if not args.cpu:
            record_nvml(os.path.join(args.out, "nvml-server.json"), server, {"foreign_pid": None})
            foreign = subprocess.Popen(
                [sys.executable, "-c", FOREIGN, str(args.foreign_mib)], stdout=subprocess.PIPE, text=True
            )
            try:
                print("foreign:", foreign.stdout.readline().strip(), flush=True)
                record_nvml(os.path.join(args.out, "nvml-server-foreign.json"), server, {"foreign_pid": foreign.pid})
            finally:
                foreign.terminate()
                foreign.wait(30)
        for i in range(args.pairs):
            if over_budget():
                break
            before, after = measure(server, f"aa-{i}-a"), measure(server, f"aa-{i}-b")
            aa.append({"before": before, "after": after, "restart": False})
            save()
    finally:
        server.stop()

    # 3. A/A across restarts: the baseline is taken on one server process, the post-check on the next
    previous = None
    for i in range(args.restart_pairs + 1 if args.restart_pairs else 0):
        if over_budget():
            break
        server = started(launch("spec-restart"), f"spec-restart-{i}")
        try:
            run = measure(server, f"restart-{i}")
        finally:
            server.stop()
        if previous is not None:
            aa.append({"before": previous, "after": run, "restart": True})
        previous = run
    report["phases"]["aa"] = {"pairs": aa}

    # 4. the slowed draft: raise the slowdown until the speculation gate's threshold is crossed, then count catches
    slowdown, slow_runs, tried = args.draft_slowdown, [], []
    for _attempt in range(3):
        if over_budget():
            break
        server = started(launch("spec-slow", slowdown=slowdown), f"spec-slow-x{slowdown:g}")
        try:
            probe = measure(server, f"slow-probe-x{slowdown:g}")
            speedup = _bench.spec_gate(probe, nospec_runs[0], minimum)["checks"][0]["speedup"]
            tried.append({"slowdown": slowdown, "speedup_c1": speedup})
            if speedup >= minimum * 0.97:
                slowdown *= 1.6
                continue
            for i in range(args.slow_runs):
                if over_budget():
                    break
                slow_runs.append(measure(server, f"slow-{i}"))
                save()
        finally:
            server.stop()
        break
    report["phases"]["slow"] = {"slowdown": slowdown, "tried": tried, "runs": slow_runs}

    # figures
    regression = [_bench.regression_gate(p["after"], p["before"], limit) for p in aa]
    changes = [c["change_pct"] for g in regression for c in g["checks"]]
    healthy_spec = [p["before"] for p in aa if not p["restart"]]
    spec_ok = [_bench.spec_gate(s, nospec_runs[i % len(nospec_runs)], minimum) for i, s in enumerate(healthy_spec)]
    spec_slow = [_bench.spec_gate(s, nospec_runs[i % len(nospec_runs)], minimum) for i, s in enumerate(slow_runs)]
    report["figures"] = {
        "aa_pairs": len(aa),
        "aa_pairs_restart": sum(p["restart"] for p in aa),
        "aa_false_alarms": sum(not g["passed"] for g in regression),
        "aa_false_alarms_same_server": sum(
            not g["passed"] for g, p in zip(regression, aa, strict=True) if not p["restart"]
        ),
        "aa_change_pct": spread(changes),
        "aa_abs_change_pct_max": max((abs(c) for c in changes), default=None),
        "spec_tok_s_c1": spread([r["levels"][0]["output_tok_s"]["mean"] for r in healthy_spec]),
        "nospec_tok_s_c1": spread([r["levels"][0]["output_tok_s"]["mean"] for r in nospec_runs]),
        "spec_cv_within_run_c1": spread([r["levels"][0]["output_tok_s"]["cv"] for r in healthy_spec]),
        "healthy_spec_runs": len(spec_ok),
        "healthy_spec_gate_failures": sum(not g["passed"] for g in spec_ok),
        "healthy_speedup": spread([c["speedup"] for g in spec_ok for c in g["checks"]]),
        "slow_runs": len(spec_slow),
        "slow_caught": sum(not g["passed"] for g in spec_slow),
        "slow_speedup": spread([c["speedup"] for g in spec_slow for c in g["checks"]]),
        "wall_s": round(time.monotonic() - began, 1),
    }
    save()
    print(json.dumps(report["figures"], indent=1))
    print(json.dumps({k: report[k] for k in ("servers", "server_info_gpu", "server_memory_usage")}, indent=1)[:4000])


if __name__ == "__main__":
    main()
