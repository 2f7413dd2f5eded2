# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""SM 12.0 readiness on a machine's own GPU (the device machine, one H200) in one call: the preflight GPU gates and
the smoke test's build check, through the collection's roles and modules with ansible-playbook (connection local).

    python3 bench/sm120_readiness_device.py OUTDIR [--no-install]

1. preflight against stacks/cu130.yml (must pass) and against a copy of it whose driver.min_version and
   driver.min_cuda (590.48.01 / 13.1) are above the H200's (must refuse, naming host, value and fix), the refusal
   once more under --check; each run also records nvml_info's facts and gate verdict for replay in unit tests, and
   whether anything under the run's state folder changed;
2. gpu_smoke_test with the checks torch_cuda_version, arch_in_list, capability_probes and build_targets for the
   profile's gpu.target_sms (9.0, 12.0): sm_120 kernels are built and inspected, not run; the host's SM 9.0 is
   built, inspected and run.
Carried wheels (.whl/): ansible-core 2.19 and its needs (resolvelib, cryptography, cffi, pycparser), jsonschema and
its needs (jsonschema-specifications, referencing, rpds-py) for the stack role, flashinfer-python 0.6.4 and
apache-tvm-ffi. Results land flat in OUTDIR: preflight.json, build.json, facts.json, playbooks.log; committed as
tests/data/device/h200-preflight-gates.json, h200-build-sm90-sm120.json, h200-sm120-readiness-facts.json and
h200-sm120-readiness.log, replayed by tests/unit/plugins/module_utils/test_gates.py and test_smoke_build.py.
NVLink multicast stays off for everything started.
    device run (kind nvidia-h200, carry .whl, about 165 s):
    set -o pipefail; PYTHONUNBUFFERED=1 python3 bench/sm120_readiness_device.py $OUT 2>&1 | tee $OUT/run.log
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import smoke_device  # noqa: E402  (same folder: wheels, collection path, CUDA_HOME)

REPO = smoke_device.REPO
TOO_HIGH = {"min_version": "590.48.01", "min_cuda": "13.1"}  # driver 590.48.01 reports CUDA 13.1

PREFLIGHT_PLAY = """
- name: Run the preflight GPU gates on this machine
  hosts: all
  gather_facts: false
  tasks:
    - name: Load the profile
      ansible.builtin.include_role: {name: gpufleet.upgrade.stack, public: true}
    - name: Read NVML and judge the GPU gates (the verdict recorded for replay)
      gpufleet.upgrade.nvml_info:
        gates:
          host: "{{ inventory_hostname }}"
          profile: "{{ gpufleet_stack.name }}"
          min_driver_version: "{{ gpufleet_stack.driver.min_version }}"
          min_cuda_driver_version: "{{ gpufleet_stack.driver.min_cuda }}"
          min_compute_capability: "{{ gpufleet_stack.gpu.min_compute_capability }}"
      register: gates_nvml
      failed_when: false  # a machine without NVML records the failure with its verdict
    - name: Run the preflight role
      block:
        - name: Refuse or pass the host
          ansible.builtin.include_role: {name: gpufleet.upgrade.preflight}
      rescue:
        - name: Keep the refusal
          ansible.builtin.set_fact:
            refusal: "{{ ansible_failed_result.msg }}"
      always:
        - name: Release the lock as upgrade.yml does
          gpufleet.upgrade.upgrade_lock:
            path: "{{ gpufleet_state_dir }}/upgrade.lock"
            run_id: "{{ gpufleet_run_id }}"
            state: absent
          when: preflight_lock_held | default(false) | bool
          changed_when: false  # the lock lives only as long as the run, as the role's own take says
        # This script's bookkeeping, not the host: it writes under --check too and counts as no change, so the
        # recap's changed= is the roles' alone.
        - name: Write what the preflight decided
          check_mode: false
          changed_when: false
          ansible.builtin.copy:
            dest: "{{ out_file }}"
            mode: "0644"
            content: >-
              {{ {'profile': gpufleet_stack.name, 'driver': gpufleet_stack.driver,
                  'min_compute_capability': gpufleet_stack.gpu.min_compute_capability,
                  'preflight_report': preflight_report | default({}), 'refusal': refusal | default(none),
                  'nvml_info': gates_nvml} | to_nice_json }}
"""

