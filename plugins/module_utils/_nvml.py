# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""GPU facts through NVML (nvidia-ml-py) and the health rules judged on them.

collect() takes the pynvml module (or a stand-in with the same functions and constants) so the rules can be
driven by recorded real outputs in unit tests. judge_gpu() / judge_host() are pure functions of those facts.
"""

from __future__ import annotations

NOT_SUPPORTED = "not supported"

# NVML return codes (nvml.h); compared by value so a stand-in module needs no exception classes of its own.
_ERR_NOT_SUPPORTED = 3
_ERR_FUNCTION_NOT_FOUND = 13
_ERR_GPU_IS_LOST = 15
# nvmlInit failures that mean "this host has no usable NVIDIA driver".
_NO_DRIVER_CODES = {9: "the NVIDIA kernel driver is not loaded", 12: "libnvidia-ml.so.1 was not found"}

# Bit -> name of nvmlDeviceGetCurrentClocksEventReasons, named as the profile's postcheck.health.fail_on_clock_events.
CLOCK_EVENT_BITS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}

DEFAULT_THRESHOLDS = {
    "max_uncorrectable_ecc": 0,
    "max_pending_row_remaps": 0,
    "allow_row_remap_failure": False,
    "allow_pcie_downgrade": False,
    "max_temperature_c": 87,
    "forbid_processes": True,
    "fail_on_clock_events": ["hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "sw_thermal_slowdown"],
}


class NvmlUnavailable(Exception):
    """NVML cannot be used on this host (no driver, no library, no nvidia-ml-py)."""


class NvmlFieldError(Exception):
    """An NVML call failed for a reason other than 'not supported'."""


def is_not_supported(value) -> bool:
    return value == NOT_SUPPORTED


def _code(exc):
    return getattr(exc, "value", None)


def _read(nvml, errors, field, fn_name, *args):
    """One NVML call: its value, NOT_SUPPORTED, or None with the error kept in `errors`."""
    fn = getattr(nvml, fn_name, None)
    if fn is None:
        return NOT_SUPPORTED  # this nvidia-ml-py predates the call
    try:
        return fn(*args)
    except nvml.NVMLError as exc:
        if _code(exc) in (_ERR_NOT_SUPPORTED, _ERR_FUNCTION_NOT_FOUND):
            return NOT_SUPPORTED
        errors[field] = {"call": fn_name, "code": _code(exc), "error": str(exc)}
        return None


def _text(value):
    return value.decode() if isinstance(value, bytes) else value


def init(nvml):
    """nvmlInit, mapping 'no driver' failures to NvmlUnavailable with the reason."""
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        reason = _NO_DRIVER_CODES.get(_code(exc), f"NVML failed to initialise: {exc}")
        raise NvmlUnavailable(reason) from exc


def load_pynvml():
    try:
        import pynvml  # nvidia-ml-py
    except ImportError as exc:
        raise NvmlUnavailable(f"the Python package nvidia-ml-py (module pynvml) is not installed: {exc}") from exc
    return pynvml


def collect(nvml) -> dict:
    """Host and per-GPU facts. nvml must already be initialised (see init())."""
    errors: dict = {}
    cuda_raw = _read(nvml, errors, "cuda_driver_version", "nvmlSystemGetCudaDriverVersion_v2")
    facts = {
        "driver_version": _text(_read(nvml, errors, "driver_version", "nvmlSystemGetDriverVersion")),
        "cuda_driver_version": cuda_version_string(cuda_raw),
        "cuda_driver_version_raw": cuda_raw,
        "nvml_version": _text(_read(nvml, errors, "nvml_version", "nvmlSystemGetNVMLVersion")),
        "errors": errors,
    }
    count = _read(nvml, errors, "gpu_count", "nvmlDeviceGetCount")
    facts["gpu_count"] = count if isinstance(count, int) else 0
    facts["gpus"] = [collect_gpu(nvml, index) for index in range(facts["gpu_count"])]
    return facts


def cuda_version_string(raw):
    """13000 -> '13.0', 13010 -> '13.1' (NVML encodes major*1000 + minor*10)."""
    if not isinstance(raw, int):
        return raw
    return f"{raw // 1000}.{(raw % 1000) // 10}"


def collect_gpu(nvml, index: int) -> dict:
    errors: dict = {}
    gpu = {"index": index, "errors": errors}
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
    except nvml.NVMLError as exc:
        errors["handle"] = {"call": "nvmlDeviceGetHandleByIndex", "code": _code(exc), "error": str(exc)}
        gpu["lost"] = _code(exc) == _ERR_GPU_IS_LOST
        return gpu

    def read(field, fn_name, *args):
        return _read(nvml, errors, field, fn_name, handle, *args)

    gpu["name"] = _text(read("name", "nvmlDeviceGetName"))
    gpu["uuid"] = _text(read("uuid", "nvmlDeviceGetUUID"))
    pci = read("pci_bus_id", "nvmlDeviceGetPciInfo")
    gpu["pci_bus_id"] = _text(getattr(pci, "busId", pci)) if pci is not None else None
    cc = read("compute_capability", "nvmlDeviceGetCudaComputeCapability")
    gpu["compute_capability"] = f"{cc[0]}.{cc[1]}" if isinstance(cc, (tuple, list)) else cc
    mem = read("memory", "nvmlDeviceGetMemoryInfo")
    gpu["memory"] = {"total_mib": mem.total // 2**20, "used_mib": mem.used // 2**20} if hasattr(mem, "total") else mem
    gpu["persistence_mode"] = _feature(read("persistence_mode", "nvmlDeviceGetPersistenceMode"))
    pstate = read("performance_state", "nvmlDeviceGetPerformanceState")
    gpu["performance_state"] = f"P{pstate}" if isinstance(pstate, int) else pstate
    gpu["ecc_mode"] = _ecc_mode(read("ecc_mode", "nvmlDeviceGetEccMode"))
    gpu["ecc_errors"] = _ecc_errors(nvml, read)
    gpu["remapped_rows"] = _remapped_rows(read("remapped_rows", "nvmlDeviceGetRemappedRows"))
    gpu["retired_pages"] = _retired_pages(nvml, read)
    gpu["pcie"] = {
        "gen_current": read("pcie.gen_current", "nvmlDeviceGetCurrPcieLinkGeneration"),
        "gen_max": read("pcie.gen_max", "nvmlDeviceGetMaxPcieLinkGeneration"),
        "gen_gpu_max": read("pcie.gen_gpu_max", "nvmlDeviceGetGpuMaxPcieLinkGeneration"),
        "width_current": read("pcie.width_current", "nvmlDeviceGetCurrPcieLinkWidth"),
        "width_max": read("pcie.width_max", "nvmlDeviceGetMaxPcieLinkWidth"),
        "replay_counter": read("pcie.replay_counter", "nvmlDeviceGetPcieReplayCounter"),
    }
    gpu["nvlink"] = _nvlink(nvml, handle)
    reasons = read("clock_event_reasons", "nvmlDeviceGetCurrentClocksEventReasons")
    gpu["clock_event_reasons"] = clock_event_names(reasons) if isinstance(reasons, int) else reasons
    gpu["temperature_c"] = read("temperature_c", "nvmlDeviceGetTemperature", getattr(nvml, "NVML_TEMPERATURE_GPU", 0))
    gpu["power"] = {
        "draw_w": _milli(read("power.draw_w", "nvmlDeviceGetPowerUsage")),
        "limit_w": _milli(read("power.limit_w", "nvmlDeviceGetEnforcedPowerLimit")),
    }
    gpu["processes"] = _processes(nvml, read("processes", "nvmlDeviceGetComputeRunningProcesses"))
    return gpu


def _feature(value):
    if isinstance(value, int):
        return "enabled" if value else "disabled"
    return value


def _milli(value):
    return round(value / 1000.0, 1) if isinstance(value, (int, float)) else value


def _ecc_mode(value):
    if isinstance(value, (tuple, list)):
        return {"current": _feature(value[0]), "pending": _feature(value[1])}
    return value


def _ecc_errors(nvml, read):
    out = {}
    for counter, counter_const in (("volatile", "NVML_VOLATILE_ECC"), ("aggregate", "NVML_AGGREGATE_ECC")):
        out[counter] = {}
        for kind, kind_const in (
            ("corrected", "NVML_MEMORY_ERROR_TYPE_CORRECTED"),
            ("uncorrected", "NVML_MEMORY_ERROR_TYPE_UNCORRECTED"),
        ):
            out[counter][kind] = read(
                f"ecc_errors.{counter}.{kind}",
                "nvmlDeviceGetTotalEccErrors",
                getattr(nvml, kind_const),
                getattr(nvml, counter_const),
            )
    return out


def _remapped_rows(value):
    if isinstance(value, (tuple, list)):
        return {
            "correctable": value[0],
            "uncorrectable": value[1],
            "pending": bool(value[2]),
            "failure": bool(value[3]),
        }
    return value


def _retired_pages(nvml, read):
    single = read(
        "retired_pages.single_bit_ecc",
        "nvmlDeviceGetRetiredPages",
        getattr(nvml, "NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS", 0),
    )
    if is_not_supported(single):
        return NOT_SUPPORTED  # A100 and newer replaced page retirement with row remapping
    double = read(
        "retired_pages.double_bit_ecc",
        "nvmlDeviceGetRetiredPages",
        getattr(nvml, "NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR", 1),
    )
    pending = read("retired_pages.pending", "nvmlDeviceGetRetiredPagesPendingStatus")
    return {
        "single_bit_ecc": len(single) if isinstance(single, (list, tuple)) else single,
        "double_bit_ecc": len(double) if isinstance(double, (list, tuple)) else double,
        "pending": _feature(pending) == "enabled" if isinstance(pending, int) else pending,
    }


def _nvlink(nvml, handle):
    """Link states until the first link the GPU does not have (NVML answers not supported or invalid argument)."""
    states = []
    for link in range(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18)):
        try:
            states.append(bool(nvml.nvmlDeviceGetNvLinkState(handle, link)))
        except nvml.NVMLError:
            break
        except AttributeError:
            break
    if not states:
        return NOT_SUPPORTED
    return {"links": len(states), "active": sum(states), "inactive": len(states) - sum(states)}


def _processes(nvml, value):
    if not isinstance(value, (list, tuple)):
        return value
    out = []
    for proc in value:
        used = getattr(proc, "usedGpuMemory", None)
        name = None
        try:
            name = _text(nvml.nvmlSystemGetProcessName(proc.pid))
        except nvml.NVMLError:
            pass  # the process may have ended between the two calls
        out.append({"pid": proc.pid, "name": name, "used_mib": used // 2**20 if isinstance(used, int) else None})
    return out


def clock_event_names(mask: int) -> list[str]:
    names = [name for bit, name in CLOCK_EVENT_BITS.items() if mask & bit]
    unknown = mask & ~sum(CLOCK_EVENT_BITS)
    if unknown:
        names.append(f"unknown_0x{unknown:x}")
    return names


# ---------------------------------------------------------------------------------------------- health rules


def describe(gpu) -> str:
    return f"GPU {gpu.get('index')} ({gpu.get('uuid') or 'uuid unknown'}, {gpu.get('name') or 'name unknown'})"


def _num(value):
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def judge_gpu(gpu: dict, thresholds: dict | None = None, server_pids: set[int] | None = None) -> dict:
    """Health of one GPU: {'healthy', 'reasons' (gates failed), 'notes' (facts worth reading, not gates),
    'server_processes', 'foreign_processes'}.

    ``server_pids``: the serving unit's processes (its main pid and every descendant, see _server.server_pid_set); their
    compute processes are listed as the server's and never fail the GPU. None: nobody said, every process is foreign.
    """
    t = dict(DEFAULT_THRESHOLDS, **(thresholds or {}))
    who = describe(gpu)
    reasons, notes = [], []
    if "handle" in gpu.get("errors", {}):
        err = gpu["errors"]["handle"]["error"]
        state = "has fallen off the bus (GPU is lost)" if gpu.get("lost") else "cannot be opened"
        reasons.append(f"{who} {state}: NVML said {err!r}; check `dmesg` for Xid errors and reset or reseat the GPU")
        return {"healthy": False, "reasons": reasons, "notes": notes, "server_processes": [], "foreign_processes": []}

    _rule_ecc(gpu, t, who, reasons, notes)
    _rule_remap(gpu, t, who, reasons)
    _rule_retired(gpu, who, reasons)
    _rule_pcie(gpu, t, who, reasons, notes)
    _rule_clocks(gpu, t, who, reasons)
    _rule_temperature(gpu, t, who, reasons)
    server, foreign = _rule_processes(gpu, t, who, reasons, notes, server_pids)
    for field, err in sorted(gpu.get("errors", {}).items()):
        notes.append(f"{who}: NVML could not read {field} ({err['call']}: {err['error']})")
    return {
        "healthy": not reasons,
        "reasons": reasons,
        "notes": notes,
        "server_processes": server,
        "foreign_processes": foreign,
    }


def _rule_ecc(gpu, t, who, reasons, notes):
    ecc = gpu.get("ecc_errors")
    mode = gpu.get("ecc_mode")
    if isinstance(mode, dict) and mode.get("current") != mode.get("pending"):
        notes.append(f"{who}: ECC mode is {mode['current']} but {mode['pending']} is pending a GPU reset or reboot")
    if not isinstance(ecc, dict):
        return
    limit = t["max_uncorrectable_ecc"]
    for counter in ("volatile", "aggregate"):
        seen = _num(ecc.get(counter, {}).get("uncorrected"))
        if seen is not None and seen > limit:
            reasons.append(
                f"{who}: {seen} uncorrectable ECC errors ({counter} counter), more than the {limit} allowed by"
                " postcheck.health.max_uncorrectable_ecc; take the GPU out of service and check its row remapping"
                " (nvidia-smi -q -d ROW_REMAPPER), then reset it or have it replaced"
            )
            return


def _rule_remap(gpu, t, who, reasons):
    rows = gpu.get("remapped_rows")
    if not isinstance(rows, dict):
        return
    pending = 1 if rows.get("pending") else 0
    if pending > t["max_pending_row_remaps"]:
        reasons.append(
            f"{who}: a row remap is pending (more than the {t['max_pending_row_remaps']} allowed by"
            " postcheck.health.max_pending_row_remaps); drain the GPU and reset it (nvidia-smi -r) or reboot the host"
            " so the remap takes effect"
        )
    if rows.get("failure") and not t["allow_row_remap_failure"]:
        reasons.append(
            f"{who}: a row remap has failed (the GPU ran out of spare rows); the GPU needs replacing"
            " (postcheck.health.allow_row_remap_failure is false)"
        )


def _rule_retired(gpu, who, reasons):
    pages = gpu.get("retired_pages")
    if isinstance(pages, dict) and pages.get("pending") is True:
        reasons.append(f"{who}: retired pages are pending; reset the GPU or reboot the host so they are retired")


def _rule_pcie(gpu, t, who, reasons, notes):
    pcie = gpu.get("pcie")
    if not isinstance(pcie, dict) or t["allow_pcie_downgrade"]:
        return
    width, width_max = _num(pcie.get("width_current")), _num(pcie.get("width_max"))
    if width is not None and width_max is not None and width < width_max:
        reasons.append(
            f"{who}: PCIe link runs at x{width}, below its maximum x{width_max}; reseat the GPU or check the riser"
            " and slot (a narrowed link is a classic fault after a reboot),"
            " or set postcheck.health.allow_pcie_downgrade"
        )
    gen, gen_max = _num(pcie.get("gen_current")), _num(pcie.get("gen_max"))
    if gen is not None and gen_max is not None and gen < gen_max:
        # An idle GPU trains its link down to save power; only a busy one (P0) must run at full generation.
        if gpu.get("performance_state") == "P0":
            reasons.append(
                f"{who}: PCIe link runs at gen {gen} under load (P0), below its maximum gen {gen_max}; check the slot,"
                " riser and BIOS link speed setting, or set postcheck.health.allow_pcie_downgrade"
            )
        else:
            notes.append(
                f"{who}: PCIe link at gen {gen} of {gen_max} while in {gpu.get('performance_state')}"
                " (idle power saving)"
            )


def _rule_clocks(gpu, t, who, reasons):
    events = gpu.get("clock_event_reasons")
    if not isinstance(events, list):
        return
    bad = [e for e in events if e in set(t["fail_on_clock_events"])]
    if bad:
        reasons.append(
            f"{who}: clocks are held down by {', '.join(bad)} (listed in postcheck.health.fail_on_clock_events);"
            " check cooling, power supply and `nvidia-smi -q -d PERFORMANCE`"
        )


def _rule_temperature(gpu, t, who, reasons):
    temp = _num(gpu.get("temperature_c"))
    if temp is not None and temp > t["max_temperature_c"]:
        reasons.append(
            f"{who}: temperature {temp} C is above {t['max_temperature_c']} C (postcheck.health.max_temperature_c);"
            " check fans, airflow and the inlet temperature"
        )


def split_processes(procs, server_pids):
    """One GPU's compute processes as (the server's, foreign). With ``server_pids`` None nobody said which
    processes are the server's, so every process is foreign (the rule as it reads on a drained host)."""
    if not isinstance(procs, list):
        return [], []
    if server_pids is None:
        return [], list(procs)
    server = [p for p in procs if p.get("pid") in server_pids]
    return server, [p for p in procs if p.get("pid") not in server_pids]


