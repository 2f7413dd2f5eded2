# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin of upgrade_lock: name the holder (controller, ansible-playbook pid) and check whether the
holder of an existing lock still runs -- both only knowable on the controller -- then let the module decide."""

from __future__ import annotations

import datetime
import socket

from ansible.plugins.action import ActionBase

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _state as st
from ansible_collections.gpufleet.upgrade.plugins.plugin_utils._controller import playbook_pid

MODULE = "gpufleet.upgrade.upgrade_lock"


class ActionModule(ActionBase):
    TRANSFERS_FILES = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = dict(self._task.args)
        args.pop("holder", None)
        if args.get("state", "present") != "present":
            result.update(self._execute_module(module_name=MODULE, module_args=args, task_vars=task_vars))
            return result
        query = self._execute_module(
            module_name=MODULE,
            module_args={"path": args.get("path", "/var/lib/gpufleet/upgrade.lock"), "state": "query"},
            task_vars=task_vars,
        )
        if query.get("failed"):
            result.update(query)
            return result
        pid = playbook_pid()
        controller = socket.gethostname()
        holder = {
            "pid": pid,
            "pid_start": st.process_start(pid),
            "controller": controller,
            "started": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            "alive": None,
        }
        previous = query.get("lock") or {}
        if previous and previous.get("controller") == controller:
            holder["alive"] = st.process_alive(int(previous["pid"]), previous.get("pid_start"))
        args["holder"] = holder
        result.update(self._execute_module(module_name=MODULE, module_args=args, task_vars=task_vars))
        return result
