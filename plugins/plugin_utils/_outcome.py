# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""How a host ends a run, and why: pure logic, no Ansible (controller side).

The upgrade's safety contract lives here, not in Jinja: which phase a failure belongs to, whether the host
had changed (and so must be rolled back), what the outcome is called, and the host's report. The playbooks
call it through the filters of ``plugins/filter/outcome.py``; the summary callback reads the same kinds.

A host's run is a sequence of phases (``_state.PHASE_TABLE``; ``recover`` is the rollback of an interrupted
run). A failure is judged by the phase that was running and whether that phase had completed (a failure
after a completed phase came from the test hook or the next phase's start, not from the phase itself); the
table says, per phase, the outcome kind of each (``Phase.fails_as``):

* in ``preflight`` or ``assess``, or in ``recover`` after it completed -> nothing was changed: "failed preflight";
* in ``recover`` before it completed -> the rollback of the interrupted run failed: "ROLLBACK FAILED";
* in ``backup`` before it completed -> only the backup folder was written: "failed before any change";
* anywhere later -> the host may have changed: it is rolled back to this run's backup.

A run told to stop after a phase (``gpufleet_stop_after``, one of ``_state.STOP_POINTS``) ends "prepared for
<profile> (not switched)" after ``prepare``, else "stopped after <phase> ...": the host serves its old stack.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _state

# Phases that run before the host may change (the table's changes_host); a failure in them needs no rollback.
NO_CHANGE_PHASES = tuple(phase.name for phase in _state.PHASE_TABLE if not phase.changes_host)
# How each kind a failure may have is answered: report only, restore this run's backup, or the interrupted run's
# rollback failed.
FAILURE_ACTIONS = {
    "failed_preflight": "refuse",
    "failed_before_change": "refuse",
    "rolled_back": "rollback",
    "rollback_failed": "recovery_failed",
}
# Phase order in reports (the summary prints phases in this order).
REPORT_ORDER = (*_state.PHASES, "rollback")
# The schema of a host's report as the controller keeps it (<controller_dir>/runs/<run_id>/<host>.json): a reader
# refuses one it does not know (plugin_utils/_run_record.py validate_run_record).
RUN_RECORD_SCHEMA = 1
# A reason this collection writes (host, cause, what was left, fix; a full disk's names two paths and the host twice)
# fits whole; only a tool's long output is cut.
REASON_LIMIT = 700


@dataclass(frozen=True)
class Kind:
    """One kind of outcome: the words a person reads, and what it means for the rollout."""

    label: str  # how the outcome's text starts; also the key of the summary's totals
    template: str  # the outcome's text; {detail} is what happened
    ok: bool  # the host ended where the run wanted it
    counts_as_failure: bool  # counts towards gpufleet_max_failed_hosts
    state_result: str | None  # result recorded in state.json (None: nothing recorded for this kind)


KINDS = {
    "upgraded": Kind("upgraded", "upgraded", True, False, "upgraded"),
    "would_upgrade": Kind("would upgrade", "would upgrade (check mode: nothing changed)", True, False, None),
    # The host model (role assess) found the host at the profile: nothing ran after it, nothing changed.
    "in_sync": Kind("already at", "already at {detail} (in sync)", True, False, None),
    # The host ran the profile's venv but drifted: the phases repaired exactly the drift.
    "repaired": Kind("repaired", "repaired: {detail}", True, False, "repaired"),
    "would_repair": Kind("would repair", "would repair (check mode: nothing changed): {detail}", True, False, None),
    "failed_preflight": Kind("failed preflight", "failed preflight: {detail}", False, True, "failed_preflight"),
    "failed_before_change": Kind(
        "failed before any change", "failed before any change: {detail}", False, True, "failed"
    ),
    "rolled_back": Kind("rolled back", "rolled back: {detail}", False, True, "rolled_back"),
    "rollback_failed": Kind("ROLLBACK FAILED", "ROLLBACK FAILED: {detail}", False, True, "rollback_failed"),
    # Check mode: a phase after the backup failed; no backup was taken and nothing changed, so nothing is rolled back.
    "would_fail": Kind("would fail", "would fail (check mode: nothing changed): {detail}", False, True, None),
    # gpufleet_stop_after: the run stopped before the drain, as told; the host serves its old stack.
    "prepared": Kind("prepared for", "prepared for {detail} (not switched)", True, False, "prepared"),
    "would_prepare": Kind(
        "would prepare", "would prepare for {detail} (check mode: nothing changed)", True, False, None
    ),
    "stopped": Kind("stopped after", "stopped after {detail} (not switched)", True, False, "stopped"),
    "would_stop": Kind(
        "would stop after", "would stop after {detail} (check mode: nothing changed)", True, False, None
    ),
    "not_started": Kind("not started", "not started: {detail}", False, False, None),
    # The inventory set gpufleet_skip for the host: nothing ran on it, by the operator's choice.
    "skipped": Kind("skipped by operator", "skipped by operator ({detail})", True, False, None),
    # playbooks/rollback.yml: the rollback role's own words ("rolled back to backup ...", "nothing to roll back: ...").
    "restored": Kind("rolled back", "{detail}", True, False, "rolled_back"),
    "nothing_to_roll_back": Kind("nothing to roll back", "{detail}", True, False, None),
    # playbooks/rollback.yml: the rollback stopped before it changed the host (a state file or backup it must not act
    # on, a lock held): no failed rollback, since nothing was restored; not ok, since the host is not where the
    # operator asked and someone has to act.
    "rollback_refused": Kind("nothing rolled back", "nothing rolled back: {detail}", False, False, None),
    "unknown": Kind("unknown", "unknown{detail}", False, True, None),
}


class OutcomeError(ValueError):
    """An outcome kind or report the playbook asked for that does not exist."""


def kind_of(name) -> Kind:
    try:
        return KINDS[name]
    except KeyError:
        raise OutcomeError(f"outcome kind {name!r} is not one of {', '.join(sorted(KINDS))}") from None


def outcome(kind, detail="", host="", backup_id="") -> dict:
    """The outcome a report carries: ``{kind, text, ok, counts_as_failure, state_result}``.

    A failed rollback's text ends with the fix, naming the host and the backup to restore by hand.
    """
    spec = kind_of(kind)
    detail = " ".join(str(detail or "").split())
    if kind == "rollback_failed" and host:
        detail += f"; fix: inspect the host, then run playbooks/rollback.yml -l {host}" + (
            f" -e rollback_backup_id={backup_id}" if backup_id else ""
        )
    if kind == "unknown" and detail:
        detail = ": " + detail
    return {
        "kind": kind,
        "text": spec.template.format(detail=detail),
        "ok": spec.ok,
        "counts_as_failure": spec.counts_as_failure,
        "state_result": spec.state_result,
    }


def run_outcome(assess, profile, check_mode=False) -> dict:
    """How a host that went through every phase ends, from the host model's verdict before the change
    (fact assess_result): already at the profile, repaired (it ran the profile's venv, some items drifted), or
    upgraded; the check-mode words for the last two."""
    assess = assess if isinstance(assess, dict) else {}
    if assess.get("in_sync"):
        return outcome("in_sync", profile)
    if assess.get("on_profile"):
        return outcome("would_repair" if check_mode else "repaired", "; ".join(assess.get("drift") or []))
    return outcome("would_upgrade" if check_mode else "upgraded")


def stopped_outcome(assess, profile, stop_after, check_mode=False) -> dict:
    """How a host ends a run told to stop after ``stop_after`` (a stop point, _state.STOP_POINTS): already at the
    profile when the model found it in sync (nothing ran after it), else prepared (after ``prepare``: the new stack
    built and verified beside the old one) or stopped after the phase; the check-mode words for both."""
    result = _state.stop_result(stop_after)
    if isinstance(assess, dict) and assess.get("in_sync"):
        return outcome("in_sync", profile)
    if result == "prepared":
        return outcome("would_prepare" if check_mode else "prepared", profile)
    return outcome("would_stop" if check_mode else "stopped", f"{stop_after} of the upgrade to {profile}")


def failure_reason(task_name, result) -> str:
    """One line saying what failed: the task's name and its message (every failed loop item's), stderr added."""
    result = result if isinstance(result, dict) else {}
    items = [r.get("msg", "") for r in result.get("results") or [] if isinstance(r, dict) and r.get("failed")]
    if items:
        message = "; ".join(str(m) for m in items)
    else:
        message = f"{result.get('msg', '')} {str(result.get('stderr', '')).strip()}"
    text = re.sub(r"\s+", " ", f"{task_name or 'a task'}: {message.strip()}").strip()
    return text if len(text) <= REASON_LIMIT else text[: REASON_LIMIT - 3].rstrip() + "..."


def classify_failure(phase, completed, check_mode=False) -> dict:
    """Judge a failure by the phase that ran and whether it had completed (see the module docstring).

    Returns ``{failed_phase, action, kind}``; action: ``refuse`` (nothing changed: report only),
    ``rollback`` (restore this run's backup) or ``recovery_failed`` (the interrupted run's rollback failed).
    In check mode nothing changed and no backup exists: what would be a rollback is a report (kind ``would_fail``).
    """
    phase = str(phase or "preflight")
    completed = bool(completed)
    spec = next((p for p in _state.PHASE_TABLE if p.name == phase), None)
    # A phase the table does not know (none should reach here) may have changed the host: roll back.
    kind = spec.fails_as[1 if completed else 0] if spec else "rolled_back"
    if kind == "failed_preflight":
        failed_phase = "preflight"
    elif kind == "rolled_back":
        failed_phase = f"after {phase}" if completed else phase
    else:
        failed_phase = phase
    if kind == "rolled_back" and check_mode:
        return {"failed_phase": failed_phase, "action": "refuse", "kind": "would_fail"}
    return {"failed_phase": failed_phase, "action": FAILURE_ACTIONS[kind], "kind": kind}


def _tok_s(bench):
    value = (bench or {}).get("output_tok_s") if isinstance(bench, dict) else None
    return None if value in (None, "") else round(float(value), 1)


def phase_note(phase, facts) -> dict:
    """``{phase: note}`` saying what a completed phase did, from the facts its roles published; {} for none."""
    facts = facts if isinstance(facts, dict) else {}
    if phase == "preflight":
        gates = facts.get("preflight_report") or {}
        words = [f"{gate} {'ok' if str(value).startswith('ok') else value}" for gate, value in gates.items()]
        # A host that lost its state.json: the record is missing, and what the controller last knew of it.
        note = (facts.get("preflight_recovery") or {}).get("note")
        return {phase: "ok: " + ", ".join(words) + (f"; {note}" if note else "")}
    if phase == "recover":
        recovery = facts.get("preflight_recovery") or {}
        if recovery.get("action") != "rollback":
            return {}
        return {phase: f"{recovery.get('reason')}: {facts.get('rollback_outcome') or 'rolled back'}"}
    if phase == "assess":
        assess = facts.get("assess_result") or {}
        # The items only: the outcome line (repaired: ...) or the audit has each drift in words.
        drifted = assess.get("drifted") or []
        return {phase: "in sync" if assess.get("in_sync") else f"drift in {', '.join(drifted)}"}
    if phase == "backup":
        how = "reused" if facts.get("backup_reused") else "new"
        return {phase: f"ok: {facts.get('backup_id')} ({how})"}
    if phase == "cuda_toolkit":
        return {phase: f"ok: {facts.get('cuda_toolkit_home') or 'installed'}"}
    if phase == "prepare":
        # Where the lock came from (a reviewed lock file, or made now and where it was written), for the run's report.
        origin = f" (lock {facts['lock_origin']})" if facts.get("lock_origin") else ""
        # A verified venv of the lock found in place (an earlier prepare ahead) is reused, not built again.
        how = "reused (verified earlier)" if facts.get("venv_rebuild_reused") else "built and verified"
        return {phase: f"ok: {facts.get('venv_rebuild_path') or '?'} {how}{origin}, the host still serving"}
    if phase == "venv_rebuild":
        return {phase: f"ok: current -> {facts.get('venv_rebuild_path') or '?'}"}
    if phase == "postcheck":
        before = _tok_s(facts.get("postcheck_baseline"))
        after = _tok_s(((facts.get("postcheck_result") or {}).get("bench") or {}).get("bench"))
        if before is None or after is None:
            return {phase: "ok"}
        return {phase: f"ok: speculative decoding {before} -> {after} tok/s"}
    if phase in ("drain", "undrain"):
        how = facts.get("gpufleet_drain") or "none"
        return {} if how == "none" else {phase: f"ok: {how}"}
    return {phase: "ok"}


def host_report(result, host, run_id, profile, backup_id="", phases=None, check_mode=False) -> dict:
    """The host's report: what the callback prints, the controller keeps and the last play judges."""
    if not isinstance(result, dict) or "kind" not in result:
        result = outcome("unknown", "no outcome was noted (check mode)" if check_mode else "no outcome was noted")
    return {
        "schema": RUN_RECORD_SCHEMA,
        "collection_version": _state.COLLECTION_VERSION,
        "host": host,
        "run_id": run_id,
        "profile": profile,
        "outcome": result["text"],
        "outcome_kind": result["kind"],
        "ok": bool(result["ok"]),
        "backup_id": backup_id or "",
        "phases": dict(phases or {}),
        "check_mode": bool(check_mode),
    }


def report_kind(report) -> Kind:
    """The kind of a published report; a report without one is unknown (never guessed from its text)."""
    return KINDS.get((report or {}).get("outcome_kind"), KINDS["unknown"])


def failed_hosts(batch, reports) -> list:
    """Hosts of a batch that count against gpufleet_max_failed_hosts: failed, rolled back, or no report at all.

    ``reports`` maps host -> its gpufleet_upgrade_report (None when the host never published one).
    """
    failed = []
    for host in batch:
        report = reports.get(host)
        if not isinstance(report, dict) or report_kind(report).counts_as_failure:
            failed.append(host)
    return failed
