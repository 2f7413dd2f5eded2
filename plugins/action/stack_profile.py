# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin: load and validate a stack profile on the controller and publish it as gpufleet_stack."""

from __future__ import annotations

from ansible.plugins.action import ActionBase

from ansible_collections.gpufleet.upgrade.plugins.plugin_utils._profile import ProfileError, host_settings, load_profile

ARGUMENT_SPEC = {
    "name": {"type": "str"},
    "path": {"type": "path"},
    "search_dirs": {"type": "list", "elements": "path", "default": []},
    "index_urls": {"type": "dict", "default": {}},
    "redist_url": {"type": "str"},
    # The host's own settings (inventory), else the profile's: published beside the profile, one task for all three.
    "serving_port": {"type": "raw"},
    "gpu_required": {"type": "raw"},
}


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        dummy, args = self.validate_argument_spec(
            argument_spec=ARGUMENT_SPEC, mutually_exclusive=[("name", "path")], required_one_of=[("name", "path")]
        )
        host = (task_vars or {}).get("inventory_hostname", "controller")
        try:
            profile = load_profile(
                name=args["name"],
                path=args["path"],
                search_dirs=args["search_dirs"],
                index_urls=args["index_urls"],
                redist_url=args["redist_url"],
            )
        except ProfileError as exc:
            result.update(failed=True, msg=f"{host}: {exc}")
            return result
        try:
            facts = host_settings(profile, args["serving_port"], args["gpu_required"])
        except ValueError as exc:
            result.update(failed=True, msg=f"{host}: {exc}")
            return result
        result.update(changed=False, profile=profile, ansible_facts={"gpufleet_stack": profile, **facts})
        return result
