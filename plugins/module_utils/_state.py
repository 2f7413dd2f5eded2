# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Per-host upgrade lock and state file: pure logic, no Ansible.

The lock (``upgrade.lock``) says which run owns a host; the state file (``state.json``) says how far
that run got. Both are small JSON documents written atomically (temp file + fsync + rename).

Recovery rule for a run that was interrupted (its ``state.json`` still says ``in_progress``):

* it had not completed a backup -> nothing had changed yet: start anew (partial backups are discarded);
* it had completed a backup -> roll the host back to that backup first, then upgrade anew;
* its rollback had failed -> refuse: an operator has to look (``playbooks/rollback.yml``).

Rolling back an unchanged host is cheap (links and files compare equal, no restart), so the rule never
has to guess whether the interrupted phase had already touched the serving path.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass

from ansible_collections.gpufleet.upgrade.plugins.module_utils._proc import stat_fields
from ansible_collections.gpufleet.upgrade.plugins.module_utils._version import COLLECTION, COLLECTION_VERSION


@dataclass(frozen=True)
class Phase:
    """One phase of a host's upgrade: the one table the playbook runs (filter upgrade_phases), the state file
    records and a failure is judged by (plugin_utils/_outcome.py classify_failure)."""

    name: str
    # The role entry points it runs, in order: "role" (tasks/main.yml) or "role:entry point".
    steps: tuple
    # The test-only fault hook that follows it (gpufleet_fault_inject), "" for none.
    hook: str = ""
    # What of it the state file records: phases that change nothing record nothing, so a run on a host in sync
    # writes nothing; the drain's end is recorded by the switch phase's start, which follows it at once.
    record: tuple = ("started", "completed")
    # It may move the host towards the profile: it runs only on a host the model (phase assess) found drifted.
    changes_host: bool = True
    # The host is out of service when it ends (between the drain and the undrain): no run may stop after it.
    drained: bool = False
    # The outcome kind of a failure in it, and of one after it completed (its test hook, the next phase's start).
    fails_as: tuple = ("rolled_back", "rolled_back")


# The host serves until the drain: its toolkit is installed and its new venv built and verified before it, the switch
# and the post-check fall between drain and undrain. recover is the rollback of an interrupted run.
PHASE_TABLE = (
    Phase("preflight", ("preflight",), record=(), changes_host=False, fails_as=("failed_preflight",) * 2),
    Phase(
        "recover",
        ("rollback:recover",),
        hook="after_preflight",
        record=(),
        changes_host=False,
        # Once it completed the host is back at a verified backup and this run changed nothing yet.
        fails_as=("rollback_failed", "failed_preflight"),
    ),
    # The host model: in sync -> nothing more runs ("already at"); drifted -> the phases below repair or upgrade.
    Phase("assess", ("assess",), record=(), changes_host=False, fails_as=("failed_preflight",) * 2),
    # The old stack's benchmark comes first, so the backup keeps it. Until the backup completed only its folder was
    # written; from then on the host may change, whatever fails next.
    Phase(
        "backup",
        ("postcheck:baseline", "backup"),
        hook="after_backup",
        fails_as=("failed_before_change", "rolled_back"),
    ),
    Phase("cuda_toolkit", ("cuda_toolkit",), hook="after_toolkit"),
    # The new venv built and verified beside the old one; serving:prepare checks the serving settings and creates
    # their folder, so the switch only writes the files.
    Phase("prepare", ("venv_rebuild:prepare", "serving:prepare")),
    Phase("drain", ("serving:drain",), hook="after_drain", record=("started",), drained=True),
    # Reuses the verified venv, writes the unit for the new stack, switches current and restarts once.
    Phase("venv_rebuild", ("venv_rebuild",), hook="after_venv", drained=True),
    Phase("postcheck", ("postcheck",), hook="after_postcheck", drained=True),
    Phase("undrain", ("serving:undrain",)),
)
# Every phase a run records, in run order.
PHASES = tuple(phase.name for phase in PHASE_TABLE)
# Where a run may stop (gpufleet_stop_after) with the host serving its old stack: the phases before the drain.
STOP_POINTS = PHASES[: PHASES.index(next(p.name for p in PHASE_TABLE if p.drained))]
# prepared / stopped: the run stopped where gpufleet_stop_after told it to, the host still serving its old stack.
RESULTS = (
    "in_progress",
    "upgraded",
    "repaired",
    "prepared",
    "stopped",
    "rolled_back",
    "rollback_failed",
    "failed_preflight",
    "failed",
)
# The state file's schema: what its keys mean. A reader refuses a schema it does not know (validate_state).
STATE_VERSION = 1
STATE_VERSIONS = (STATE_VERSION,)
STATUSES = ("started", "completed")
# A run that did not end: an interrupted one, or one whose rollback failed. Only the collection version that
# started it recovers it (version_refusal), unless the operator accepts the change.
UNFINISHED_RESULTS = ("in_progress", "rollback_failed")
ACCEPT_VERSION_VAR = "gpufleet_accept_version_change"


