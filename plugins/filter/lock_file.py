# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters over the fleet's lock file: lock_entry (a host's entry), recorded_lock (the lock a host last applied).

Each filter is documented in ``<name>.yml`` beside this file; the logic is ``plugin_utils/_lock_file.py``,
unit-tested without Ansible.
"""

from __future__ import annotations

import functools

from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _lock_file as lf


def _filter(function):
    """The filter's errors as AnsibleFilterError; the message already names the host, the value and the fix."""

    @functools.wraps(function)
    def run(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except lf.LockFileError as exc:
            raise AnsibleFilterError(str(exc)) from exc

    return run


@_filter
def lock_entry(taken, platform, python, host="host"):
    """``taken``: the result of action wheel_lock (or its entries); the entry a host of ``platform``/``python``
    installs."""
    entries = taken.get("entries") if isinstance(taken, dict) else taken
    return lf.select_entry({"entries": entries or []}, platform, str(python), host)


@_filter
def recorded_lock(located, profile):
    """``located``: venv_host.py locate's answer (with the state path); the lock the host's last upgrade applied, or
    a lock without packages whose ``no_lock`` says why there is none."""
    return lf.recorded_lock((located or {}).get("recorded"), profile)


class FilterModule:
    def filters(self):
        return {f.__name__: f for f in (lock_entry, recorded_lock)}