def _listed(procs) -> str:
    def one(p):
        used = f", {p['used_mib']} MiB" if isinstance(p.get("used_mib"), int) else ""
        return f"{p['pid']} ({p.get('name') or '?'}{used})"

    return ", ".join(one(p) for p in procs)


def _rule_processes(gpu, t, who, reasons, notes, server_pids):
    """The serving unit's own processes are expected on a serving host; any other compute process is foreign."""
    server, foreign = split_processes(gpu.get("processes"), server_pids)
    if server:
        notes.append(f"{who}: the serving unit's process(es) {_listed(server)}")
    if not foreign:
        return server, foreign
    if not t["forbid_processes"]:
        notes.append(
            f"{who}: compute process(es) that are not the serving unit's: {_listed(foreign)}"
            " (allowed: postcheck.health.forbid_processes is false)"
        )
    elif server_pids is None:
        reasons.append(
            f"{who}: {len(foreign)} compute process(es) run on it: {_listed(foreign)}; the serving unit's processes"
            " were not given (no server_unit that systemd could read, no server_main_pid), so none counts as the"
            " server's: name the unit, or its main pid where there is no systemd (postcheck_server_main_pid), stop"
            " the processes, or set"
            " postcheck.health.forbid_processes to false"
        )
    else:
        reasons.append(
            f"{who}: {len(foreign)} compute process(es) that are not the serving unit's run on it: {_listed(foreign)};"
            " stop them before the post-check (the unit's own processes are expected), or set"
            " postcheck.health.forbid_processes to false"
        )
    return server, foreign


