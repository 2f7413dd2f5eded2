# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filter preflight_gates: role preflight's verdict on what module preflight_probe read on a host.

Documented in ``preflight_gates.yml`` beside this file. One call judges every gate after the lock (state, Python, GPU,
free space, mirrors, drained), in the order the report lists them; each failure names the host, the value seen and
the fix. The free space gate is filter disk_gate's; the GPU gates are judged on the host (module nvml_info, option
gates) and only recorded here.
"""

from __future__ import annotations

from ansible_collections.gpufleet.upgrade.plugins.filter.disk import disk_gate

_MIRROR_FIX = "fix: start the mirror or point gpufleet_index_urls / gpufleet_redist_url at one that answers"


def _state(recovery: dict, host: str) -> tuple:
    refuse = recovery["action"] == "refuse"
    report = ("failed: " if refuse else "ok: ") + str(recovery["reason"])
    return report, [f"{host}: {recovery['reason']}"] if refuse else []


def _python(python: dict, host: str, name: str, version: str) -> tuple:
    if python.get("skipped"):
        return "ok: not required", []
    if python.get("rc") == 0:
        return f"ok: {python.get('path', '')}", []
    return "failed", [
        f"{host}: {name} is not on the host (PATH of the SSH user); fix: install it (the profile asks for Python"
        f" {version}) or set preflight_python"
    ]


def _gpu(required: bool, nvml: dict | None, host: str) -> tuple:
    if not required:
        return "skipped: no GPU", []
    gates = (nvml or {}).get("gates")
    if not gates:
        # Without NVML the module fails with its verdict in `gates`; a module that broke has none.
        message = (nvml or {}).get("msg") or "no message"
        return "failed", [
            f"{host}: nvml_info gave no verdict ({message}); fix: run it by hand on the host"
            " (ansible -m gpufleet.upgrade.nvml_info) and read its error"
        ]
    return gates["report"], list(gates["failures"])


def _mirror_answers(controller: dict | None, host_answers: list) -> list:
    """(where, url, status, msg) of every mirror answer: the controller's uri loop results, then the host's."""
    answers = [
        ("the controller", r.get("item"), r.get("status", -1), r.get("msg", ""))
        for r in (controller or {}).get("results") or []
        if not r.get("skipped")
    ]
    return answers + [("the host", a["url"], a["status"], a.get("msg", "")) for a in host_answers or []]


def _mirrors(urls: list, controller: dict | None, host_answers: list, host: str) -> tuple:
    failures = [
        f"{host}: {url} answered {status} from {where} ({msg}); {_MIRROR_FIX}"
        for where, url, status, msg in _mirror_answers(controller, host_answers)
        if status != 200
    ]
    return ("failed" if failures else f"ok: {len(urls)} answered"), failures


def _drained(drained: dict, host: str, cmd: str) -> tuple:
    if drained.get("skipped"):
        return "not required", []
    if drained.get("rc") == 0:
        return "ok", []
    stderr = str(drained.get("stderr", "")).strip()[-200:]
    return "failed", [
        f"{host}: the drained check `{cmd}` exited {drained.get('rc', '?')} ({stderr}); fix: drain the host first, or"
        " use gpufleet_drain to let the run drain it"
    ]


def preflight_gates(
    probe: dict,
    host: str,
    lock_msg: str = "",
    python: str = "",
    python_version: str = "",
    gpu_required: bool = False,
    nvml: dict | None = None,
    check_mirrors: bool = True,
    mirror_urls=(),
    controller_mirrors: dict | None = None,
    drained_check_cmd: str = "",
    lock=None,
    toolkit_free_bytes: int = 0,
    venv_free_bytes: int = 0,
    space_factor: float = 1.5,
) -> dict:
    """{report, failures}; the report lists lock, state, python, gpu, disk, mirrors (if checked), drained."""
    state_report, failures = _state(probe["state"]["recovery"], host)
    report = {"lock": f"ok: {lock_msg}", "state": state_report}
    for name, (said, failed) in (
        ("python", _python(probe["python"], host, python, python_version)),
        ("gpu", _gpu(bool(gpu_required), nvml, host)),
    ):
        report[name] = _said(said, failed, host)
        failures += failed
    paths = probe["disk"]["paths"]
    disk = disk_gate(
        probe["disk"]["df"],
        host=host,
        measured=probe["disk"]["du"],
        venv_path=paths[0]["lnk_source"] or "",
        cuda_path=paths[1]["lnk_source"] or "",
        toolkit_installed=paths[2]["exists"],
        lock=lock,
        toolkit_free_bytes=int(toolkit_free_bytes),
        venv_free_bytes=int(venv_free_bytes),
        space_factor=float(space_factor),
    )
    report["disk"] = _said(disk["report"], disk["failures"], host)
    failures += disk["failures"]
    if check_mirrors:
        said, failed = _mirrors(list(mirror_urls or []), controller_mirrors, probe["mirrors"], host)
        report["mirrors"] = _said(said, failed, host)
        failures += failed
    said, failed = _drained(probe["drained"], host, drained_check_cmd)
    report["drained"] = _said(said, failed, host)
    failures += failed
    return {"report": report, "failures": failures}


def _said(said: str, failed: list, host: str) -> str:
    """A failed gate's report entry with its own reasons whole (``failed: <what>; fix: ...``): the run's report files
    keep every gate's reason, not only the outcome line cut to length."""
    if said != "failed" or not failed:
        return said
    return "failed: " + "; ".join(f[len(host) + 2 :] if f.startswith(f"{host}: ") else f for f in failed)


class FilterModule:
    def filters(self):
        return {"preflight_gates": preflight_gates}
