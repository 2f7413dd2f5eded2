# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fleet report of a run: pure logic, no Ansible (controller side).

One record per host, built from what the host published (``gpufleet_upgrade_report`` of upgrade.yml and
rollback.yml) or, for audit.yml, the report ``audit_report`` builds from the host model's verdict, the role facts
seen for it (``preflight_report``, ``assess_result``, ``postcheck_baseline``, ``postcheck_result``) and a timeline
of events the summary callback noted while the run went (a phase started or completed, a task failed, the serving
unit went down or answered again, the report was published). From the records: ``report.json``, ``report.md``,
``report.html`` (inline SVG, no external assets), ``junit.xml`` (one testcase per host and gate) and, per host, a
Prometheus textfile for node_exporter's textfile collector.

The callback ``upgrade_summary`` calls it once, at the end of the run; the host task that writes the textfile
calls ``textfile`` through the filter ``gpufleet.upgrade.fleet_textfile``.
"""

from __future__ import annotations

import json
import math
import xml.etree.ElementTree as ET
from datetime import datetime, timezone
from pathlib import Path

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _return
from ansible_collections.gpufleet.upgrade.plugins.module_utils._host_model import VENV_LINK
from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _outcome

SCHEMA = "gpufleet.fleet_report/v1"
REPORT_FILES = ("report.json", "report.md", "report.html", "junit.xml")
TEMPLATES = Path(__file__).resolve().parents[2] / "playbooks" / "templates" / "report"
# Kinds of a host that ends at the run's profile: its textfile says so (gpufleet_stack_info{at_profile="true"}).
AT_PROFILE_KINDS = ("upgraded", "repaired", "in_sync")
# Events of a host's timeline: (seconds since the epoch, event, name).
EVENTS = ("phase_start", "phase_end", "failed", "down", "up", "report")


class ReportError(ValueError):
    """A per-host report the builder cannot use."""


# --- records -----------------------------------------------------------------------------------------------


def _tok_s(bench):
    value = bench.get("output_tok_s") if isinstance(bench, dict) else None
    if value in (None, "") or isinstance(value, bool):
        return None
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return round(value, 1) if math.isfinite(value) else None


def bench_of(facts) -> dict:
    """tok/s before (the baseline on the old stack) and after (the post-check), and the change in percent."""
    facts = facts if isinstance(facts, dict) else {}
    before = _tok_s(facts.get("postcheck_baseline"))
    after = _tok_s(((facts.get("postcheck_result") or {}).get("bench") or {}).get("bench"))
    change = round((after - before) / before * 100.0, 1) if before and after is not None else None
    return {"before_tok_s": before, "after_tok_s": after, "change_pct": change}


RETURN_EDGES = (("process_up", "stop -> process up"), ("health", "process up -> /health"), ("warm", "/health -> warm"))


def _number(value):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return round(float(value), 1)


def return_of(facts) -> dict:
    """The host's time back to service from the post-check's warm-up (``postcheck_result.warmup``): each edge (stop
    -> process up -> /health -> warm), the total, the server's own part (from its process's start: what the gate
    compares), the same part recorded before the upgrade and their ratio, and the kernels compiled during the warm-up
    and in its last pass (after which the host undrains)."""
    warmup = ((facts if isinstance(facts, dict) else {}).get("postcheck_result") or {}).get("warmup") or {}
    ret = warmup.get("return") if isinstance(warmup.get("return"), dict) else {}
    edges = ret.get("edges") if isinstance(ret.get("edges"), dict) else {}
    before = ret.get("before") if isinstance(ret.get("before"), dict) else {}
    passes = (warmup.get("warmup") or {}) if isinstance(warmup.get("warmup"), dict) else {}
    total = _number(edges.get("total_s"))
    # The gate's figures (module_utils/_return.py): the server's own part, from its process's start, now and before.
    server = _number(_return.server_s(edges)) if total is not None else None
    before_s = (
        _number(_return.server_s(dict(before.get("edges") or {}, total_s=before.get("total_s")))) if before else None
    )
    return {
        "edges": [{"name": label, "key": key, "s": _number(edges.get(key))} for key, label in RETURN_EDGES],
        "total_s": total,
        "server_s": server,
        "before_s": before_s,
        "ratio": round(server / before_s, 2) if server and before_s else None,
        "warm": passes.get("warm") if isinstance(passes.get("warm"), bool) else None,
        "passes": len(passes.get("passes") or []),
        "kernels_compiled": len(passes.get("kernels") or []),
        "compiled_after_warmup": [str(k) for k in passes.get("compiled_after_warmup") or []],
    }


def return_text(ret) -> str:
    """``1 m 25 s (server 57 s, 1.87x of 30 s before)`` for the tables; '-' without a figure."""
    if not ret or ret.get("total_s") is None:
        return "-"
    text = seconds(ret["total_s"])
    if ret.get("ratio") is not None:
        text += f" (server {seconds(ret['server_s'])}, {ret['ratio']:.2f}x of {seconds(ret['before_s'])} before)"
    return text


def return_edges_text(ret) -> str:
    """``stop -> process up 2 s, process up -> /health 3 s, /health -> warm 9 s; 2 kernel(s) compiled, 0 after``."""
    if not ret or ret.get("total_s") is None:
        return ""
    parts = [f"{e['name']} {seconds(e['s'])}" for e in ret["edges"] if e["s"] is not None]
    late = ret["compiled_after_warmup"]
    tail = f"{ret['kernels_compiled']} kernel(s) compiled in {ret['passes']} warm-up pass(es), "
    tail += f"{len(late)} in the last ({', '.join(late)})" if late else "none in the last"
    return ", ".join(parts) + "; " + tail


def _gate(name, status, message=""):
    return {"name": name, "status": status, "message": " ".join(str(message or "").split())}


def gates_of(facts) -> list:
    """The gates a host went through: preflight's (``ok: ...`` / ``skipped: ...``) and the post-check's."""
    facts = facts if isinstance(facts, dict) else {}
    gates = []
    for name, value in (facts.get("preflight_report") or {}).items():
        text = str(value)
        if text.startswith("ok"):
            status = "passed"
        elif text.startswith("skipped") or text == "not required":
            status = "skipped"
        else:
            status = "failed"
        gates.append(_gate(f"preflight.{name}", status, text))
    for name, gate in ((facts.get("postcheck_result") or {}).get("gates") or {}).items():
        gate = gate if isinstance(gate, dict) else {}
        status = gate.get("status") if gate.get("status") in ("passed", "failed", "skipped") else "failed"
        # A skipped gate says why (its skipped_reason: no GPU, disabled, check mode).
        message = (
            "; ".join(str(r) for r in gate.get("reasons") or [])
            or "; ".join(str(n) for n in gate.get("notes") or [])
            or str(gate.get("skipped_reason") or "")
        )
        gates.append(_gate(f"postcheck.{name}", status, message))
    return gates


def _intervals(events, start_what, end_what):
    """Pairs (start, end) of start_what/end_what events in time order (an open start stays open: end None)."""
    out, since = [], None
    for t, what, _name in events:
        if what == start_what and since is None:
            since = t
        elif what == end_what and since is not None:
            out.append((since, t))
            since = None
    if since is not None:
        out.append((since, None))
    return out


def timings(timeline, phases_noted=()) -> dict:
    """Phase durations, the host's whole duration and its downtime, from its timeline.

    A phase ends at its ``phase_end``, or failed at the first ``failed`` event after its start; a rollback (noted
    in the report's phases) runs from that failure to the report. Downtime: the serving unit was down (stopped or
    restarting, ``down``) until its health wait answered (``up``); a unit still down at the report counts until
    then.
    """
    events = sorted((float(t), str(w), str(n or "")) for t, w, n in timeline or [] if w in EVENTS)
    if not events:
        return {"phases": {}, "duration_s": None, "downtime_s": None, "started": None}
    report_t = next((t for t, w, _n in reversed(events) if w == "report"), events[-1][0])
    failures = [t for t, w, _n in events if w == "failed"]
    phases = {}
    for t, what, name in events:
        if what == "phase_start" and name not in phases:
            phases[name] = {"started": t, "ended": None, "status": "running"}
        elif what == "phase_end" and name in phases and phases[name]["ended"] is None:
            phases[name].update(ended=t, status="completed")
    for info in phases.values():
        if info["ended"] is None:
            failed = next((t for t in failures if t >= info["started"]), None)
            info.update(
                ended=failed if failed is not None else report_t, status="unfinished" if failed is None else "failed"
            )
    if "rollback" in phases_noted and "rollback" not in phases:
        since = max((i["ended"] for i in phases.values() if i["status"] == "failed"), default=None)
        since = since if since is not None else (failures[0] if failures else None)
        if since is not None:
            phases["rollback"] = {"started": since, "ended": report_t, "status": "completed"}
    only_report = all(w == "report" for _t, w, _n in events)
    down = sum((end if end is not None else report_t) - start for start, end in _intervals(events, "down", "up"))
    return {
        "phases": {
            n: {"duration_s": round(i["ended"] - i["started"], 1), "status": i["status"]} for n, i in phases.items()
        },
        "duration_s": None if only_report else round(report_t - events[0][0], 1),
        "downtime_s": round(down, 1),
        "started": events[0][0],
    }


def _ordered(names):
    order = _outcome.REPORT_ORDER
    return sorted(names, key=lambda n: (order.index(n) if n in order else len(order), n))


def audit_report(host, verdict, run, profile) -> dict:
    """A host's audit report, from the host model's verdict (``assess_result`` of module host_state) and the audit's
    run (``gpufleet_audit_run``: ``run_id``, ``dir``): the summary callback builds it, so the audit has no task per
    host for its report. ``serving_venv`` / ``expected_venv`` are what ``current`` points at and the venv of the lock.
    """
    if not isinstance(verdict, dict) or "in_sync" not in verdict:
        raise ReportError(
            f"{host}: the host model's verdict has no in_sync: {str(verdict)[:80]!r}; "
            "fix: publish it with module gpufleet.upgrade.host_state (option fact)"
        )
    items = [i for i in verdict.get("items") or [] if isinstance(i, dict)]
    link = next((i for i in items if i.get("item") == VENV_LINK), {})
    return {
        "host": host,
        "run_id": str((run or {}).get("run_id") or ""),
        "profile": str(profile or ""),
        "in_sync": bool(verdict["in_sync"]),
        "drift": list(verdict.get("drift") or []),
        "drifted": list(verdict.get("drifted") or []),
        "items": items,
        "serving_venv": link.get("observed"),
        "expected_venv": link.get("expected"),
        "last_run": verdict.get("last_run") or {},
    }


def _audit_record(host, audit):
    items = [i for i in audit.get("items") or [] if isinstance(i, dict)]
    in_sync = bool(audit.get("in_sync"))
    return {
        "kind": "audit",
        "outcome": f"in sync with {audit.get('profile', '')}"
        if in_sync
        else "drift: " + "; ".join(audit.get("drift") or []),
        "outcome_kind": "in_sync" if in_sync else "drifted",
        "status": "ok" if in_sync else "drift",
        "ok": in_sync,
        "check_mode": True,
        "backup_id": "",
        "drift": [str(d) for d in audit.get("drift") or []],
        "gates": [
            _gate(f"audit.{i.get('item', '?')}", "passed" if i.get("ok") else "failed", i.get("drift") or "")
            for i in items
        ],
    }


def _run_record(report, facts):
    kind = _outcome.report_kind(report)
    status = "ok" if kind.ok else ("failed" if kind.counts_as_failure else "skipped")
    assess = facts.get("assess_result") or {}
    return {
        "kind": "run",
        "outcome": str(report.get("outcome") or "unknown"),
        "outcome_kind": report.get("outcome_kind") if report.get("outcome_kind") in _outcome.KINDS else "unknown",
        "status": status,
        "ok": bool(report.get("ok")) and kind.ok,
        "check_mode": bool(report.get("check_mode")),
        "backup_id": str(report.get("backup_id") or ""),
        "drift": [str(d) for d in (assess.get("drift") or [])] if not assess.get("in_sync") else [],
        "gates": gates_of(facts),
    }


def host_record(host, report, facts=None, timeline=None) -> dict:
    """One host's record: outcome, phases (note, duration, status), downtime, benchmark, backup, drift, gates.

    ``report`` is the host's ``gpufleet_upgrade_report`` (upgrade, rollback) or its audit report (``audit_report``:
    it has ``in_sync``); None for a host that never published one (unreachable).
    """
    facts = facts if isinstance(facts, dict) else {}
    if report is None:
        body = {
            "kind": "run",
            "outcome": "unreachable: no report",
            "outcome_kind": "unknown",
            "status": "failed",
            "ok": False,
            "check_mode": False,
            "backup_id": "",
            "drift": [],
            "gates": [],
        }
        report = {}
    elif not isinstance(report, dict):
        raise ReportError(
            f"{host}: the published report is a {type(report).__name__}, not a dict: {str(report)[:80]!r}; "
            "fix: publish it with the filter gpufleet.upgrade.host_report"
        )
    elif "in_sync" in report and "outcome_kind" not in report:
        body = _audit_record(host, report)
    else:
        body = _run_record(report, facts)
    notes = report.get("phases") if isinstance(report.get("phases"), dict) else {}
    times = timings(timeline, notes)
    phases = []
    for name in _ordered(set(notes) | set(times["phases"])):
        timed = times["phases"].get(name, {})
        status = timed.get("status") or ("failed" if str(notes.get(name, "")).startswith("failed") else "completed")
        phases.append(
            {"name": name, "note": str(notes.get(name, "")), "duration_s": timed.get("duration_s"), "status": status}
        )
    record = {
        "host": host,
        "run_id": str(report.get("run_id") or ""),
        "profile": str(report.get("profile") or ""),
        **body,
        "phases": phases,
        "duration_s": times["duration_s"],
        # Check mode stops and restarts nothing: no downtime to speak of.
        "downtime_s": None if body["check_mode"] else times["downtime_s"],
        "bench": bench_of(facts),
        "return": return_of(facts),
    }
    return record


def fleet(records, run_id="", kind="", generated=None) -> dict:
    """The report.json document: the run, totals per status and outcome label, and the hosts' records."""
    records = sorted(records, key=lambda r: r["host"])
    totals = {}
    for record in records:
        totals[record["status"]] = totals.get(record["status"], 0) + 1
    generated = generated if generated is not None else datetime.now(timezone.utc).timestamp()
    run_id = run_id or next((r["run_id"] for r in records if r["run_id"]), "")
    return {
        "schema": SCHEMA,
        "run_id": run_id,
        "kind": kind or _run_kind(run_id, records),
        "generated": _iso(generated),
        "generated_epoch": round(float(generated), 3),
        "profile": next((r["profile"] for r in records if r["profile"]), ""),
        "totals": dict(sorted(totals.items())),
        "hosts": records,
    }