def judge_host(
    facts: dict,
    thresholds: dict | None = None,
    expected_gpu_count: int | None = None,
    server_pids: set[int] | None = None,
) -> dict:
    """Judge every GPU; the host is healthy when all GPUs are and the count matches what was expected.

    ``server_pids`` as in judge_gpu. ``server_processes`` and ``foreign_processes`` list each process with its GPU.
    """
    host_reasons = []
    for field, err in sorted(facts.get("errors", {}).items()):
        host_reasons.append(f"NVML could not read {field} ({err['call']}: {err['error']})")
    count = facts.get("gpu_count", 0)
    if expected_gpu_count is not None and count != expected_gpu_count:
        host_reasons.append(
            f"NVML sees {count} GPU(s), {expected_gpu_count} expected; a GPU that fell off the bus or a missing"
            " driver module are the usual causes (check `dmesg` for Xid errors)"
        )
    per_gpu = []
    for gpu in facts.get("gpus", []):
        verdict = judge_gpu(gpu, thresholds, server_pids)
        gpu_out = dict(gpu, **verdict)
        per_gpu.append(gpu_out)
    reasons = host_reasons + [r for g in per_gpu for r in g["reasons"]]
    notes = [n for g in per_gpu for n in g["notes"]]
    server = [dict(p, gpu=g["index"]) for g in per_gpu for p in g["server_processes"]]
    foreign = [dict(p, gpu=g["index"]) for g in per_gpu for p in g["foreign_processes"]]
    notes += _server_notes(server_pids, server, per_gpu)
    return {
        "healthy": not reasons,
        "reasons": reasons,
        "notes": notes,
        "gpus": per_gpu,
        "server_processes": server,
        "foreign_processes": foreign,
    }


