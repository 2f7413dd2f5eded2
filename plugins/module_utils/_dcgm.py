# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""DCGM diagnostics where the host has them: ``dcgmi diag -r <level> -j``, its JSON read (DCGM 3.x "DCGM GPU
Diagnostic" -> test_categories -> tests -> results; DCGM 4.x "DCGM Diagnostic", results per entity), judged per test
and GPU. The level per batch: the canary batch runs deeper. Pure functions; the module runs the command."""

from __future__ import annotations

import json

ROOT_KEYS = ("DCGM GPU Diagnostic", "DCGM Diagnostic")
STATUS = {"pass": "pass", "fail": "fail", "warn": "warn", "warning": "warn", "skip": "skip", "skipped": "skip"}


def command(level: int) -> list[str]:
    return ["dcgmi", "diag", "-r", str(int(level)), "-j"]


def level_for(batch_index: int, level: int, canary_level: int | None = None) -> int:
    """The diagnostic level of a batch: the first (canary) batch runs ``canary_level`` when set; 0 is off."""
    if batch_index == 0 and canary_level:
        return int(canary_level)
    return int(level or 0)


def _text(value) -> str:
    if isinstance(value, dict):
        return str(value.get("warning") or value.get("message") or value.get("info") or json.dumps(value))
    return str(value)


def _details(result: dict) -> str:
    items = []
    for key in ("warnings", "errors", "info"):
        value = result.get(key)
        items += [_text(v) for v in (value if isinstance(value, list) else [value] if value else [])]
    return "; ".join(i for i in items if i)


def _gpu(result: dict):
    for key in ("gpu_id", "gpu_ids", "entity_id"):
        if key in result:
            return result[key]
    return None


def parse(text: str) -> dict:
    """``{version, runtime_error, results: [{category, test, gpu, status, detail}]}``; dcgmi may print a line before
    the JSON, and its lists may hold nulls."""
    start = (text or "").find("{")
    if start < 0:
        return {"version": None, "runtime_error": (text or "").strip()[:500] or "no output", "results": []}
    try:
        doc = json.loads(text[start : text.rfind("}") + 1])
    except ValueError as exc:
        return {"version": None, "runtime_error": f"not JSON: {exc}", "results": []}
    root = next((doc[k] for k in ROOT_KEYS if isinstance(doc.get(k), dict)), doc)
    results = []
    categories = root.get("test_categories") or []
    tests = [(c.get("category", ""), t) for c in categories if isinstance(c, dict) for t in c.get("tests") or []]
    tests += [("", t) for t in root.get("tests") or []]
    for category, test in tests:
        if not isinstance(test, dict):
            continue
        for res in test.get("results") or []:
            if isinstance(res, dict):
                status = STATUS.get(str(res.get("status", "")).strip().lower(), "other")
                results.append(
                    {"category": category, "test": test.get("name", "?"), "gpu": _gpu(res), "status": status,
                     "detail": _details(res)}
                )  # fmt: skip
    error = root.get("runtime_error") or doc.get("runtime_error")
    return {"version": root.get("version"), "runtime_error": error, "results": results}


def judge(parsed: dict, host: str, level: int) -> dict:
    """``{passed, reasons, notes, counts}``: a failed test fails the host per GPU; a warning is a note; a run that
    reported no result at all fails (a diagnostic that said nothing has not passed)."""
    what = f"dcgmi diag -r {level}"
    reasons, notes = [], []
    counts: dict = {}
    for r in parsed["results"]:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
        gpu = f"GPU {r['gpu']}" if r["gpu"] not in (None, "") else "the host"
        said = f"{host}: {what}: {gpu} {r['test']}"
        said += f" ({r['category']})" if r["category"] else ""
        if r["status"] == "fail":
            reasons.append(
                f"{said} failed{': ' + r['detail'] if r['detail'] else ''}; fix: follow DCGM's advice in"
                " the line, reset the GPU and run the diagnostic again before putting the host back"
            )
        elif r["status"] == "warn":
            notes.append(f"{said} warned: {r['detail']}")
    if not parsed["results"]:
        reasons.append(
            f"{host}: {what} reported no test result ({parsed.get('runtime_error') or 'empty output'});"
            " fix: check that nv-hostengine runs (systemctl status nvidia-dcgm) and run it by hand"
        )
    return {"passed": not reasons, "reasons": reasons, "notes": notes, "counts": counts,
            "version": parsed.get("version")}  # fmt: skip
