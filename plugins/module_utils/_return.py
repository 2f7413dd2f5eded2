# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Time back to service of a serving host: its edges, its record on the host and its gate (pure logic).

A host returns to service along four edges: the unit stopped (``stop``: systemd's ActiveExitTimestamp, the drain's
stop or the restart's), its main process started (``process_up``: ExecMainStartTimestamp), ``/health`` answered 200
(``health``: role serving's wait) and a whole warm-up pass compiled nothing new (``warm``: the post-check's warm-up).
Every time is the host's CLOCK_MONOTONIC in seconds (systemd's ``*TimestampMonotonic`` and Python's
``time.monotonic`` read the same clock), so the edges are differences on one clock of one boot (``boot_id``).

Role serving publishes the first three (fact ``serving_return``, from ``serving_return`` below); the post-check's
warm-up adds the fourth, judges the whole against the return recorded on the host before (``judge``) and records
the new one for the next run (``record``).
"""

from __future__ import annotations

import itertools

EDGES = ("stop", "process_up", "health", "warm")
EDGE_LABELS = {
    "process_up": "stop -> process up",
    "health": "process up -> /health",
    "warm": "/health -> warm",
}
RECORD_SCHEMA = "gpufleet.serving_return/v1"
SYSTEMD_PROPERTIES = (
    "ActiveExitTimestampMonotonic",
    "InactiveExitTimestampMonotonic",
    "ExecMainStartTimestampMonotonic",
)


class ReturnError(ValueError):
    """A return record that cannot be used as it is."""


def _seconds(microseconds):
    try:
        value = int(str(microseconds).strip() or 0)
    except ValueError:
        return None
    return value / 1e6 if value > 0 else None


def systemd_times(shown: dict) -> dict:
    """``stop`` and ``process_up`` from ``systemctl show -p ActiveExitTimestampMonotonic,...`` (µs, 0 = never).

    A unit that never left the active state (its first start) has no stop: the start (InactiveExit) stands for it.
    """
    process_up = _seconds(shown.get("ExecMainStartTimestampMonotonic"))
    stop = _seconds(shown.get("ActiveExitTimestampMonotonic"))
    start = _seconds(shown.get("InactiveExitTimestampMonotonic"))
    if stop is None or (process_up is not None and stop > process_up):
        # A stop after the process started belongs to an older instance's bookkeeping: no stop of this return.
        stop = start
    return {"stop": stop, "process_up": process_up}


def serving_return(wait: dict, returned: bool) -> dict:
    """Role serving's fact from its /health wait's output (``wait_healthy.py``: ``healthy``, ``health_monotonic``,
    ``times`` from systemd, ``boot_id``). ``returned``: the unit was stopped or (re)started in this run, so the times
    are this run's return; otherwise the server kept running and there is no return to measure."""
    wait = wait if isinstance(wait, dict) else {}
    times = systemd_times(wait.get("times") or {})
    times["health"] = wait.get("health_monotonic")
    out = {"returned": bool(returned and wait.get("healthy")), "boot_id": str(wait.get("boot_id") or ""), "times": {}}
    if not out["returned"]:
        return out
    out["times"] = {k: round(float(v), 3) for k, v in times.items() if isinstance(v, (int, float))}
    out["edges"] = edges(out["times"])
    return out


def edges(times: dict) -> dict:
    """Seconds of each edge that both its ends have (``process_up``: stop -> process up, ...), and ``total_s``: the
    first known time to the last one."""
    known = [(name, float(times[name])) for name in EDGES if isinstance(times.get(name), (int, float))]
    out = {}
    for (_before, t0), (name, t1) in itertools.pairwise(known):
        out[name] = round(max(0.0, t1 - t0), 3)
    out["total_s"] = round(known[-1][1] - known[0][1], 3) if len(known) > 1 else None
    out["until"] = known[-1][0] if known else None
    return out