class StateError(Exception):
    """A lock or state file that cannot be used as it is."""


# --------------------------------------------------------------------------- phases


def phases_until(stop_after=""):
    """The phases a run goes through: all of them, or those up to and including ``stop_after`` (a stop point).

    StateError names the value and the stop points when ``stop_after`` is none of them.
    """
    stop_after = "" if stop_after is None else stop_after
    if stop_after == "":
        return PHASE_TABLE
    if not isinstance(stop_after, str) or stop_after not in STOP_POINTS:
        raise StateError(
            f"gpufleet_stop_after is {stop_after!r}, not a phase a run can stop after with the host still serving its "
            f"old stack ({', '.join(STOP_POINTS)}); nothing was changed; fix: set one of them (prepare: build and "
            "verify the new stack, drain nothing), or leave gpufleet_stop_after unset for the whole upgrade"
        )
    return PHASE_TABLE[: PHASES.index(stop_after) + 1]


def stop_result(stop_after) -> str:
    """What the state file records for a run that stopped after ``stop_after`` (a stop point)."""
    return "prepared" if phases_until(stop_after)[-1].name == "prepare" else "stopped"


# --------------------------------------------------------------------------- files


def read_json(path):
    """Return the parsed document, None when the file is absent; StateError when it is not JSON."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read()
    except FileNotFoundError:
        return None
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise StateError(f"{path} is not valid JSON ({exc})") from exc
    if not isinstance(doc, dict):
        raise StateError(f"{path} holds a {type(doc).__name__}, expected a JSON object")
    return doc


def read_previous(path):
    """The state file as every reader takes it ({} when absent), validated (validate_state); an unusable one is a
    StateError that names the file, the value and what to do."""
    try:
        doc = read_json(path) or {}
    except StateError as exc:
        raise StateError(
            f"state file unusable: {exc}; nothing was changed; fix: inspect it, move it aside and run "
            "playbooks/rollback.yml for this host if it may be half-upgraded"
        ) from exc
    return validate_state(doc, path) if doc else doc


def dumps(doc) -> str:
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


def write_json_atomic(path, doc, mode=0o644):
    """Write a JSON document so that readers see the old or the new file, never half of one."""
    folder = os.path.dirname(path) or "."
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(dumps(doc))
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.rename(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    _fsync_dir(folder)


def create_exclusive(path, doc, mode=0o644) -> bool:
    """Create ``path`` holding ``doc`` only if it does not exist yet; False when another writer won."""
    folder = os.path.dirname(path) or "."
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", dir=folder)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(dumps(doc))
        handle.flush()
        os.fsync(handle.fileno())
    os.chmod(tmp, mode)
    try:
        # link() fails when the target exists: an atomic test-and-set on every POSIX filesystem.
        os.link(tmp, path)
    except FileExistsError:
        return False
    finally:
        os.unlink(tmp)
    _fsync_dir(folder)
    return True


def _fsync_dir(folder):
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# --------------------------------------------------------------------------- lock

LOCK_KEYS = ("run_id", "pid", "controller", "started")


def new_lock(run_id, pid, pid_start, controller, started):
    return {
        "run_id": str(run_id),
        "pid": int(pid),
        "pid_start": None if pid_start is None else str(pid_start),
        "controller": str(controller),
        "started": str(started),
    }


def check_lock(doc):
    """Raise StateError when a parsed lock lacks what a holder check needs."""
    missing = [key for key in LOCK_KEYS if key not in doc]
    if missing:
        raise StateError(f"lock lacks {', '.join(missing)}")
    try:
        int(doc["pid"])
    except (TypeError, ValueError) as exc:
        raise StateError(f"lock pid {doc['pid']!r} is not a number") from exc
    return doc


def describe_lock(doc) -> str:
    return "run {} (pid {} on {}, started {})".format(
        doc.get("run_id"),
        doc.get("pid"),
        doc.get("controller"),
        doc.get("started"),
    )


def judge_lock(lock, run_id, controller, holder_alive=None, break_run_id=None, takeover_dead=True):
    """Decide what a run may do with a host's lock.

    ``holder_alive(pid, pid_start)`` answers for processes of *this* controller; a holder on another
    controller cannot be checked from here and counts as alive.
    Returns ``(verdict, message)``; verdicts: free, ours, takeover, held.
    """
    if lock is None:
        return "free", "no lock"
    if lock.get("run_id") == run_id:
        return "ours", "lock already held by this run"
    who = describe_lock(lock)
    if break_run_id and lock.get("run_id") == break_run_id:
        return "takeover", f"lock of {who} broken on request (gpufleet_lock_break={break_run_id})"
    same_controller = lock.get("controller") == controller
    if same_controller and holder_alive is not None:
        if not holder_alive(int(lock["pid"]), lock.get("pid_start")):
            if takeover_dead:
                return "takeover", f"stale lock of dead {who} taken over"
            return "held", (f"stale lock: {who} is dead; fix: re-run with -e gpufleet_lock_break={lock.get('run_id')}")
        return "held", f"locked by running {who}; fix: wait for that run to finish"
    return "held", (
        f"locked by {who}, which cannot be checked from controller {controller}; fix: if that run is dead, "
        f"re-run with -e gpufleet_lock_break={lock.get('run_id')}"
    )


def process_start(pid, proc="/proc"):
    """Start time of a process (clock ticks since boot, /proc/<pid>/stat field 22); None if gone."""
    rest = stat_fields(pid, proc)
    return rest[19] if rest and len(rest) > 19 else None


def process_alive(pid, pid_start, proc="/proc") -> bool:
    """True when ``pid`` runs and is the same process that took the lock (not a reused pid)."""
    current = process_start(pid, proc)
    if current is None:
        return False
    return pid_start is None or str(pid_start) == current


# --------------------------------------------------------------------------- state


def _state_problem(doc) -> str:
    """What in a state record this collection cannot read, in words; "" when it reads every field it acts on."""
    version = doc.get("version")
    if version not in STATE_VERSIONS or isinstance(version, bool):
        known = ", ".join(str(v) for v in STATE_VERSIONS)
        return f"schema version {version!r} (key version), this collection reads version {known}"
    for where, record in (("", doc), ("last_run.", doc.get("last_run"))):
        if record is None and where:
            continue
        if not isinstance(record, dict):
            return f"{where.rstrip('.')} {record!r}, expected a JSON object"
        if (record.get("result") is not None or not where) and record.get("result") not in RESULTS:
            return f"{where}result {record.get('result')!r}, not one of {', '.join(RESULTS)}"
        if record.get("phase") is not None and record.get("phase") not in PHASES:
            return f"{where}phase {record.get('phase')!r}, not a phase of the phase table ({', '.join(PHASES)})"
        if record.get("status") is not None and record.get("status") not in STATUSES:
            return f"{where}status {record.get('status')!r}, not one of {', '.join(STATUSES)}"
    written_by = doc.get("collection_version")
    if written_by is not None and not isinstance(written_by, str):
        return f"collection_version {written_by!r}, expected a version string"
    return ""


def validate_state(doc, path="state.json"):
    """Return ``doc`` when this collection can act on it; else StateError naming the file, the value and the fix.

    Every reader calls it (module upgrade_state, module preflight_probe, the host model of module host_state, role
    rollback through upgrade_state): a record of an unknown schema, phase, status or result is never acted on, since
    what an unknown phase has changed on the host cannot be known from here.
    """
    if not isinstance(doc, dict):
        raise StateError(f"{path} holds a {type(doc).__name__}, expected a JSON object; nothing was changed")
    problem = _state_problem(doc)
    if not problem:
        return doc
    by = doc.get("collection_version")
    writer = f"{COLLECTION} {by}" if isinstance(by, str) and by else "another version of the collection, or a hand"
    raise StateError(
        f"{path} records {problem}: this record is not one {COLLECTION} {COLLECTION_VERSION} can act on (written by "
        f"{writer}); nothing was changed; fix: run this host with the collection version that wrote it, or inspect "
        "the file, move it aside (the next run records the host afresh) and run playbooks/rollback.yml for this host "
        "if it may be half-upgraded"
    )


def check_state(doc):
    """A record this collection is about to write: the same rules as for one it reads."""
    return validate_state(doc, "the state to record")


def version_refusal(state, running=COLLECTION_VERSION) -> str:
    """Why this collection version must not resume or roll back the unfinished run ``state`` records; "" when it may.

    Another version's phases and records may mean other things (a phase added, moved or renamed): only the version
    that started a run recovers it. A record without ``collection_version`` was written before the collection
    recorded its version (0.2.0 before this guard, or 0.1.0): which one cannot be told, so it counts as another.
    """
    if not state or state.get("result") not in UNFINISHED_RESULTS:
        return ""
    recorded = state.get("collection_version")
    if recorded == running:
        return ""
    if state.get("result") == "rollback_failed":
        what = f"the rollback of run {state.get('run_id')} failed"
    else:
        what = interrupted_at(state)
    if recorded:
        under, finish = f"{COLLECTION} {recorded}", f"finish it with {COLLECTION} {recorded} (upgrade.yml resumes it"
    else:
        under = f"a {COLLECTION} that recorded no version (state.json has no collection_version: 0.1.0 or older)"
        finish = "finish it with the version that started it, if you know it (upgrade.yml resumes it"
    target = f" to backup {state['backup_id']}" if state.get("backup_id") else ""
    return (
        f"{what} under {under}; this is {COLLECTION} {running}, and only the version that started a run resumes or "
        f"rolls it back; nothing was changed; fix: {finish}, rollback.yml undoes it), or let {running} take it "
        f"over{target} with -e {ACCEPT_VERSION_VAR}=true"
    )


def update_state(previous, run_id, now, **changes):
    """Return the state after ``changes``; a new run starts from a clean record but keeps the last result."""
    previous = dict(previous or {})
    if previous.get("run_id") != run_id:
        if changes.get("result") == "failed_preflight" and decide_recovery(previous, run_id, None)["action"] != "none":
            # A run refused before it changed anything leaves an unfinished run's record as it is: recorded, the
            # refusal would end that record, and the next run would neither recover nor refuse the host.
            return check_state(previous)
        state = {
            "version": STATE_VERSION,
            "collection_version": COLLECTION_VERSION,
            "run_id": run_id,
            "started": now,
            "history": [],
        }
        if previous:
            keys = ("run_id", "result", "phase", "backup_id", "reason", "collection_version")
            state["last_run"] = {key: previous.get(key) for key in keys}
            if previous.get("lock"):
                # The lock the host last applied stays on record until a run applies another (an audit's reference).
                state["lock"] = previous["lock"]
            if previous.get("result") == "in_progress" and previous.get("backup_id"):
                # Until this run has its own backup, the interrupted run's backup is the host's known-good
                # state: a run killed before it got that far must still be rolled back to it.
                state["backup_id"] = previous["backup_id"]
    else:
        state = previous
        state["history"] = list(previous.get("history", []))
    for key, value in changes.items():
        if value is not None:
            state[key] = value
    state.setdefault("result", "in_progress")
    event = {key: changes[key] for key in ("phase", "status", "result", "reason") if changes.get(key) is not None}
    if event and (not state["history"] or {k: v for k, v in state["history"][-1].items() if k != "at"} != event):
        state["history"] = state["history"] + [dict(event, at=now)]
    state["updated"] = now
    return check_state(state)


def same_state(a, b) -> bool:
    """Equal apart from timestamps: a repeated write of the same facts is no change."""

    def strip(doc):
        doc = dict(doc or {})
        doc.pop("updated", None)
        doc["history"] = [{k: v for k, v in ev.items() if k != "at"} for ev in doc.get("history", [])]
        return doc

    return strip(a) == strip(b)


def interrupted_at(state):
    return f"run {state.get('run_id')} was interrupted at phase {state.get('phase')} ({state.get('status', 'started')})"


def decide_recovery(state, run_id, running=COLLECTION_VERSION, accept_version_change=False):
    """What this run must do first, given the state file left by the last run (see module docstring).

    An unfinished run that another collection version started is refused (version_refusal) unless the operator
    accepts the change; ``running`` None judges the record without the version guard.
    """
    if not state or state.get("run_id") == run_id:
        return {"action": "none", "reason": "no interrupted run"}
    other_version = version_refusal(state, running) if running is not None else ""
    if other_version and not accept_version_change:
        return {"action": "refuse", "backup_id": state.get("backup_id"), "reason": other_version}
    decision = _recovery(state)
    if other_version:
        decision["reason"] += _takeover(state, running)
    return decision


def _takeover(state, running) -> str:
    """The words a recovery or rollback adds when the operator let this version take over another version's run."""
    started = state.get("collection_version") or "a version it did not record"
    return f" (started by {COLLECTION} {started}, taken over by {running}: {ACCEPT_VERSION_VAR})"


