# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The preflight's GPU gates, judged on NVML facts (_nvml.collect): the driver version, the CUDA version the driver
supports and every GPU's SM must reach the profile's minimums.

Pure functions of the facts; nvml_info calls them (option gates) and the preflight role only records the verdict.
Each failure names the host, the value seen, the minimum and the fix; nothing on the host is changed.
"""

from __future__ import annotations

import re

_NUMERIC = re.compile(r"^[0-9]+(\.[0-9]+)*$")


def version_tuple(value):
    """'580.159.04' -> (580, 159, 4); '12.0' -> (12, 0); None for anything that is not dotted numbers.

    Components compare as numbers: a string comparison would put '12.0' below '7.5' and '580.65' above '580.159'.
    """
    if isinstance(value, bool) or value is None:
        return None
    text = str(value).strip()
    if not _NUMERIC.match(text):
        return None
    return tuple(int(part) for part in text.split("."))


def below(seen, minimum) -> bool | None:
    """Whether seen < minimum, padding the shorter with zeros ('13' == '13.0'); None when either is unreadable."""
    a, b = version_tuple(seen), version_tuple(minimum)
    if a is None or b is None:
        return None
    width = max(len(a), len(b))
    return a + (0,) * (width - len(a)) < b + (0,) * (width - len(b))


def _gpu_label(gpu) -> str:
    return f"GPU {gpu.get('index')} ({gpu.get('name') or 'name unknown'}, {gpu.get('uuid') or 'uuid unknown'})"


def _nvml_said(facts, field) -> str:
    error = (facts.get("errors") or {}).get(field, {}).get("error")
    return f"NVML answered: {error}" if error else "NVML answered no version"


def _driver(facts, minimum, host, profile):
    seen = facts.get("driver_version")
    verdict = below(seen, minimum)
    if verdict is None:
        return (
            f"{host}: the NVIDIA driver version reads {seen!r}, which cannot be compared with the minimum {minimum}"
            f" of profile {profile}; fix: check the driver with nvidia-smi ({_nvml_said(facts, 'driver_version')})"
        )
    if verdict:
        return (
            f"{host}: NVIDIA driver {seen} is below {minimum}, the minimum of profile {profile} (driver.min_version);"
            f" fix: upgrade the driver to {minimum} or newer first (CUDA 13 needs 580 or newer)"
        )
    return None


def _cuda_driver(facts, minimum, host, profile):
    seen = facts.get("cuda_driver_version")
    verdict = below(seen, minimum)
    if verdict is None:
        return (
            f"{host}: the CUDA version the driver supports reads {seen!r}, which cannot be compared with"
            f" {minimum} (profile {profile}, driver.min_cuda); fix: check the driver with nvidia-smi"
            f" ({_nvml_said(facts, 'cuda_driver_version')})"
        )
    if verdict:
        return (
            f"{host}: the driver supports CUDA {seen}, the target needs {minimum} (profile {profile},"
            f" driver.min_cuda); fix: upgrade the driver to one that supports CUDA {minimum}"
        )
    return None


def _gpu_sm(gpu, minimum, host):
    seen = gpu.get("compute_capability")
    verdict = below(seen, minimum)
    if verdict is None:
        err = gpu.get("errors", {}).get("handle", {}).get("error")
        why = f"NVML could not open it ({err})" if err else f"its SM reads {seen!r}"
        return (
            f"{host}: {_gpu_label(gpu)}: {why}, so it cannot be held against the minimum SM {minimum}; fix: check"
            " the GPU (nvidia-smi, dmesg for Xid errors) before upgrading"
        )
    if verdict:
        return (
            f"{host}: {_gpu_label(gpu)} has SM {seen}, below the minimum {minimum} (CUDA 13 dropped"
            " sm_50..sm_72); fix: leave this host out of the upgrade (--limit) or give it a profile for its GPUs"
        )
    return None


def judge_gpu_gates(facts: dict, minimums: dict, host: str) -> dict:
    """Verdict of the three GPU gates on NVML facts.

    minimums: min_driver_version, min_cuda_driver_version, min_compute_capability (strings, any may be None = not
    gated) and profile (its name, for the messages). Returns passed, failures (one sentence each), report (the
    preflight_report line) and gates (per gate: seen, minimum, passed).
    """
    profile = minimums.get("profile") or "in use"
    failures, gates = [], {}
    for gate, key, judge in (
        ("driver", "min_driver_version", _driver),
        ("cuda_driver", "min_cuda_driver_version", _cuda_driver),
    ):
        minimum = minimums.get(key)
        if not minimum:
            continue
        problem = judge(facts, minimum, host, profile)
        seen = facts.get("driver_version" if gate == "driver" else "cuda_driver_version")
        gates[gate] = {"seen": seen, "minimum": minimum, "passed": problem is None}
        failures += [problem] if problem else []
    gpus = facts.get("gpus", [])
    if not gpus:
        failures.append(
            f"{host}: NVML sees no GPU but the profile requires one (gpu.required); fix: check that the driver module"
            " is loaded and the GPUs are on the bus (nvidia-smi, dmesg), or set gpufleet_gpu_required=false for hosts"
            " without GPUs"
        )
    minimum_sm = minimums.get("min_compute_capability")
    if minimum_sm:
        sm_gate = []
        for gpu in gpus:
            problem = _gpu_sm(gpu, minimum_sm, host)
            sm_gate.append({"index": gpu.get("index"), "seen": gpu.get("compute_capability"), "passed": not problem})
            failures += [problem] if problem else []
        gates["compute_capability"] = {"minimum": minimum_sm, "gpus": sm_gate}
    report = (
        f"ok: driver {facts.get('driver_version')}, CUDA {facts.get('cuda_driver_version')}, {len(gpus)} GPU(s)"
        if not failures
        else "failed"
    )
    return {"passed": not failures, "failures": failures, "report": report, "gates": gates}


def nvml_unusable(reason: str, host: str) -> dict:
    """Verdict when NVML cannot be used at all: every GPU gate fails with one reason."""
    failure = (
        f"{host}: NVML is not usable ({reason}); fix: install the NVIDIA driver (and nvidia-ml-py for the Python that"
        " runs Ansible modules), or set gpufleet_gpu_required=false for hosts without GPUs"
    )
    return {"passed": False, "failures": [failure], "report": "failed", "gates": {}}
