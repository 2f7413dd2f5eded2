# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What every drain provider shares: the wait options, a bounded wait, drain records. Pure logic, no Ansible.

A drain is three steps: take the host out of rotation, wait until it is idle (bounded: a host whose work never ends
must fail the run with what was still running, not hang it), and put it back. The providers (``_drain_haproxy``,
``_drain_slurm``) differ in how they ask; the wait is the same.
"""

from __future__ import annotations

import os
import time

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _state

# The options every drain module shares, documented once in doc fragment gpufleet.upgrade.drain_wait.
WAIT_ARGS = dict(
    wait=dict(type="bool", default=True),
    timeout_s=dict(type="float", default=600),
    interval_s=dict(type="float", default=1.0),
)


def argument_spec(**own):
    """A drain module's argument spec: its own options and the shared wait options (a fresh copy each call)."""
    return {**own, **{name: dict(spec) for name, spec in WAIT_ARGS.items()}}


class DrainError(Exception):
    """A drain step that cannot be done; the message names what was seen and the fix."""


class DrainTimeout(DrainError):
    """The host did not become idle in time; ``last`` is what the last look saw."""

    def __init__(self, message, last=None, waited_s=0.0):
        super().__init__(message)
        self.last = last
        self.waited_s = waited_s


def poll_until(look, done, timeout_s, interval_s, clock=time.monotonic, sleep=time.sleep):
    """Call ``look()`` until ``done(seen)`` holds; return ``(seen, waited_s)``.

    The first look happens at once; the last one happens at the deadline, so a host that became idle just in
    time is not failed. Raises DrainTimeout carrying the last look when the deadline passes.
    """
    start = clock()
    deadline = start + max(0.0, float(timeout_s))
    while True:
        seen = look()
        now = clock()
        if done(seen):
            return seen, round(now - start, 3)
        if now >= deadline:
            raise DrainTimeout("timed out", last=seen, waited_s=round(now - start, 3))
        sleep(max(0.0, min(float(interval_s), deadline - now)))


# --------------------------------------------------------------------------- drains found
# A host out of service before the run (an operator's drain or maintenance, a Slurm node down or drained for a
# hardware ticket) is someone else's: the run never puts it back, and upgrades it only when told to.
FOUND_DRAINED = ("refuse", "upgrade")


def drained_by(action, ours, out):
    """Who has the host out of service after a drain call: ``run`` (this call took it out), ``gpufleet`` (an earlier
    run that never put it back), ``other`` (found so before the run), ``""`` (in service)."""
    if action is not None:
        return "run"
    if not out:
        return ""
    return "gpufleet" if ours else "other"


def found_drained_message(host, what):
    """The refusal of a host found out of service by someone else (found_drained=refuse)."""
    return (
        f"{host}: {what} before this run, not by gpufleet; it stays so and is not upgraded (nothing was drained or "
        "undrained); fix: set gpufleet_upgrade_drained_hosts=true to upgrade it anyway (it stays out of service after "
        "the upgrade and after a rollback), or put it back into service first"
    )


# --------------------------------------------------------------------------- drain records
# A provider without a place for a reason (HAProxy) keeps one small file per server where the drain runs: written
# before the drain is sent, removed once the server is back. A record left by a killed run tells the next run that
# gpufleet took the server out (so it puts it back); a drained server without a record was drained by someone
# else, and stays drained.


def record_path(folder, provider, *names):
    """``<folder>/<provider>-<name>-<name>.json``, each name reduced to characters safe in a file name."""
    safe = ["".join(c if c.isalnum() or c in "._" else "_" for c in str(n)) for n in names]
    return os.path.join(folder, "-".join([provider, *safe]) + ".json")


def read_record(path):
    try:
        return _state.read_json(path)
    except _state.StateError as exc:
        raise DrainError(
            f"drain record {path} is unreadable: {exc}; fix: remove it once the server is as it should be"
        ) from None


def write_record(path, doc):
    _state.write_json_atomic(path, doc)


def remove_record(path):
    if os.path.exists(path):
        os.unlink(path)