def with_warm(serving: dict, warm_monotonic: float, boot_id: str) -> dict:
    """Role serving's return completed by the warm-up's end; None when there was no return in this run or the
    times come from another boot (monotonic clocks of two boots do not compare)."""
    serving = serving if isinstance(serving, dict) else {}
    if not serving.get("returned") or not serving.get("times"):
        return None
    if serving.get("boot_id") and boot_id and serving["boot_id"] != boot_id:
        return None
    times = dict(serving["times"], warm=round(float(warm_monotonic), 3))
    return {"times": times, "edges": edges(times), "boot_id": boot_id}


def record(ret: dict, host: str, venv: str, recorded_at: str, kernels_compiled: int) -> dict:
    """The document kept on the host (the next run's figure from before)."""
    return {
        "schema": RECORD_SCHEMA,
        "host": host,
        "venv": venv,
        "recorded_at": recorded_at,
        "total_s": ret["edges"]["total_s"],
        "until": ret["edges"]["until"],
        "edges": {k: v for k, v in ret["edges"].items() if k in EDGES},
        "kernels_compiled": int(kernels_compiled),
    }


def check_record(doc, path) -> dict:
    """A record read back, validated before it is used as the figure to beat."""
    if not isinstance(doc, dict) or doc.get("schema") != RECORD_SCHEMA:
        raise ReturnError(f"{path} is not a return record ({RECORD_SCHEMA})")
    total = doc.get("total_s")
    if isinstance(total, bool) or not isinstance(total, (int, float)) or total <= 0:
        raise ReturnError(f"{path} holds no positive total_s (seen {total!r})")
    return doc


def describe(ret_edges: dict) -> str:
    parts = [f"{EDGE_LABELS[name]} {ret_edges[name]:.1f} s" for name in EDGES[1:] if name in ret_edges]
    return ", ".join(parts)


def server_s(ret_edges: dict):
    """The server's own part of a return: from its process's start to the last edge. What comes before (the stop, the
    switch of an upgrade, the drain's wait) is the collection's and the drain's, not the stack's, and differs between an
    upgrade and a plain restart; the stack's load, health and compiles are what a new stack can make slower."""
    total = ret_edges.get("total_s")
    if not isinstance(total, (int, float)):
        return None
    return round(total - (ret_edges.get("process_up") or 0.0), 3)


def judge(host: str, ret: dict, before: dict, max_ratio, why_no_before: str = "") -> dict:
    """The return gate (a post-check gate: status, reasons, notes): the server back (process up -> warm) within
    ``max_ratio`` times the host's own figure from before the upgrade. Skipped without a figure from before."""
    if ret is None:
        return {"status": "skipped", "reasons": [], "notes": [], "skipped_reason": "skipped: no return in this run"}
    total, mine = ret["edges"]["total_s"], server_s(ret["edges"])
    said = f"back to service in {total:.1f} s ({describe(ret['edges'])})"
    if not before:
        why = why_no_before or "no return recorded on the host before"
        return {"status": "skipped", "reasons": [], "notes": [said], "skipped_reason": f"skipped: {why}"}
    theirs = server_s(dict(before.get("edges") or {}, total_s=before["total_s"]))
    ratio = round(mine / theirs, 3) if theirs else None
    said += (
        f"; the server took {mine:.1f} s from its start, {ratio:.2f}x the {theirs:.1f} s recorded before "
        f"({before.get('recorded_at', '?')})"
    )
    if max_ratio is None or ratio is None:
        return {"status": "passed", "reasons": [], "notes": [said + "; no limit set"], "ratio": ratio}
    if ratio <= float(max_ratio):
        return {"status": "passed", "reasons": [], "notes": [said], "ratio": ratio}
    reason = (
        f"{host}: {said}; the limit is {float(max_ratio):g}x (profile postcheck.return.max_ratio). Fix: build the new "
        "stack's JIT kernels before the drain (phase prepare) and look at the slowest edge, or raise the limit"
    )
    return {"status": "failed", "reasons": [reason], "notes": [], "ratio": ratio}