def _recovery(state):
    result = state.get("result")
    previous = state.get("run_id")
    if result == "rollback_failed":
        return {
            "action": "refuse",
            "backup_id": state.get("backup_id"),
            "reason": (
                f"the rollback of run {previous} failed ({state.get('reason', 'no reason recorded')}); fix: inspect "
                f"the host, then run playbooks/rollback.yml -l <host> -e rollback_backup_id={state.get('backup_id')}"
            ),
        }
    if result != "in_progress":
        return {"action": "none", "reason": f"last run {previous} ended: {result}"}
    where = interrupted_at(state)
    if not state.get("backup_id"):
        return {"action": "restart", "reason": f"{where} before its backup completed: nothing had changed"}
    return {"action": "rollback", "backup_id": state["backup_id"], "reason": f"{where}: rolling back first"}


# Results after which the host runs what its run installed: the backup that run recorded is the way back.
MOVED_RESULTS = ("upgraded", "repaired", "in_progress")
# Results after which the host serves what it served before the run: refused, or stopped before the drain.
KEPT_RESULTS = ("failed_preflight", "failed", "prepared", "stopped")


def recorded_backup(state):
    """The backup the host's record says the last run moved away from; None when the record names none.

    A run that upgraded or repaired the host (or was interrupted after its backup) recorded the backup of the host
    before it; a rollback's record names the backup it restored, which is where the host is now, so no way back.
    A run refused before any change defers to the run before it.
    """
    if state and state.get("result") in KEPT_RESULTS:
        # A run that left the serving stack as it was: the run before it (its record's last_run) says where the host is.
        return recorded_backup(state.get("last_run"))
    if not state or state.get("result") not in MOVED_RESULTS:
        return None
    return state.get("backup_id") or None


