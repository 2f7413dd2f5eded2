# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin: plan the serving wheels once, on the controller; write the lock and fill the wheelhouse."""

from __future__ import annotations

import datetime
import json
import os
import tempfile
from urllib.parse import unquote

from ansible_collections.gpufleet.upgrade.plugins.modules.wheel_plan import ARGUMENT_SPEC
from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _lock_file as lf
from ansible_collections.gpufleet.upgrade.plugins.plugin_utils._index import Fetcher
from ansible_collections.gpufleet.upgrade.plugins.plugin_utils._lock_rules import not_judged_lines
from ansible_collections.gpufleet.upgrade.plugins.plugin_utils._wheel_action import WheelAction
from ansible_collections.gpufleet.upgrade.plugins.plugin_utils._wheel_plan import (
    fetch_wheelhouse,
    find_uv,
    make_lock,
    refusal_line,
    report_lines,
    verify_wheelhouse,
)
from ansible_collections.gpufleet.upgrade.plugins.plugin_utils._wheels import PlanError, Target


class ActionModule(WheelAction):
    ARGUMENT_SPEC = ARGUMENT_SPEC

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        start = self.start(result, task_vars)
        if start is None:
            return result
        args, host, profile, controller_dir = start.args, start.host, start.profile, start.controller_dir
        wheelhouse = start.wheelhouse
        fetcher = Fetcher(timeout=args["timeout"])
        if args["lock_file"]:
            return self._plan_lock_file(result, args, profile, fetcher, wheelhouse, host, task_vars)
        target = Target(
            python_version=args["python_version"] or profile["python"]["version"], platform=args["platform"]
        )
        try:
            lock = self._make_lock(args, profile, target, fetcher, wheelhouse)
        except PlanError as exc:
            return self.fail(result, f"{host}: wheel plan for profile {profile.get('name')!r} failed: {exc}")
        lock_dir = os.path.join(controller_dir, "locks")
        lock_path = os.path.join(lock_dir, f"{lock['venv_name']}.json")
        lock["wheelhouse"] = wheelhouse
        changed = not os.path.exists(lock_path)
        fetched = {"path": wheelhouse, "fetched": [], "reused": [], "bytes": 0}
        if self._task.check_mode:
            missing = verify_wheelhouse(lock, wheelhouse) if args["fetch"] else []
            changed = changed or bool(missing)
            fetched["would_fetch"] = missing
        else:
            try:
                if args["fetch"]:
                    fetched = fetch_wheelhouse(fetcher, lock, wheelhouse, profile)
                    # Chosen wheels were fetched while planning: count every download of this run.
                    # File names as the wheelhouse has them: a URL writes a local version's + as %2B.
                    fetched["fetched"] = sorted(unquote(os.path.basename(u)) for u in fetcher.downloads)
                    fetched["reused"] = sorted(set(fetched["reused"]) - set(fetched["fetched"]))
                    changed = changed or bool(fetched["fetched"])
                if changed:
                    _write_json(lock_path, lock)
                    with open(lock_path[: -len(".json")] + ".txt", "w", encoding="utf-8") as handle:
                        handle.write("\n".join(report_lines(lock)) + "\n")
            except PlanError as exc:
                return self.fail(result, f"{host}: {exc}")
        # The same lock as a lock file, so what this run installs can be reviewed and applied again as it is.
        made_file = lock_path[: -len(".json")] + ".lock.yml"
        try:
            doc = lf.make_document(profile, [lock], lock.get("generated_at") or _now(), _allowed(self, task_vars))
        except lf.LockFileError as exc:
            return self.fail(result, f"{host}: {exc}")
        if not self._task.check_mode and not _same_entries(made_file, doc):
            lf.write(made_file, lf.dumps(doc))
        lock["path"] = lock_path
        lock["lock_file"] = made_file
        lock["origin"] = f"made now by this run, written to {made_file}"
        made_now = (
            f"lock made now by this run (no gpufleet_lock_file given), written to {made_file}"
            f"{' (check mode: not written)' if self._task.check_mode else ''}; review it and apply exactly it with"
            f" -e gpufleet_lock_file={made_file}"
        )
        result.update(
            changed=changed,
            lock=lock,
            lock_path=lock_path,
            lock_file=made_file,
            report=[made_now, *report_lines(lock)],
            fetch={**fetched, **_counts(fetcher)},
        )
        refusals = _refusal_lines([lock])
        if refusals or _not_judged([lock]):
            result["warnings"] = refusals + _not_judged([lock])
        if self._task.diff:
            result["diff"] = {"before": "", "after": "\n".join(report_lines(lock)) + "\n", "after_header": lock_path}
            if not changed:
                result["diff"]["before"] = result["diff"]["after"]
        return result

    def _make_lock(self, args, profile, target, fetcher, wheelhouse):
        today = datetime.date.fromisoformat(args["today"]) if args["today"] else None
        return make_lock(
            profile,
            target,
            fetcher,
            find_uv(args["uv_path"]),
            tools=args["tools"],
            today=today,
            wheelhouse=wheelhouse if args["fetch"] and not self._task.check_mode else None,
            # A cache, not the plan's output: check mode uses and fills it too (uv's pages, computed hashes).
            cache_dir=os.path.join(os.path.dirname(wheelhouse), "cache"),
            reuse_wheelhouse=wheelhouse,
        )

    def _plan_lock_file(self, result, args, profile, fetcher, wheelhouse, host, task_vars=None):
        """Plan every target, write the lock file and its report (not in check mode), diff it against the previous
        one. An unchanged plan leaves the file as it is (its date too), so a re-plan without news is no change."""
        path = args["lock_file"]
        python = args["python_version"] or profile["python"]["version"]
        try:
            targets = (
                lf.plan_targets(args["hosts"], python)
                if args["hosts"]
                else [{"platform": args["platform"], "python": python, "hosts": []}]
            )
        except lf.LockFileError as exc:
            return self.fail(result, f"{host}: {exc}")
        try:
            previous = lf.read(path, verify=False) if os.path.exists(path) else None
        except lf.LockFileError as exc:
            return self.fail(result, f"{host}: {exc}; or move it aside to plan without a previous lock file")
        locks = []
        for target in targets:
            try:
                lock = self._make_lock(
                    args, profile, Target(str(target["python"]), target["platform"]), fetcher, wheelhouse
                )
                if args["fetch"] and not self._task.check_mode:
                    fetch_wheelhouse(fetcher, lock, wheelhouse, profile)
            except PlanError as exc:
                return self.fail(
                    result,
                    f"{host}: wheel plan for profile {profile.get('name')!r}, {target['platform']} Python"
                    f" {target['python']}, failed: {exc}. The lock file {path} was not changed",
                )
            locks.append(lock)
        try:
            doc = lf.make_document(profile, locks, _now(), _allowed(self, task_vars))
        except lf.LockFileError as exc:
            return self.fail(result, f"{host}: {exc}")
        change = lf.diff(previous, doc)
        if previous is not None and not change["changed"]:
            doc = previous
        text = lf.dumps(doc)
        report = lf.report_path(path)
        # An index that refused a package another one served is part of what the operator reviews: first in the
        # diff, whether or not the lock changed (a site mirror that always refused changes nothing in the lock).
        refusals = _refusal_lines(locks)
        diff_lines = refusals + lf.diff_lines(change)
        report_text = "\n".join(
            ["plan diff against the previous lock file:", *diff_lines, ""]
            + [line for lock in locks for line in (*report_lines(lock), "")]
        )
        before = ""
        if previous is not None:
            with open(path, encoding="utf-8") as handle:
                before = handle.read()
        changed = text != before
        if not self._task.check_mode:
            if changed:
                lf.write(path, text)
            lf.write(report, report_text)
        result.update(
            changed=changed,
            lock_file=path,
            report_path=report,
            plan_diff=change,
            diff_lines=diff_lines,
            index_refusals=[r for lock in locks for r in lock.get("index_refusals") or []],
            targets=targets,
            group_lines=[
                f"group {t['platform']} Python {t['python']}: {', '.join(t['hosts']) or 'every host'}" for t in targets
            ],
            entries=doc["entries"],
            report=report_text.splitlines(),
            fetch=_counts(fetcher),
        )
        if refusals or _not_judged(locks):
            result["warnings"] = refusals + _not_judged(locks)
        if self._task.diff:
            result["diff"] = {"before": before, "after": text, "before_header": path, "after_header": path}
            if refusals:
                result["diff"] = [result["diff"], {"prepared": "\n".join(refusals)}]
        return result


