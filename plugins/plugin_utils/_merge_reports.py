# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One fleet report from the reports of a sliced run: pure logic, no Ansible (controller side).

A rollout cut into slices (AWX job slicing, or several ``ansible-playbook --limit`` processes) gives each slice a run
of its own, with its run id and folder ``<controller_dir>/runs/<run id>/`` holding its ``report.json`` (the summary
callback writes it, ``_fleet_report``). ``merge`` reads those documents and makes the fleet's: every host's record
as its slice wrote it, totals over all of them, and ``slices`` (each slice's run id, report, hosts and totals). A host
in two slices is refused, naming the host and both runs: its two records cannot both be its outcome. Slices of
another kind (an audit beside an upgrade) or another profile are refused too.

The merged report is deterministic: its run id is ``merged-`` and a hash of the slices' run ids, and it is dated by
its newest slice, so merging the same slices again writes the same files. The lookup ``merged_report`` and
``playbooks/merge_reports.yml`` call it.
"""

from __future__ import annotations

import hashlib
import json
import os

from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _fleet_report

MERGED_PREFIX = "merged-"


class MergeError(ValueError):
    """Slices that cannot be merged; the message names the run, the value and the fix."""


def report_path(ref, controller_dir=None) -> str:
    """The report.json a slice reference names: a run id (``<controller_dir>/runs/<run id>/report.json``), a run
    folder, or a report.json file."""
    ref = str(ref or "").strip()
    if not ref:
        raise MergeError("an empty run in gpufleet_merge_runs; fix: give run ids, run folders or report.json paths")
    if ref.endswith(".json"):
        return ref
    if os.sep in ref or ref.startswith("."):
        return os.path.join(ref, "report.json")
    if not controller_dir:
        raise MergeError(
            f"run {ref}: a run id needs the controller folder;"
            " fix: set gpufleet_controller_dir or give the run's folder"
        )
    return os.path.join(str(controller_dir), "runs", ref, "report.json")


def read(path) -> dict:
    """A slice's report.json, checked to be a fleet report."""
    try:
        with open(path, encoding="utf-8") as handle:
            doc = json.load(handle)
    except FileNotFoundError as exc:
        raise MergeError(
            f"{path} does not exist; fix: name a run whose job had the callback gpufleet.upgrade.upgrade_summary "
            "enabled (it writes report.json at the end of the run), or the run's folder"
        ) from exc
    except (OSError, ValueError) as exc:
        raise MergeError(
            f"{path} cannot be read as JSON ({exc}); fix: name a report.json the summary callback wrote"
        ) from exc
    if not isinstance(doc, dict) or doc.get("schema") != _fleet_report.SCHEMA or not isinstance(doc.get("hosts"), list):
        seen = doc.get("schema") if isinstance(doc, dict) else type(doc).__name__
        raise MergeError(
            f"{path} is not a fleet report (schema {seen!r}, expected {_fleet_report.SCHEMA!r} with a list of hosts);"
            " fix: name the report.json of a gpufleet run"
        )
    for record in doc["hosts"]:
        if not isinstance(record, dict) or not record.get("host") or not record.get("status"):
            raise MergeError(f"{path}: a host record without host or status: {str(record)[:80]!r}; fix: write it again")
    return doc


def _label(doc, path):
    return str(doc.get("run_id") or path)


def _same(slices, key, what):
    """The one value of ``key`` the slices share; two different ones are refused, naming a run of each."""
    first = {}
    for path, doc in slices:
        first.setdefault(str(doc.get(key) or ""), _label(doc, path))
    values = {v: r for v, r in first.items() if v}
    if len(values) > 1:
        shown = ", ".join(f"{v!r} (run {r})" for v, r in sorted(values.items()))
        raise MergeError(f"the slices are of different {what}s: {shown}; fix: merge the slices of one rollout only")
    return next(iter(values), "")


def merged_run_id(run_ids) -> str:
    digest = hashlib.sha256("\n".join(sorted(run_ids)).encode()).hexdigest()[:12]
    return MERGED_PREFIX + digest


def merge(slices) -> dict:
    """The fleet report of several slices: ``slices`` is ``[(path, doc), ...]`` (docs as ``read`` returns them)."""
    if not slices:
        raise MergeError("no slices to merge; fix: list the slices' runs in gpufleet_merge_runs")
    labels = [_label(doc, path) for path, doc in slices]
    if len(set(labels)) < len(labels):
        twice = sorted({x for x in labels if labels.count(x) > 1})
        raise MergeError(f"run {', '.join(twice)} is listed twice; fix: name each slice's run once")
    kind = _same(slices, "kind", "kind")
    _same(slices, "profile", "profile")
    owner, records, parts = {}, [], []
    for (path, doc), label in zip(slices, labels, strict=True):
        for record in doc["hosts"]:
            host = record["host"]
            if host in owner:
                raise MergeError(
                    f"{host}: in two slices, run {owner[host]} and run {label}; fix: slice the inventory so that each"
                    " host is in one slice (AWX job slicing does), and merge the runs of one rollout"
                )
            owner[host] = label
            records.append(record)
        parts.append(
            {
                "run_id": label,
                "report": str(path),
                "generated": doc.get("generated", ""),
                "hosts": len(doc["hosts"]),
                "totals": doc.get("totals") or {},
            }
        )
    generated = max(float(doc.get("generated_epoch") or 0) for _path, doc in slices)
    merged = _fleet_report.fleet(records, run_id=merged_run_id(labels), kind=kind, generated=generated)
    merged["slices"] = sorted(parts, key=lambda p: p["run_id"])
    return merged


def merge_runs(refs, controller_dir=None) -> dict:
    """Read the slices named by ``refs`` (run ids, run folders, report.json paths) and merge them."""
    refs = [refs] if isinstance(refs, str) else list(refs or [])
    paths = [report_path(ref, controller_dir) for ref in refs]
    return merge([(path, read(path)) for path in paths])
