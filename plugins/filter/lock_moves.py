# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filter lock_moves: whether a plan made now moves a host off the lock it runs only because an index changed.

Documented in ``lock_moves.yml`` beside this file; the logic is ``plugin_utils/_lock_moves.py``, unit-tested without
Ansible.
"""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _lock_file as lf
from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _lock_moves as lm


def lock_moves(located, plan, profile, host="host", controller_dir=None, accept=False):
    """``located``: venv_host.py locate's answer (with the state path); ``plan``: the planner's lock."""
    try:
        return lm.judge(located, plan or {}, profile, host, controller_dir, bool(accept))
    except lf.LockFileError as exc:
        raise AnsibleFilterError(f"lock_moves: {exc}") from exc


class FilterModule:
    def filters(self):
        return {"lock_moves": lock_moves}
