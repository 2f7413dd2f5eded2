# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the controller's wheel actions (wheel_plan, wheel_lock) do before their own work: validate the arguments,
check that packaging is importable, and find the profile and the controller folder with its wheelhouse."""

from __future__ import annotations

import os
from dataclasses import dataclass

from ansible.module_utils.basic import missing_required_lib
from ansible.plugins.action import ActionBase

from ansible_collections.gpufleet.upgrade.plugins.plugin_utils._controller import profile_and_folder
from ansible_collections.gpufleet.upgrade.plugins.plugin_utils._wheels import HAS_PACKAGING, PACKAGING_IMPORT_ERROR


@dataclass
class Start:
    """An action's validated arguments and where it works."""

    args: dict
    host: str
    profile: dict
    controller_dir: str

    @property
    def wheelhouse(self) -> str:
        return os.path.join(self.controller_dir, "wheelhouse")


class WheelAction(ActionBase):
    """Base of the controller-side wheel actions; a subclass sets ARGUMENT_SPEC (its module's)."""

    TRANSFERS_FILES = False
    _requires_connection = False
    ARGUMENT_SPEC: dict = {}

    def start(self, result: dict, task_vars: dict | None) -> Start | None:
        """The action's ``Start``, or None with ``result`` marked failed (the message names the host and the fix)."""
        task_vars = task_vars or {}
        _validation, args = self.validate_argument_spec(argument_spec=self.ARGUMENT_SPEC)
        host = task_vars.get("inventory_hostname", "controller")
        if not HAS_PACKAGING:
            # The action runs on the controller: the library is missing from the Python that runs ansible.
            self.fail(result, f"{host}: {missing_required_lib('packaging')}")
            result["exception"] = PACKAGING_IMPORT_ERROR
            return None
        profile, controller_dir, error = profile_and_folder(args, task_vars, self._templar.template, host)
        if error:
            self.fail(result, error)
            return None
        return Start(args, host, profile, controller_dir)

    @staticmethod
    def fail(result: dict, msg: str) -> dict:
        result.update(failed=True, msg=msg)
        return result
