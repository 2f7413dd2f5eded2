# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Proof run of the postcheck role on a machine's own GPUs (the device machine), with wall times.

    python3 bench/smoke_device.py OUTDIR [--runs 2] [--profile cu130]

Installs the carried wheels (.whl/: ansible-core and its needs, jsonschema and its needs for the stack role's
profile validation, flashinfer-python, apache-tvm-ffi), makes the
repository importable as the collection gpufleet.upgrade, records the raw NVML answers, then runs
`ansible-playbook tests/integration/playbooks/postcheck_device.yml` against localhost (connection local) with
the profile. The first run JIT-compiles flashinfer's kernels with the machine's nvcc; a second run shows the warm
wall time. Results (the role's JSON, the NVML recording, the playbook log, a summary) land flat in OUTDIR.
NVLink multicast stays off for everything started here.

A last run corrupts --fault's kernels by about 3 % (GPUFLEET_SMOKE_INJECT_FAULT) and must fail the host.

Beside a resident server (--beside-server): the post-check as it runs after the switch, with the server up. The
lab's SGLang stand-in starts in GPU mode as a plain process tree (no systemd here; one worker per GPU holding
--mem-fraction-static of its memory, bench/spec_decode_device.py's Server) and its launcher's pid goes where the
unit's MainPID would be read (postcheck_server_main_pid, the audit's serving.main_pid). Runs: the post-check with
its benchmark against the server (must pass, the server's processes listed as its own), the audit's GPU judgement
(host_state, tests/integration/playbooks/audit_gpus_device.yml), then both again with a foreign torch process
holding --foreign-mib beside the server (must fail, naming it).
    device run (carry .whl): python3 bench/smoke_device.py $OUT --beside-server

Several GPUs (issue 8): the same command on nvidia-h200-x8 (or -x4/-x2), with GPUFLEET_EXPECTED_GPUS=8 so the
NVML gate also checks the count; the all-reduce then spans every GPU (one process each, NCCL) and reports its bus
bandwidth. Compare wall times with tests/data/device/h200-summary.json (one H200).
    device run (carry .whl): GPUFLEET_EXPECTED_GPUS=8 python3 bench/smoke_device.py $OUT --runs 2
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def sh(cmd, **kw):
    print("+", cmd if isinstance(cmd, str) else " ".join(cmd), flush=True)
    return subprocess.run(cmd, shell=isinstance(cmd, str), text=True, capture_output=True, **kw)


def install_wheels():
    wheels = sorted(glob.glob(os.path.join(REPO, ".whl", "*.whl")))
    base = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile"]
    res = sh(base + wheels)
    if res.returncode != 0:  # a read-only interpreter: fall back to a side folder on PYTHONPATH
        print(res.stderr[-2000:])
        res = sh([*base, "--target", "/tmp/site", *wheels])
        os.environ["PYTHONPATH"] = "/tmp/site" + os.pathsep + os.environ.get("PYTHONPATH", "")
    return res.returncode


def collection_path():
    root = "/tmp/gpufleet-ac"
    link = os.path.join(root, "ansible_collections", "gpufleet", "upgrade")
    os.makedirs(os.path.dirname(link), exist_ok=True)
    if not os.path.islink(link):
        os.symlink(REPO, link)
    return root


def cuda_home():
    if os.environ.get("CUDA_HOME"):
        return os.environ["CUDA_HOME"]
    nvcc = shutil.which("nvcc") or next(iter(sorted(glob.glob("/usr/local/cuda*/bin/nvcc"))), None)
    return os.path.dirname(os.path.dirname(os.path.realpath(nvcc))) if nvcc else "/usr/local/cuda"


def playbook(out, run, profile, env, cuda, fault="", extra_vars=None, log_dir=None):
    state, ctl = f"/tmp/pc-state-{run}", f"/tmp/pc-ctl-{run}"
    smoke_env = {"CUDA_HOME": cuda, "MAX_JOBS": str(os.cpu_count() or 8)}
    if fault:  # proof that the gate catches a slightly wrong kernel on this GPU
        smoke_env["GPUFLEET_SMOKE_INJECT_FAULT"] = fault
    extra = {
        "gpufleet_stack_profile": profile,
        "postcheck_state_dir": state,
        "gpufleet_controller_dir": ctl,
        "postcheck_smoke_python": sys.executable,
        "postcheck_smoke_env": smoke_env,
        "postcheck_expected_gpu_count": int(env.get("GPUFLEET_EXPECTED_GPUS", "0")),
        "ansible_python_interpreter": sys.executable,
        **(extra_vars or {}),
    }
    cmd = [
        sys.executable,
        "-m",
        "ansible",
        "playbook",
        "-i",
        "localhost,",
        "-c",
        "local",
        os.path.join(REPO, "tests/integration/playbooks/postcheck_device.yml"),
        "-e",
        json.dumps(extra),
    ]
    began = time.monotonic()
    res = subprocess.run(cmd, text=True, capture_output=True, env=env, cwd=REPO)
    wall = time.monotonic() - began
    with open(os.path.join(log_dir or out, f"playbook-run{run}.log"), "w") as log:
        log.write(res.stdout + "\n--- stderr ---\n" + res.stderr)
    host_files = sorted(glob.glob(f"{state}/results/postcheck-*.json"))
    ctl_files = sorted(glob.glob(f"{ctl}/results/localhost/postcheck-*.json"))
    result = None
    if host_files:
        shutil.copy(host_files[-1], os.path.join(out, f"postcheck-run{run}.json"))
        with open(host_files[-1]) as handle:
            result = json.load(handle)
    return {
        "rc": res.returncode,
        "wall_s": round(wall, 1),
        "host_file": host_files,
        "controller_file": ctl_files,
        "result": result,
        "tail": res.stdout[-1500:],
    }


def summarize(run):
    res = run["result"] or {}
    smoke = res.get("smoke", {})
    rows = {}
    memory = {}
    for name, check in smoke.get("host_checks", {}).items():
        rows[name] = check["status"]
    for gpu in smoke.get("gpus", []):
        for name, check in gpu["checks"].items():
            raw = check.get("raw", {})
            rows[f"gpu{gpu['index']}.{name}"] = (
                f"{check['status']} ({raw.get('seconds', '-')} s) {check['message'][:160]}"
            )
            if isinstance(raw.get("memory"), dict):
                memory[f"gpu{gpu['index']}.{name}"] = raw["memory"]
    if "allreduce" in smoke:
        rows["nccl_allreduce"] = f"{smoke['allreduce']['status']} {smoke['allreduce']['message']}"
    return {
        "rc": run["rc"],
        "playbook_wall_s": run["wall_s"],
        "smoke_wall_s": smoke.get("wall_s"),
        "passed": res.get("passed"),
        "gates": {k: v["status"] for k, v in res.get("gates", {}).items()},
        "gate_reasons": {k: v.get("reasons") for k, v in res.get("gates", {}).items()},
        "gate_notes": {k: v.get("notes") for k, v in res.get("gates", {}).items()},
        "failures": res.get("failures"),
        "checks": rows,
        "smoke_memory_per_check": memory,
        "smoke_memory": smoke.get("memory"),
        "gpu_health": {k: (res.get("nvml") or {}).get(k) for k in ("server", "server_processes", "foreign_processes")},
        "controller_file": run["controller_file"],
    }


def audit_gpus(out, tag, profile, env, main_pid):
    """The audit's GPU judgement (host_state with the server's main pid, in check mode as the audit runs)."""
    path = os.path.join(out, f"audit-{tag}.json")
    extra = {
        "gpufleet_stack_profile": profile,
        "audit_device_server_main_pid": main_pid,
        "audit_device_out": path,
        "ansible_python_interpreter": sys.executable,
    }
    cmd = [sys.executable, "-m", "ansible", "playbook", "-i", "localhost,", "-c", "local", "--check"]
    cmd += [os.path.join(REPO, "tests/integration/playbooks/audit_gpus_device.yml"), "-e", json.dumps(extra)]
    began = time.monotonic()
    res = subprocess.run(cmd, text=True, capture_output=True, env=env, cwd=REPO)
    wall = round(time.monotonic() - began, 1)
    verdict = None
    if os.path.exists(path):
        with open(path) as handle:
            verdict = json.load(handle)
    health = (verdict or {}).get("gpu_health") or {}
    gpus_item = next((i for i in (verdict or {}).get("items", []) if i.get("item") == "gpus"), None)
    return {
        "rc": res.returncode,
        "wall_s": wall,
        "gpus_item": gpus_item,
        "healthy": health.get("healthy"),
        "reasons": health.get("reasons"),
        "server_processes": health.get("server_processes"),
        "foreign_processes": health.get("foreign_processes"),
        "tail": None if verdict else (res.stdout + res.stderr)[-2000:],
    }


def beside_server(args, env, cuda, summary):
    """The post-check and the audit's GPU judgement beside the resident stand-in, then with a foreign process."""
    from spec_decode_device import FOREIGN, Server, profile_settings

    serving, _bench_profile = profile_settings(args.profile)
    # As the serving unit sets it: the smoke test runs with the server's environment, flashinfer's JIT finds nvcc here.
    os.environ["CUDA_HOME"] = cuda
    # Logs stay in /tmp: what comes back from the device is a few files (the results, the summary).
    server = Server("/tmp", 30000, serving, tag="lab-sglang-server")
    print(f"server pid {server.pid}, healthy after {server.start_s} s", flush=True)
    summary["server"] = {"pid": server.pid, "start_s": server.start_s, "argv": server.argv}
    extra = {
        "postcheck_server_main_pid": str(server.pid),
        "postcheck_bench_enabled": True,
        "postcheck_bench_server_url": server.url,
    }
    foreign = None
    try:
        summary["server"]["gpu"] = server.info()["gpufleet_lab"]["gpu"]["workers"]
        for run, tag in enumerate(("beside-server", "beside-server-warm"), start=1):
            if run > 1 and args.runs < 2:
                break
            result = playbook(args.out, tag, args.profile, env, cuda, extra_vars=extra, log_dir="/tmp")
            summary["runs"].append(dict(summarize(result), run=tag))
        summary["audit"] = {"beside-server": audit_gpus(args.out, "beside-server", args.profile, env, server.pid)}
        foreign = subprocess.Popen(
            [sys.executable, "-c", FOREIGN, str(args.foreign_mib)], stdout=subprocess.PIPE, text=True, env=env
        )
        print("foreign process", foreign.pid, foreign.stdout.readline().strip(), flush=True)
        summary["foreign_pid"] = foreign.pid
        result = playbook(args.out, "foreign", args.profile, env, cuda, extra_vars=extra, log_dir="/tmp")
        summary["runs"].append(dict(summarize(result), run="foreign"))
        summary["audit"]["foreign"] = audit_gpus(args.out, "foreign", args.profile, env, server.pid)
    finally:
        if foreign is not None:
            foreign.terminate()
            foreign.wait(30)
        server.stop()
        with open(server.log_path) as handle:
            summary["server"]["log_tail"] = handle.read()[-3000:]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--runs", type=int, default=2, help="clean runs: the first compiles, later ones are warm")
    parser.add_argument(
        "--fault", default="bf16_matmul,flashinfer_batch_decode", help="checks to corrupt in a last run"
    )
    parser.add_argument("--profile", default="cu130")
    parser.add_argument("--budget-s", type=float, default=480)
    parser.add_argument("--no-install", action="store_true", help="the interpreter already has the packages")
    parser.add_argument("--beside-server", action="store_true", help="the proof beside a resident server (above)")
    parser.add_argument("--foreign-mib", type=int, default=2048)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    began = time.monotonic()
    os.environ.update(MULTICAST_OFF)
    facts = {
        "nvidia_smi": sh(
            "nvidia-smi -L; nvidia-smi --query-gpu=driver_version,pcie.link.gen.current,"
            "pcie.link.gen.max,pcie.link.width.current,pcie.link.width.max --format=csv"
        ).stdout,
        "python": sys.executable,
        "cuda_home": cuda_home(),
        "nvcc": sh("nvcc --version | tail -2").stdout,
    }
    facts["wheels_rc"] = None if args.no_install else install_wheels()
    # ansible-core refuses a non-UTF-8 locale
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=collection_path(), PYTHONUNBUFFERED="1", LC_ALL="C.UTF-8")
    env["PYTHONPATH"] = env["ANSIBLE_COLLECTIONS_PATH"] + os.pathsep + env.get("PYTHONPATH", "")
    rec = subprocess.run(
        [sys.executable, os.path.join(REPO, "bench/smoke_nvml_record.py"), os.path.join(args.out, "nvml-record.json")],
        text=True,
        capture_output=True,
        env=env,
    )
    facts["nvml_record"] = (rec.stdout + rec.stderr)[-1500:]
    summary = {"facts": facts, "runs": []}
    if args.beside_server:
        try:
            beside_server(args, env, facts["cuda_home"], summary)
        finally:
            with open(os.path.join(args.out, "summary.json"), "w") as handle:
                json.dump(summary, handle, indent=1)
        print(json.dumps(summary, indent=1)[-12000:])
        return
    plan = [""] * args.runs + ([args.fault] if args.fault else [])
    for run, fault in enumerate(plan, start=1):
        if run > 1 and time.monotonic() - began > args.budget_s:
            summary["runs"].append({"skipped": "out of time budget", "fault": fault})
            continue
        result = playbook(args.out, run, args.profile, env, facts["cuda_home"], fault)
        summary["runs"].append(dict(summarize(result), fault=fault))
        if result["result"] is None:
            print(result["tail"])
    with open(os.path.join(args.out, "summary.json"), "w") as handle:
        json.dump(summary, handle, indent=1)
    print(json.dumps(summary, indent=1)[-9000:])


if __name__ == "__main__":
    main()
