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