def _counts(fetcher):
    """The plan's requests to the indexes: all, those asked with validators, and those answered 304 (kept copy)."""
    return {
        "requests": fetcher.requests,
        "conditional": fetcher.conditional,
        "not_modified": fetcher.revalidated,
        "metadata_by_sha256": fetcher.metadata_by_sha256,
        "bytes_in": fetcher.bytes_in,
    }


def _refusal_lines(locks):
    """One line per index that refused a profile package, once across the targets planned."""
    return list(dict.fromkeys(refusal_line(r) for lock in locks for r in lock.get("index_refusals") or []))


def _not_judged(locks):
    """What the lock rules could not judge (check mode: the wheels it did not download), once across the targets."""
    return list(dict.fromkeys(line for lock in locks for line in not_judged_lines(lock.get("lock_rules") or {})))


def _now():
    return datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat()


def _same_entries(path, doc):
    """Whether the lock file at ``path`` already holds ``doc``'s entries for the same profile (then it stays)."""
    try:
        return not lf.diff(lf.read(path), doc)["changed"]
    except lf.LockFileError:
        return False


def _write_json(path, doc):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".lock-")
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(doc, handle, indent=1, sort_keys=True, default=str)
    os.replace(tmp, path)


def _allowed(action, task_vars):
    """gpufleet_lock_allowed_urls: URL prefixes a lock's wheels may come from besides the indexes' files."""
    return action._templar.template((task_vars or {}).get("gpufleet_lock_allowed_urls") or [])
