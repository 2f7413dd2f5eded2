# Copyright: (c) 2026, gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Can the run write what it must on a host? Asked first, once, before any other preflight gate.

An SSH user without root (no ``ansible_become``) used to be refused at the lock as if another run held it, and the
report then failed on the node-exporter textfile: one look at the paths the run writes names the real cause.
"""

from __future__ import annotations

import os
import pwd


def current_user() -> tuple[str, int]:
    """The effective user's name (its uid when it has none) and uid."""
    uid = os.geteuid()
    try:
        return pwd.getpwuid(uid).pw_name, uid
    except KeyError:
        return str(uid), uid


def nearest_existing(path: str, exists=None) -> str:
    """The path itself, or the first of its parents that exists (where a missing folder would be created)."""
    exists = exists or os.path.exists
    current = os.path.abspath(path)
    while not exists(current) and os.path.dirname(current) != current:
        current = os.path.dirname(current)
    return current


def unwritable(paths: dict, access=None, exists=None) -> list[dict]:
    """Each path (label -> path; an empty path is not written) the current user cannot write or create."""
    access = access or os.access
    found = []
    for label, path in paths.items():
        if not path:
            continue
        folder = nearest_existing(path, exists)
        if not access(folder, os.W_OK | os.X_OK):
            found.append({"label": label, "path": path, "denied_at": folder})
    return found


def refusal(host: str, user: str, uid: int, become, denied: list[dict]) -> str:
    """The refusal naming the user, the paths and the fix; "" when every path can be written."""
    if not denied:
        return ""
    how = {True: "with become", False: "without become (ansible_become is off)"}.get(become, "")
    where = "; ".join(
        f"{d['label']} {d['path']}"
        + ("" if d["denied_at"] == d["path"] else f" (cannot create it under {d['denied_at']})")
        for d in denied
    )
    return (
        f"{host}: the run connects as user {user} (uid {uid}){' ' + how if how else ''} and cannot write {where}: "
        f"permission denied. Fix: set ansible_become: true for this host (the run must write these paths as root), "
        f"or give {user} write access to them. Nothing was changed."
    )
