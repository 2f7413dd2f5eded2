# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin: take the fleet's reviewed lock file on the controller; never ask an index anything."""

from __future__ import annotations

import os

from ansible_collections.gpufleet.upgrade.plugins.modules.wheel_lock import ARGUMENT_SPEC
from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _lock_file as lf
from ansible_collections.gpufleet.upgrade.plugins.plugin_utils._index import Fetcher
from ansible_collections.gpufleet.upgrade.plugins.plugin_utils._wheel_action import WheelAction
from ansible_collections.gpufleet.upgrade.plugins.plugin_utils._wheel_plan import fetch_wheelhouse, verify_wheelhouse
from ansible_collections.gpufleet.upgrade.plugins.plugin_utils._wheels import PlanError


class ActionModule(WheelAction):
    ARGUMENT_SPEC = ARGUMENT_SPEC

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        start = self.start(result, task_vars)
        if start is None:
            return result
        args, profile, wheelhouse = start.args, start.profile, start.wheelhouse
        path = os.path.abspath(args["path"])
        allowed = args["allowed_urls"]
        if allowed is None:
            allowed = self._templar.template(task_vars.get("gpufleet_lock_allowed_urls") or [])
        try:
            # The file as plan.yml wrote it (digest, names), for this profile, naming only allowed URLs: all checked
            # before anything is fetched or any host changes.
            doc = lf.read(path)
            lf.check_profile(doc, profile, path)
            lf.check_urls(doc, path, lf.allowed_urls(profile, args["fleet_cache_url"], allowed), profile)
            locks = [lf.entry_lock(doc, entry, path, wheelhouse) for entry in doc["entries"]]
            fetched = self._fetch(args, locks, wheelhouse) if args["fetch"] else []
            self._check_wheels(args, locks, wheelhouse, path)
            lf.check_metadata(locks, wheelhouse, path)
            _installed_sizes(locks, wheelhouse)
        except (lf.LockFileError, PlanError) as exc:
            return self.fail(result, str(exc))
        result.update(
            changed=bool(fetched) and not self._task.check_mode,
            path=path,
            profile=doc["profile"],
            entries=locks,
            fetched=fetched,
        )
        return result

    def _fetch(self, args, locks, wheelhouse):
        """The lock's own files from the URLs it names (sha256 checked); check mode names them only."""
        wanted = [f for lock in locks for f in verify_wheelhouse(lock, wheelhouse)]
        if self._task.check_mode or not wanted:
            return sorted(set(wanted))
        fetcher = Fetcher(timeout=args["timeout"])
        for lock in locks:
            fetch_wheelhouse(fetcher, lock, wheelhouse)
        return sorted(set(wanted))

    def _check_wheels(self, args, locks, wheelhouse, path):
        if args["fleet_cache_url"]:
            files = {w["filename"]: w for lock in locks for w in lock["packages"] + lock["tools"]}
            gone = lf.missing_from_site_cache(
                [files[name] for name in sorted(files)], args["fleet_cache_url"], timeout=args["timeout"]
            )
            lf.refuse_missing({"site cache": gone}, f"the site cache {args['fleet_cache_url']}", path)
            return
        if self._task.check_mode and args["fetch"]:
            return  # the files named as fetched would be there after a real run
        gone = {
            lock["venv_name"]: lf.wheelhouse_mismatches(verify_wheelhouse(lock, wheelhouse), [lock], wheelhouse)
            for lock in locks
        }
        lf.refuse_missing(gone, f"the controller's wheelhouse {wheelhouse}", path)


def _installed_sizes(locks, wheelhouse):
    """Each entry's installed_size from the wheelhouse's copy (role preflight sizes the new venv from them); an entry
    whose wheel is not there with its locked sha256 (a site cache serves it) has none."""
    for lock in locks:
        if any("installed_size" not in e for e in lock["packages"] + lock["tools"]):
            verify_wheelhouse(lock, wheelhouse)