def _server_notes(server_pids, server, gpus) -> list:
    """What is worth knowing of the server itself: not running, or running without a GPU process."""
    if server_pids is None or not gpus:
        return []
    if not server_pids:
        return ["the serving unit runs no process (its main pid is 0 or gone): every compute process counts as foreign"]
    if not server:
        shown = ", ".join(str(p) for p in sorted(server_pids)[:8]) + (" ..." if len(server_pids) > 8 else "")
        return [f"the serving unit's processes ({shown}) hold no GPU: NVML lists none of them as a compute process"]
    return []


# --------------------------------------------------------------------------- the host's health, read and judged

# Options of the health thresholds, shared by the modules that judge GPUs (nvml_info, host_state).
THRESHOLD_SPEC = {
    "max_uncorrectable_ecc": {"type": "int", "default": 0},
    "max_pending_row_remaps": {"type": "int", "default": 0},
    "allow_row_remap_failure": {"type": "bool", "default": False},
    "allow_pcie_downgrade": {"type": "bool", "default": False},
    "max_temperature_c": {"type": "int", "default": 87},
    "forbid_processes": {"type": "bool", "default": True},
    "fail_on_clock_events": {
        "type": "list",
        "elements": "str",
        "default": list(DEFAULT_THRESHOLDS["fail_on_clock_events"]),
    },
}


