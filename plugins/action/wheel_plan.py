# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin: plan the serving wheels once, on the controller; write the lock and fill the wheelhouse."""

from __future__ import annotations

import json
import os
import tempfile
from urllib.parse import unquote

from ansible.module_utils.basic import missing_required_lib
from ansible.plugins.action import ActionBase

from ansible_collections.gpufleet.upgrade.plugins.modules.wheel_plan import ARGUMENT_SPEC
from ansible_collections.gpufleet.upgrade.plugins.plugin_utils._index import Fetcher
from ansible_collections.gpufleet.upgrade.plugins.plugin_utils._wheel_plan import (
    fetch_wheelhouse,
    find_uv,
    make_lock,
    report_lines,
    verify_wheelhouse,
)
from ansible_collections.gpufleet.upgrade.plugins.plugin_utils._wheels import (
    HAS_PACKAGING,
    PACKAGING_IMPORT_ERROR,
    PlanError,
    Target,
)


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        _validation, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        host = task_vars.get("inventory_hostname", "controller")
        if not HAS_PACKAGING:
            # The plan runs on the controller: the library is missing from the Python that runs ansible.
            self._fail(result, f"{host}: {missing_required_lib('packaging')}")
            result["exception"] = PACKAGING_IMPORT_ERROR
            return result
        profile = args["profile"] or self._var(task_vars, "gpufleet_stack")
        controller_dir = args["controller_dir"] or self._var(task_vars, "gpufleet_controller_dir")
        if not profile:
            return self._fail(result, f"{host}: no profile; run role gpufleet.upgrade.stack first or pass profile")
        if not controller_dir:
            return self._fail(
                result, f"{host}: set gpufleet_controller_dir (where locks are kept) or pass controller_dir"
            )
        target = Target(
            python_version=args["python_version"] or profile["python"]["version"], platform=args["platform"]
        )
        fetcher = Fetcher(timeout=args["timeout"])
        wheelhouse = os.path.join(controller_dir, "wheelhouse")
        today = None
        if args["today"]:
            import datetime

            today = datetime.date.fromisoformat(args["today"])
        try:
            lock = make_lock(
                profile,
                target,
                fetcher,
                find_uv(args["uv_path"]),
                tools=args["tools"],
                today=today,
                wheelhouse=wheelhouse if args["fetch"] and not self._task.check_mode else None,
            )
        except PlanError as exc:
            return self._fail(result, f"{host}: wheel plan for profile {profile.get('name')!r} failed: {exc}")
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
                    fetched = fetch_wheelhouse(fetcher, lock, wheelhouse)
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
                return self._fail(result, f"{host}: {exc}")
        lock["path"] = lock_path
        result.update(
            changed=changed,
            lock=lock,
            lock_path=lock_path,
            report=report_lines(lock),
            fetch={**fetched, "requests": fetcher.requests, "bytes_in": fetcher.bytes_in},
            ansible_facts={"gpufleet_wheel_lock": lock},
        )
        if self._task.diff:
            result["diff"] = {"before": "", "after": "\n".join(report_lines(lock)) + "\n", "after_header": lock_path}
            if not changed:
                result["diff"]["before"] = result["diff"]["after"]
        return result

    def _var(self, task_vars, name):
        value = task_vars.get(name)
        return self._templar.template(value) if value is not None else None

    @staticmethod
    def _fail(result, msg):
        result.update(failed=True, msg=msg)
        return result


def _write_json(path, doc):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".lock-")
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(doc, handle, indent=1, sort_keys=True, default=str)
    os.replace(tmp, path)
