# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin of fleet_cache: the run's HTTP cache lives on the controller (plugin_utils/_fleet_cache.py)."""

from __future__ import annotations

import os

from ansible.plugins.action import ActionBase

from ansible_collections.gpufleet.upgrade.plugins.modules.fleet_cache import ARGUMENT_SPEC
from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _fleet_cache as fc
from ansible_collections.gpufleet.upgrade.plugins.plugin_utils._controller import playbook_pid


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        _validation, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        host = task_vars.get("inventory_hostname", "controller")
        run_dir = os.path.expanduser(args["run_dir"])
        result["changed"] = False
        try:
            if args["state"] == "stopped":
                result.update(fc.stop(run_dir))
                return result
            mounts = {name: os.path.expanduser(str(folder)) for name, folder in args["mounts"].items()}
            for folder in mounts.values():
                os.makedirs(folder, exist_ok=True)
            address = fc.controller_address(args["ssh_client"], args["host_address"])
            bind = args["bind"] or address
            state = fc.start(run_dir, mounts, bind=bind, port=args["port"], watch_pid=playbook_pid())
            url = fc.host_url(address, state["port"])
        except fc.FleetCacheError as exc:
            result.update(failed=True, msg=f"{host}: {exc}")
            return result
        result.update(url=url, bind=bind, port=state["port"], reused=state["reused"], pid=state["pid"])
        return result
