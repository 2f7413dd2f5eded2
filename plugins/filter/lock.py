# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters over venv locks: lock_pins, lock_differences, lock_tooling_needed, lock_requirements, lock_package_lists.

Each filter is documented in ``<name>.yml`` beside this file (the ansible-core convention for a file of several
filters); the logic is ``plugin_utils/_lock.py``, unit-tested without Ansible.
"""

from __future__ import annotations

import functools

from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _lock


def _filter(function):
    """The filter's errors as AnsibleFilterError, prefixed with the filter's name."""

    @functools.wraps(function)
    def run(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except _lock.LockError as exc:
            raise AnsibleFilterError(f"{function.__name__}: {exc}") from exc

    return run


@_filter
def lock_pins(value, skip=()):
    return _lock.pins(value, skip)


@_filter
def lock_differences(expected, installed, skip=()):
    return _lock.differences(expected, installed, skip)


@_filter
def lock_tooling_needed(value, tooling, check_output):
    return _lock.tooling_needed(value, tooling, check_output)


@_filter
def lock_requirements(entries, hashes=True, comment_prefix="", header=""):
    return _lock.requirements_text(entries, hashes=hashes, comment_prefix=comment_prefix, header=header)


@_filter
def lock_package_lists(installed, entries):
    return _lock.package_lists(installed, entries)


class FilterModule:
    def filters(self):
        return {
            f.__name__: f
            for f in (lock_pins, lock_differences, lock_tooling_needed, lock_requirements, lock_package_lists)
        }
