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


def last_known(controller_dir, host) -> dict:
    """The newest report of a run that acted on ``host`` (check-mode runs left out): run_id, outcome, backup_id,
    profile, path; plus ``backups``, the ids the controller holds copies of. Empty values when it knows nothing."""
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
                doc = json.load(handle)
            stamp = os.stat(path).st_mtime
        except (OSError, ValueError):
            continue
        if not isinstance(doc, dict) or doc.get("check_mode"):
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