def _run_kind(run_id, records):
    if any(r["kind"] == "audit" for r in records):
        return "audit"
    return "rollback" if str(run_id).startswith("rollback-") else "upgrade"


def _iso(epoch):
    return datetime.fromtimestamp(float(epoch), timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# --- renderings ----------------------------------------------------------------------------------------------


def to_json(doc) -> str:
    return json.dumps(doc, indent=2, sort_keys=False) + "\n"


def _environment(autoescape):
    # Imported here: jinja2 is the controller's (ansible-core requires it), never a host's.
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        autoescape=autoescape,
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["seconds"] = seconds
    env.filters["tok_s"] = lambda v: "-" if v is None else f"{v:.1f}"
    env.filters["md_cell"] = lambda v: " ".join(str(v).split()).replace("|", "\\|")
    return env


def seconds(value) -> str:
    """A duration for people: 42 s, 3 m 05 s, 1 h 02 m; '-' when unknown."""
    if value is None:
        return "-"
    value = round(float(value))
    if value < 60:
        return f"{value} s"
    if value < 3600:
        return f"{value // 60} m {value % 60:02d} s"
    return f"{value // 3600} h {value % 3600 // 60:02d} m"


def bench_text(bench) -> str:
    before, after, change = bench.get("before_tok_s"), bench.get("after_tok_s"), bench.get("change_pct")
    if before is None and after is None:
        return "-"
    text = f"{'-' if before is None else f'{before:.1f}'} -> {'-' if after is None else f'{after:.1f}'} tok/s"
    return text + (f" ({change:+.1f} %)" if change is not None else "")


def to_markdown(doc) -> str:
    return (
        _environment(False)
        .get_template("report.md.j2")
        .render(doc=doc, bench_text=bench_text, return_text=return_text, return_edges_text=return_edges_text)
    )


CHART = {"label_w": 150, "bar_w": 360, "value_w": 90, "bar_h": 11, "gap": 6, "top": 24}


def chart(records) -> dict:
    """Geometry of the inline SVG: per host two bars (tok/s before, after) on one scale; None without figures."""
    rows = [r for r in records if r["bench"]["before_tok_s"] is not None or r["bench"]["after_tok_s"] is not None]
    if not rows:
        return None
    top = max(max(r["bench"]["before_tok_s"] or 0, r["bench"]["after_tok_s"] or 0) for r in rows) or 1.0
    c = CHART
    row_h = 2 * c["bar_h"] + c["gap"] + 8
    bars = []
    for i, record in enumerate(rows):
        y = c["top"] + i * row_h
        pair = []
        for j, key in enumerate(("before_tok_s", "after_tok_s")):
            value = record["bench"][key]
            width = 0.0 if value is None else round(value / top * c["bar_w"], 1)
            pair.append({"key": key, "value": value, "y": y + j * (c["bar_h"] + 2), "width": width})
        bars.append({"host": record["host"], "y": y, "status": record["status"], "bars": pair})
    width = c["label_w"] + c["bar_w"] + c["value_w"]
    return {"rows": bars, "width": width, "height": c["top"] + len(rows) * row_h + 4, **c, "max": top}


def to_html(doc) -> str:
    return (
        _environment(True)
        .get_template("report.html.j2")
        .render(
            doc=doc,
            chart=chart(doc["hosts"]),
            bench_text=bench_text,
            return_text=return_text,
            return_edges_text=return_edges_text,
        )
    )


def _junit_time(value):
    return f"{float(value or 0):.3f}"


JUNIT_SUMMARY = 120


def junit_summary(message: str) -> str:
    """The first clause of a reason (up to "; fix:" or a sentence's end), at most JUNIT_SUMMARY characters."""
    text = str(message or "")
    for stop in ("; fix:", ". Fix:", "; "):
        if stop in text:
            text = text.split(stop, 1)[0]
            break
    return text if len(text) <= JUNIT_SUMMARY else text[: JUNIT_SUMMARY - 3].rstrip() + "..."


def to_junit(doc) -> str:
    """JUnit XML: one testsuite per host, one testcase per gate and one for the host's outcome.

    Written to the strict Ant schema (properties, system-out and system-err in every suite; package and id in an
    aggregate) so that Jenkins, GitLab and the like all read it.
    """
    stamp = doc["generated"].rstrip("Z")
    root = ET.Element("testsuites")
    for index, record in enumerate(doc["hosts"]):
        cases = [(g["name"], g["status"], g["message"], None) for g in record["gates"]]
        outcome_status = {"ok": "passed", "skipped": "skipped"}.get(record["status"], "failed")
        cases.append(("outcome", outcome_status, record["outcome"], record["duration_s"]))
        suite = ET.SubElement(
            root,
            "testsuite",
            {
                "name": record["host"],
                "package": f"gpufleet.{doc['kind']}",
                "id": str(index),
                "timestamp": stamp,
                "hostname": record["host"],
                "tests": str(len(cases)),
                "failures": str(sum(1 for c in cases if c[1] == "failed")),
                "errors": "0",
                "skipped": str(sum(1 for c in cases if c[1] == "skipped")),
                "time": _junit_time(record["duration_s"]),
            },
        )
        props = ET.SubElement(suite, "properties")
        for name in ("run_id", "profile", "outcome_kind", "backup_id"):
            ET.SubElement(props, "property", {"name": name, "value": str(record[name])})
        ret = record.get("return") or {}
        if ret.get("total_s") is not None:
            ET.SubElement(props, "property", {"name": "return_to_service_s", "value": f"{ret['total_s']:g}"})
            for edge in (e for e in ret["edges"] if e["s"] is not None):
                ET.SubElement(props, "property", {"name": f"return_{edge['key']}_s", "value": f"{edge['s']:g}"})
            if ret.get("before_s") is not None:
                ET.SubElement(props, "property", {"name": "return_before_s", "value": f"{ret['before_s']:g}"})
            ET.SubElement(
                props,
                "property",
                {"name": "kernels_compiled_after_warmup", "value": str(len(ret["compiled_after_warmup"]))},
            )
        for name, status, message, took in cases:
            case = ET.SubElement(
                suite,
                "testcase",
                {"name": name, "classname": f"gpufleet.{doc['kind']}.{record['host']}", "time": _junit_time(took)},
            )
            # The attribute is the one line a CI page lists; the element's text keeps the reason and its fix whole.
            if status == "failed":
                ET.SubElement(case, "failure", {"type": name, "message": junit_summary(message)}).text = message
            elif status == "skipped":
                ET.SubElement(case, "skipped", {"message": junit_summary(message)}).text = message
        ET.SubElement(suite, "system-out").text = "\n".join(
            f"{p['name']}: {p['note']}" + (f" ({seconds(p['duration_s'])})" if p["duration_s"] is not None else "")
            for p in record["phases"]
        )
        ET.SubElement(suite, "system-err").text = "" if record["ok"] else record["outcome"]
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def _label(value) -> str:
    # The text format's label escapes: backslash, double quote, line feed.
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def textfile(record, now=None) -> str:
    """The host's Prometheus textfile (text exposition format) for node_exporter's textfile collector."""
    now = float(now if now is not None else datetime.now(timezone.utc).timestamp())
    profile, kind = _label(record["profile"]), _label(record["outcome_kind"])
    at_profile = "true" if record["outcome_kind"] in AT_PROFILE_KINDS and not record["check_mode"] else "false"
    lines = [
        "# HELP gpufleet_stack_info The stack profile of the host's last gpufleet run; at_profile: it ended there.",
        "# TYPE gpufleet_stack_info gauge",
        f'gpufleet_stack_info{{profile="{profile}",at_profile="{at_profile}"}} 1',
        "# HELP gpufleet_last_run_result How the host's last gpufleet run ended (1 for its outcome kind).",
        "# TYPE gpufleet_last_run_result gauge",
        f'gpufleet_last_run_result{{kind="{kind}"}} 1',
        "# HELP gpufleet_last_run_ok Whether the host's last gpufleet run ended where it wanted (1) or not (0).",
        "# TYPE gpufleet_last_run_ok gauge",
        f"gpufleet_last_run_ok {1 if record['ok'] else 0}",
        "# HELP gpufleet_last_run_timestamp_seconds When the host's last gpufleet run ended (seconds since the epoch).",
        "# TYPE gpufleet_last_run_timestamp_seconds gauge",
        f"gpufleet_last_run_timestamp_seconds {now:.3f}",
    ]
    after = record["bench"]["after_tok_s"]
    # A host rolled back runs its old stack again: the failed post-check's figure is not what it serves.
    if after is not None and record["ok"]:
        lines += [
            "# HELP gpufleet_postcheck_output_tokens_per_second Output tok/s of the last post-check benchmark.",
            "# TYPE gpufleet_postcheck_output_tokens_per_second gauge",
            f"gpufleet_postcheck_output_tokens_per_second {after:g}",
        ]
    ret = record.get("return") or {}
    if ret.get("total_s") is not None:
        lines += [
            "# HELP gpufleet_return_to_service_seconds The last switch's time back to service per edge (stop -> process"
            ' up -> /health -> warm) and in all (edge="total"); before: the host\'s figure from before the switch.',
            "# TYPE gpufleet_return_to_service_seconds gauge",
        ]
        for edge in (e for e in ret["edges"] if e["s"] is not None):
            lines.append(f'gpufleet_return_to_service_seconds{{edge="{edge["key"]}"}} {edge["s"]:g}')
        lines.append(f'gpufleet_return_to_service_seconds{{edge="total"}} {ret["total_s"]:g}')
        if ret.get("before_s") is not None:
            lines.append(f'gpufleet_return_to_service_seconds{{edge="before"}} {ret["before_s"]:g}')
        lines += [
            "# HELP gpufleet_jit_kernels_compiled_after_warmup Kernels the server built in the warm-up's last pass.",
            "# TYPE gpufleet_jit_kernels_compiled_after_warmup gauge",
            f"gpufleet_jit_kernels_compiled_after_warmup {len(ret['compiled_after_warmup'])}",
        ]
    return "\n".join(lines) + "\n"


def render(doc) -> dict:
    """File name -> content of the run folder's report files."""
    return {
        "report.json": to_json(doc),
        "report.md": to_markdown(doc),
        "report.html": to_html(doc),
        "junit.xml": to_junit(doc),
    }


def _write_atomic(folder: Path, name: str, content: str) -> str:
    """A reader never sees half a file."""
    target = folder / name
    staging = folder / f".{name}.tmp"
    staging.write_text(content, encoding="utf-8")
    staging.replace(target)
    return str(target)


def write(folder, doc) -> list:
    """Write the report files into the run folder."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    return [_write_atomic(folder, name, content) for name, content in render(doc).items()]


def write_host(folder, host, report) -> str:
    """The host's own report as it is published (``<host>.json``), so a run stopped half-way keeps the hosts done."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    return _write_atomic(folder, f"{host}.json", json.dumps(report, indent=4, sort_keys=True) + "\n")