def memory_holders(nvml, server_pids=None) -> dict:
    """Per GPU UUID: its memory and who holds it - the serving unit's processes and the others (split_processes).
    nvml must be initialised. A GPU that cannot be opened is left out."""
    errors: dict = {}
    count = _read(nvml, errors, "gpu_count", "nvmlDeviceGetCount")
    out = {}
    for index in range(count if isinstance(count, int) else 0):
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
        except nvml.NVMLError:
            continue
        uuid = _text(_read(nvml, errors, "uuid", "nvmlDeviceGetUUID", handle))
        mem = _read(nvml, errors, "memory", "nvmlDeviceGetMemoryInfo", handle)
        procs = _processes(nvml, _read(nvml, errors, "processes", "nvmlDeviceGetComputeRunningProcesses", handle))
        server, other = split_processes(procs, server_pids)
        out[uuid] = {
            "index": index,
            "total_mib": mem.total // 2**20 if hasattr(mem, "total") else None,
            "used_mib": mem.used // 2**20 if hasattr(mem, "used") else None,
            "server_pids": None if server_pids is None else [p["pid"] for p in server],
            "server_mib": sum(p.get("used_mib") or 0 for p in server),
            "other_pids": [p["pid"] for p in other],
            "other_mib": sum(p.get("used_mib") or 0 for p in other),
        }
    return out