BUILD_PLAY = """
- name: Run the smoke test's build check on this machine
  hosts: all
  gather_facts: false
  tasks:
    - name: Load the profile
      ansible.builtin.include_role: {name: gpufleet.upgrade.stack, public: true}
    - name: Build for the profile's target SMs, run on this host's
      gpufleet.upgrade.gpu_smoke_test:
        python: "{{ smoke_python }}"
        checks: [torch_cuda_version, arch_in_list, capability_probes, build_targets]
        expected_cuda: "{{ gpufleet_stack.cuda.version }}"
        required_packages: "{{ gpufleet_stack.postcheck.smoke.required_packages }}"
        target_sms: "{{ gpufleet_stack.gpu.target_sms }}"
        per_sm: "{{ gpufleet_stack.postcheck.smoke.per_sm }}"
        build_timeout_s: 240  # two targets and the rest inside one 600 s device call
        env: "{{ smoke_env }}"
        fail_on_failure: false
      register: smoke
    - name: Write the result
      changed_when: false
      ansible.builtin.copy:
        dest: "{{ out_file }}"
        mode: "0644"
        content: "{{ smoke | to_nice_json }}"
"""


def tree_digest(root):
    """Paths and sha256 of every file under root: compared before and after a run to show what it changed."""
    out = {}
    for base, _dirs, files in os.walk(root):
        for name in files:
            path = os.path.join(base, name)
            with open(path, "rb") as handle:
                out[os.path.relpath(path, root)] = hashlib.sha256(handle.read()).hexdigest()
    return out


def too_high_profile(workdir):
    with open(os.path.join(REPO, "stacks", "cu130.yml"), encoding="utf-8") as handle:
        profile = yaml.safe_load(handle)
    profile["name"] = "cu130-driver-too-high"
    profile["description"] = "cu130 with driver minimums above the H200's 580.159.04 / CUDA 13.0 (preflight proof)"
    profile["driver"] = dict(TOO_HIGH)
    path = os.path.join(workdir, "cu130-driver-too-high.yml")
    with open(path, "w", encoding="utf-8") as handle:
        yaml.safe_dump(profile, handle, sort_keys=False)
    return path


def playbook(text, extra, env, log, check=False, name="play"):
    path = f"/tmp/gpufleet-{name}.yml"
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)
    cmd = [
        sys.executable,
        "-m",
        "ansible",
        "playbook",
        "-i",
        "localhost,",
        "-c",
        "local",
        path,
        "-e",
        json.dumps(extra),
    ]
    cmd += ["--check"] if check else []
    began = time.monotonic()
    res = subprocess.run(cmd, text=True, capture_output=True, env=env, cwd=REPO)
    wall = round(time.monotonic() - began, 1)
    log.write(f"===== {name} (check={check}) rc={res.returncode} wall={wall}s\n{res.stdout}\n--- stderr ---\n")
    log.write(res.stderr[-4000:] + "\n")
    recap = [line for line in res.stdout.splitlines() if line.startswith("localhost")]
    return {"rc": res.returncode, "wall_s": wall, "check_mode": check, "recap": recap[-1] if recap else None}


