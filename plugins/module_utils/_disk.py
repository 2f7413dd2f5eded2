# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""How much disk the new venv needs, and what a full disk says: one estimate for preflight's disk gate (filter
``disk_gate``, on the controller) and for a build that ran out of space on the host (module ``venv_build``)."""

from __future__ import annotations

import os
import subprocess

GIB = 1 << 30


def lock_installed_bytes(lock) -> tuple:
    """(bytes, wheels) the lock's venv takes installed, or (None, missing) when a wheel of it has no installed_size
    (the controller did not have it at hand)."""
    entries = list((lock or {}).get("packages") or []) + list((lock or {}).get("tools") or [])
    if not entries:
        return None, 0
    sizes = [e.get("installed_size") for e in entries]
    missing = sum(1 for s in sizes if not isinstance(s, int))
    if missing:
        return None, missing
    return sum(sizes), len(entries)


def venv_need(lock, current_bytes: int, set_bytes: int, factor: float) -> tuple:
    """(bytes needed for the new venv, how they were sized)."""
    if set_bytes > 0:
        return set_bytes, "as preflight_venv_free_bytes sets"
    installed, count = lock_installed_bytes(lock)
    if installed is not None:
        return int(installed * factor), (
            f"from the lock {lock.get('venv_name', '')}: {count} wheels, {installed} bytes installed, times {factor}"
        )
    why = f"{count} wheel(s) of the lock without an installed size" if count else "no lock yet"
    return int(current_bytes * factor), f"from the current venv ({current_bytes} bytes, times {factor}; {why})"


def du_bytes(path) -> int:
    """``du -sb`` of ``path``, the size the disk gate measures the current venv by; 0 when it cannot tell."""
    try:
        # pylint: disable-next=ansible-bad-function
        out = subprocess.run(["du", "-sb", path], capture_output=True, text=True, timeout=600, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0
    size = (out.split() or ["0"])[0]
    return int(size) if size.isdigit() else 0


def no_space(host, no_space_seen, lock, current, factor, settings) -> tuple:
    """(error, fix) of a build that ran out of space: ``no_space_seen`` is the build's ``no_space`` answer
    (``mount``, ``free_bytes``, ``seen``: the path that could not be written); the need is the disk gate's estimate
    for the new venv; ``settings`` maps a folder to the variable that moves it (the first that holds ``seen``)."""
    installed, _count = lock_installed_bytes(lock)
    need, _sized = venv_need(lock, du_bytes(current) if installed is None and current else 0, 0, factor)
    mount, free = no_space_seen["mount"], int(no_space_seen["free_bytes"])
    error = f"no space left on {mount} on {host}: need {need / GIB:.2f} GiB, free {free / GIB:.2f} GiB"
    seen = os.path.join(no_space_seen.get("seen") or mount, "")
    setting = next((v for folder, v in settings if folder and seen.startswith(os.path.join(folder, ""))), None)
    fix = f"free space on {mount} (old venvs, old toolkits, caches)" + (
        f" or move {setting} to a larger disk" if setting else ""
    )
    return error, fix
