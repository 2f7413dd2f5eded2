# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters over backup manifests: restore_differences.

Documented in ``<name>.yml`` beside this file; the logic is ``module_utils/_backup.py``, unit-tested without
Ansible.
"""

from __future__ import annotations

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _backup


def restore_differences(backed_up, now, compare_lock=True):
    return _backup.restore_differences(backed_up or {}, now or {}, bool(compare_lock))


class FilterModule:
    def filters(self):
        return {"restore_differences": restore_differences}
