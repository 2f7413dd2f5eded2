# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin: say, once at a run's start, each host's value of some variables and where it came from."""

from __future__ import annotations

import os

from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _assumptions

# The defaults a host without the variable gets: role stack's (the role every play loads first).
STACK_DEFAULTS = os.path.join(os.path.dirname(__file__), "..", "..", "roles", "stack", "defaults", "main.yml")

display = Display()


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        dummy, args = self.validate_argument_spec(
            argument_spec={
                "names": {"type": "list", "elements": "str", "required": True},
                "hosts": {"type": "list", "elements": "str", "required": True},
            }
        )
        task_vars = task_vars or {}
        extra_vars = self._task.get_variable_manager().extra_vars
        defaults = self._loader.load_from_file(STACK_DEFAULTS, trusted_as_template=True) or {}
        assumed = {}
        for host in args["hosts"]:
            host_vars = task_vars["hostvars"][host]
            assumed[host] = {}
            for name in args["names"]:
                source = _assumptions.source_of(name, host_vars, extra_vars)
                raw = defaults.get(name, "(unset)") if source == "default" else host_vars[name]
                value = self._templar.template(raw)
                assumed[host][name] = (str(value), source if source != "default" else "default of role stack")
        result["lines"] = _assumptions.lines(assumed, args["names"])
        for line in result["lines"]:
            display.display(f"gpufleet: assumed {line}")
        result["changed"] = False
        return result