def describe_record(state, path):
    """One line on the host's run record for reports: the last run, or that the record is missing."""
    if not state:
        return f"the host's run record {path} is missing"
    line = f"run {state.get('run_id')} {state.get('result')}"
    if state.get("result") == "in_progress":
        line += f" at phase {state.get('phase')} ({state.get('status', 'started')})"
    if state.get("backup_id"):
        line += f", backup {state['backup_id']}"
    return line


def rollback_target(state, run_id, requested="", running=COLLECTION_VERSION, accept_version_change=False):
    """Which backup a rollback restores: ``{backup_id, why, refuse}``; backup_id None lets the caller choose by the
    host; ``refuse`` (else "") says why this collection version must not roll back the unfinished run the record names.

    A backup named by the operator wins. Else an interrupted run (state ``in_progress`` with a backup, the run
    that holds the lock now being another one: the dead run's lock was taken over) is undone to its backup,
    even when the host already matches it: the host may be drained or stopped, and its record must end.
    """
    ours = bool(state) and state.get("run_id") == run_id
    other_version = "" if ours else version_refusal(state, running)
    refuse = "" if accept_version_change else other_version
    if requested:
        return {"backup_id": requested, "why": "named by the operator", "refuse": refuse}
    recovery = decide_recovery(state, run_id, None)
    if recovery["action"] == "rollback":
        why = interrupted_at(state) + (_takeover(state, running) if other_version else "")
        return {"backup_id": recovery["backup_id"], "why": why, "refuse": refuse}
    return {"backup_id": None, "why": "the newest backup that differs from the host as it is", "refuse": refuse}