def read_memory_holders(loader, server_pids=None):
    """memory_holders in an NVML session of its own: ``(holders, None)``, or ``({}, reason)`` without NVML."""
    try:
        nvml = loader()
        init(nvml)
    except NvmlUnavailable as exc:
        return {}, str(exc)
    try:
        return memory_holders(nvml, server_pids), None
    finally:
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError:
            pass  # nothing is left to release when shutdown itself fails


def unavailable_message(host, exc) -> str:
    return (
        f"{host}: NVML is not available: {exc}. Install the NVIDIA driver (and nvidia-ml-py for the Python"
        " that runs Ansible modules), or set gpufleet_gpu_required=false for hosts that have no GPU."
    )


def skipped_health(reason) -> dict:
    return {
        "changed": False,
        "status": "skipped",
        "healthy": None,
        "skipped_reason": f"skipped: no GPU ({reason})",
        "reasons": [],
        "notes": [],
        "gpu_count": 0,
        "gpus": [],
    }


def host_health(loader, gpu_required=True, thresholds=None, expected_gpu_count=None, server_pids=None):
    """Read every GPU through NVML and judge the host: ``(result, facts)``.

    ``server_pids``: the serving unit's processes (_server.server_pid_set), expected on the GPUs; None: every compute
    process is foreign.

    ``facts`` is None when the GPUs were not judged (no NVML or no GPU, and none required: ``result`` says skipped).
    Raises NvmlUnavailable when NVML cannot be used and a GPU is required.
    """
    try:
        nvml = loader()
        init(nvml)
    except NvmlUnavailable as exc:
        if not gpu_required:
            return skipped_health(str(exc)), None
        raise
    try:
        facts = collect(nvml)
    finally:
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError:
            pass  # nothing is left to release when shutdown itself fails
    if facts["gpu_count"] == 0 and not gpu_required:
        return dict(skipped_health("NVML sees no GPU"), driver_version=facts["driver_version"]), None
    verdict = judge_host(facts, thresholds, expected_gpu_count, server_pids)
    if facts["gpu_count"] == 0:
        verdict["reasons"].insert(0, "NVML sees no GPU but one is required (gpufleet_gpu_required)")
        verdict["healthy"] = False
    result = {
        "changed": False,
        "status": "healthy" if verdict["healthy"] else "unhealthy",
        "healthy": verdict["healthy"],
        "reasons": verdict["reasons"],
        "notes": verdict["notes"],
        "driver_version": facts["driver_version"],
        "cuda_driver_version": facts["cuda_driver_version"],
        "nvml_version": facts["nvml_version"],
        "gpu_count": facts["gpu_count"],
        "gpus": verdict["gpus"],
        "server_processes": verdict["server_processes"],
        "foreign_processes": verdict["foreign_processes"],
    }
    return result, facts
