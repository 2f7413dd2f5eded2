# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Facts about the controller process that only an action plugin can know."""

from __future__ import annotations

import os


def playbook_pid() -> int:
    """Pid of the ansible-playbook process: task workers are forked from it."""
    pid = os.getpid()
    parent = os.getppid()
    # In a worker the parent is ansible-playbook; in the main process (no fork) it is the process itself.
    try:
        with open(f"/proc/{parent}/cmdline", "rb") as handle:
            cmdline = handle.read()
    except OSError:
        return pid
    return parent if b"ansible" in cmdline or b"python" in cmdline else pid


def profile_and_folder(args, task_vars, template, host) -> tuple:
    """The profile and the controller folder an action works with: its own arguments, else the play's
    ``gpufleet_stack`` (role stack) and ``gpufleet_controller_dir``. Returns (profile, folder, error or None)."""

    def var(name):
        value = task_vars.get(name)
        return template(value) if value is not None else None

    profile = args.get("profile") or var("gpufleet_stack")
    folder = args.get("controller_dir") or var("gpufleet_controller_dir")
    if not profile:
        return None, None, f"{host}: no profile; run role gpufleet.upgrade.stack first or pass profile"
    if not folder:
        return (
            None,
            None,
            f"{host}: set gpufleet_controller_dir (where locks and wheels are kept) or pass controller_dir",
        )
    return profile, folder, None