def preflight(profile, tag, env, log, check=False):
    state = f"/tmp/pf-state-{tag}"
    shutil.rmtree(state, ignore_errors=True)
    os.makedirs(state)
    out_file = f"/tmp/pf-{tag}.json"
    extra = {
        "gpufleet_stack_profile": profile,
        "gpufleet_run_id": f"device-{tag}",
        "gpufleet_state_dir": state,
        "gpufleet_serving_root": f"/tmp/pf-serving-{tag}",
        "gpufleet_controller_dir": f"/tmp/pf-ctl-{tag}",
        "preflight_check_mirrors": False,  # nothing outside the device machine answers
        "preflight_python": sys.executable,
        "ansible_python_interpreter": sys.executable,
        "out_file": out_file,
    }
    before = tree_digest(state)
    run = playbook(PREFLIGHT_PLAY, extra, env, log, check=check, name=f"preflight-{tag}")
    after = tree_digest(state)
    run["state_dir_changed"] = sorted(set(before.items()) ^ set(after.items()))
    if os.path.exists(out_file):
        with open(out_file, encoding="utf-8") as handle:
            run["result"] = json.load(handle)
    return run


def build(env, log, cuda):
    out_file = "/tmp/gpufleet-build.json"
    extra = {
        "gpufleet_stack_profile": "cu130",
        "smoke_python": sys.executable,
        "smoke_env": {"CUDA_HOME": cuda, "MAX_JOBS": str(os.cpu_count() or 8)},
        "ansible_python_interpreter": sys.executable,
        "out_file": out_file,
    }
    run = playbook(BUILD_PLAY, extra, env, log, name="build")
    if os.path.exists(out_file):
        with open(out_file, encoding="utf-8") as handle:
            run["result"] = json.load(handle)
    return run


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--no-install", action="store_true")
    parser.add_argument("--skip-build", action="store_true")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    os.environ.update(smoke_device.MULTICAST_OFF)
    began = time.monotonic()
    cuda = smoke_device.cuda_home()
    facts = {
        "nvidia_smi": smoke_device.sh("nvidia-smi -L; nvidia-smi --query-gpu=driver_version --format=csv").stdout,
        "python": sys.executable,
        "cuda_home": cuda,
        "nvcc": smoke_device.sh(f"{cuda}/bin/nvcc --version | tail -2").stdout,
        "tools": {t: shutil.which(t) or os.path.exists(f"{cuda}/bin/{t}") for t in ("cuobjdump", "nvdisasm", "ninja")},
        "cpus": os.cpu_count(),
    }
    facts["wheels_rc"] = None if args.no_install else smoke_device.install_wheels()
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=smoke_device.collection_path(), LC_ALL="C.UTF-8")
    env["PYTHONPATH"] = env["ANSIBLE_COLLECTIONS_PATH"] + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    facts["flashinfer"] = smoke_device.sh(
        f"{sys.executable} -c 'import flashinfer, tvm_ffi; print(flashinfer.__version__, flashinfer.__file__)'",
        env=env,
    ).stdout.strip()
    high = too_high_profile("/tmp")
    with open(os.path.join(args.out, "playbooks.log"), "w", encoding="utf-8") as log:
        gates = {
            "cu130": preflight("cu130", "cu130", env, log),
            "too_high": preflight(high, "too-high", env, log),
            "too_high_check_mode": preflight(high, "too-high-check", env, log, check=True),
        }
        with open(os.path.join(args.out, "preflight.json"), "w", encoding="utf-8") as handle:
            json.dump(gates, handle, indent=1, sort_keys=True)
        if not args.skip_build:
            result = build(env, log, cuda)
            with open(os.path.join(args.out, "build.json"), "w", encoding="utf-8") as handle:
                json.dump(result, handle, indent=1, sort_keys=True)
    facts["wall_s"] = round(time.monotonic() - began, 1)
    with open(os.path.join(args.out, "facts.json"), "w", encoding="utf-8") as handle:
        json.dump(facts, handle, indent=1)
    for name, run in gates.items():
        res = run.get("result", {})
        print(name, run["rc"], run["recap"], res.get("preflight_report"), (res.get("refusal") or "")[:600])
    if not args.skip_build:
        bt = (result.get("result") or {}).get("host_checks", {}).get("build_targets", {})
        print("build", result["rc"], result["wall_s"], bt.get("status"), bt.get("message", "")[:3000])
    print(json.dumps(facts, indent=1))


if __name__ == "__main__":
    main()
