# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the controller knows of a host's runs when the host's own record (state.json) is gone (controller side).

Every run keeps each host's report as ``<controller_dir>/runs/<run_id>/<host>.json`` (playbooks/tasks/host_report.yml
through the summary callback) and every backup's copy under ``<controller_dir>/backups/<host>/<id>/`` (role backup).
A host that lost its state.json is then still described by them: the audit, the upgrade and the rollback say the
record is missing and what was last known, instead of treating the host as new.
"""

from __future__ import annotations

import json
import os

from ansible_collections.gpufleet.upgrade.plugins.module_utils._backup import ID_RE
from ansible_collections.gpufleet.upgrade.plugins.module_utils._version import COLLECTION, COLLECTION_VERSION
from ansible_collections.gpufleet.upgrade.plugins.plugin_utils._outcome import KINDS, RUN_RECORD_SCHEMA

SCHEMAS = (RUN_RECORD_SCHEMA,)


class RunRecordError(ValueError):
    """A run record on the controller that this collection cannot act on."""


def _record_problem(doc) -> str:
    if not isinstance(doc, dict):
        return f"a {type(doc).__name__}, expected a JSON object"
    schema = doc.get("schema")
    if "schema" not in doc:
        # Written before run records carried a schema: the same fields, read as schema 1 when their kind is known.
        schema = RUN_RECORD_SCHEMA
    if schema not in SCHEMAS or isinstance(schema, bool):
        return f"schema {schema!r}, this collection reads schema {', '.join(str(s) for s in SCHEMAS)}"
    kind = doc.get("outcome_kind")
    if kind not in KINDS:
        return f"outcome_kind {kind!r}, not one of {', '.join(sorted(KINDS))}"
    if not isinstance(doc.get("check_mode", False), bool):
        return f"check_mode {doc.get('check_mode')!r}, expected true or false"
    return ""


def validate_run_record(doc, path):
    """Return ``doc`` when this collection can act on the run record; else RunRecordError naming the file, the value
    and the fix. Reports are the controller's own words on a host, so unlike the host's records they live in
    plugin_utils, with the outcome kinds they are judged by (_outcome.KINDS)."""
    problem = _record_problem(doc)
    if not problem:
        return doc
    by = doc.get("collection_version") if isinstance(doc, dict) else None
    writer = f"{COLLECTION} {by}" if isinstance(by, str) and by else "another version of the collection, or a hand"
    raise RunRecordError(
        f"the controller's run record {path} holds {problem}: not a record {COLLECTION} {COLLECTION_VERSION} can act "
        f"on (written by {writer}); nothing was changed; fix: read it with the version that wrote it, or move it out "
        f"of {os.path.dirname(os.path.dirname(path))}"
    )


def last_known(controller_dir, host) -> dict:
    """The newest report of a run that acted on ``host`` (check-mode runs left out): run_id, outcome, backup_id,
    profile, path; plus ``backups``, the ids the controller holds copies of. Empty values when it knows nothing.

    Every report of the host is validated (validate_run_record): RunRecordError names one this collection cannot act
    on, rather than describe the host by an older one.
    """
    runs = os.path.join(controller_dir, "runs")
    newest = None
    try:
        names = os.listdir(runs)
    except FileNotFoundError:
        names = []
    for name in names:
        path = os.path.join(runs, name, f"{host}.json")
        try:
            with open(path, encoding="utf-8") as handle:
                text = handle.read()
            stamp = os.stat(path).st_mtime
        except OSError:
            continue
        try:
            doc = json.loads(text)
        except ValueError as exc:
            # Reports are written atomically: one that does not parse was damaged, and what it said is unknown.
            raise RunRecordError(
                f"the controller's run record {path} is not valid JSON ({exc}); nothing was changed; fix: restore it "
                f"or move it out of {runs}"
            ) from None
        if validate_run_record(doc, path).get("check_mode"):
            continue
        if newest is None or stamp > newest[0]:
            newest = (stamp, path, doc)
    folder = os.path.join(controller_dir, "backups", host)
    try:
        backups = sorted(n for n in os.listdir(folder) if ID_RE.match(n) and os.path.isdir(os.path.join(folder, n)))
    except FileNotFoundError:
        backups = []
    out = {"run_id": None, "outcome": None, "backup_id": None, "profile": None, "path": None, "backups": backups}
    if newest:
        doc = newest[2]
        out.update(
            run_id=doc.get("run_id"),
            outcome=doc.get("outcome"),
            backup_id=doc.get("backup_id") or None,
            profile=doc.get("profile"),
            path=newest[1],
        )
    return out


def describe_last_known(known) -> str:
    """One line for a report: the controller's last report of the host and the backups it holds copies of."""
    known = known or {}
    parts = []
    if known.get("run_id"):
        line = f"run {known['run_id']}: {known.get('outcome')}"
        if known.get("backup_id"):
            line += f" (backup {known['backup_id']})"
        parts.append(line)
    if known.get("backups"):
        parts.append(f"backup copies {', '.join(known['backups'])}")
    return "; ".join(parts) if parts else "nothing (no run report, no backup copy)"


def missing_record_note(state_path, known) -> str:
    """The words every report uses for a host that lost its state.json; empty when the controller never saw it."""
    known = known or {}
    if not known.get("run_id") and not known.get("backups"):
        return ""
    return (
        f"the host's run record {state_path} is missing; last known from the controller: {describe_last_known(known)}"
    )
