# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Whether a plan made now would move a host off the lock it runs only because an index changed. Controller side.

An upgrade without a lock file plans the wheels again. For a host that runs the lock its last upgrade recorded
(state file record and ``<serving_root>/locks/<venv_name>.txt``, read by ``venv_host.py locate``; ``current`` is that
lock's verified venv), a plan of the same profile whose wheels differ from that lock moves it because the indexes
changed since: a newer or older build, a wheel republished under the same file name with other bytes, a dependency
added or removed. Such a host is refused before anything changes, with the changes and the fix (plan and apply a
lock file, or accept the new plan); a host that records no lock of this profile or runs another venv is upgraded as
before. An edit of the profile under the same name does not let a move through unseen: the refusal names it (from
this controller's copy of the old lock) and the operator takes the plan. The comparison is ``_lock_file.diff`` over
the two locks, each change classified here.
"""

from __future__ import annotations

import os
import re

from ansible_collections.gpufleet.upgrade.plugins.module_utils._backup import canonical_name
from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _lock_file as lf

try:
    from packaging.version import InvalidVersion, Version
except ImportError:  # pragma: no cover - the planner needs packaging anyway
    Version = None
    InvalidVersion = ValueError

# How a package of the plan differs from the host's lock.
NEWER, OLDER, REPUBLISHED, OTHER_FILE, ADDED, REMOVED = (
    "newer",
    "older",
    "republished",
    "other file",
    "added",
    "removed",
)
# What the judgement found; only MOVED refuses (unless the operator accepts the new plan).
SAME, NO_LOCK, NOT_RUNNING, SAME_WHEELS, MOVED = ("same", "no lock", "not running its lock", "same wheels", "moved")
_PIN = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*(\S+)\s+--hash=sha256:([0-9a-fA-F]{64})\s*$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")
FIX = (
    "Fix: plan a lock file and apply it (playbooks/plan.yml, then playbooks/upgrade.yml, with -e"
    " gpufleet_lock_file=<file>), or take the new plan with -e gpufleet_accept_new_plan=true"
)


def recorded_hashes(text: str | None) -> dict:
    """``{canonical name: sha256}`` of the host's lock text (``name==version --hash=sha256:...`` lines as
    ``_lock.requirements_text`` writes them; comments, ``# tool:`` lines included, are not the venv's)."""
    out = {}
    for line in (text or "").splitlines():
        match = None if line.lstrip().startswith("#") else _PIN.match(line)
        if match:
            out[canonical_name(match.group(1))] = match.group(3).lower()
    return out


def runs_lock(located: dict, lock: dict) -> bool:
    """Whether ``current`` is a verified venv of ``lock`` (its own or a repair of it): the host runs that lock."""
    current = (located or {}).get("current")
    if not current or not lock.get("hash"):
        return False
    folder = os.path.basename(os.path.normpath(current))
    verified = {v.get("name"): v.get("verified") for v in (located or {}).get("venvs") or []}
    return folder.split(".repair-", 1)[0] == lock.get("venv_name") and verified.get(folder) == lock["hash"]


def planned_file(controller_dir: str | None, venv_name: str) -> dict | None:
    """The lock file this controller wrote when it planned ``venv_name`` (``<controller_dir>/locks/<venv_name>
    .lock.yml``, action wheel_plan), or None. Only that folder is read: the venv name comes from the host."""
    if not controller_dir or not _NAME.match(venv_name or ""):
        return None
    path = os.path.join(os.path.expanduser(controller_dir), "locks", f"{venv_name}.lock.yml")
    if not os.path.isfile(path):
        return None
    try:
        return lf.read(path)
    except lf.LockFileError:
        return None


def _entry_of(doc: dict | None, venv_name: str, digest: str) -> dict | None:
    for entry in (doc or {}).get("entries") or []:
        if entry.get("venv_name") == venv_name and entry.get("hash") == digest:
            return entry
    return None


def _packages(packages) -> list:
    return [
        {
            "name": canonical_name(p["name"]),
            "version": str(p["version"]),
            "sha256": (p.get("sha256") or "").lower() or None,
            "filename": p.get("filename"),
        }
        for p in packages or []
    ]


def _version(text):
    try:
        return Version(text) if Version else None
    except InvalidVersion:
        return None


def classify(old: list, new: list) -> list:
    """The changes from the host's packages ``old`` to the plan's ``new`` (each ``{name, version, sha256,
    filename}``; an old sha256 or file name may be None: not known), in name order: ``{kind, name, old, new}``.
    A package whose version is the same and whose sha256 is not known on one side is not a change."""
    label = {"platform": "host", "python": ""}
    change = lf.diff(
        {"profile": {}, "entries": [dict(label, packages=old)]},
        {"profile": {"hash": ""}, "entries": [dict(label, packages=new)]},
    )["entries"][0]
    out = [{"kind": ADDED, "name": p["name"], "old": None, "new": p} for p in change["added"]]
    out += [{"kind": REMOVED, "name": p["name"], "old": p, "new": None} for p in change["removed"]]
    for c in change["changed"]:
        before, after = c["old"], c["new"]
        if before["version"] == after["version"]:
            if not before["sha256"] or not after["sha256"]:
                continue
            known = before.get("filename")
            kind = OTHER_FILE if known and known != after.get("filename") else REPUBLISHED
        else:
            was, now = _version(before["version"]), _version(after["version"])
            kind = OLDER if was is not None and now is not None and now < was else NEWER
        out.append({"kind": kind, "name": c["name"], "old": before, "new": after})
    return sorted(out, key=lambda c: c["name"])


def change_line(change: dict) -> str:
    """One change in words; a republished wheel with both sha256 in full (the bytes a reviewer checks)."""
    old, new, kind = change["old"], change["new"], change["kind"]
    if kind == ADDED:
        return f"{change['name']} {new['version']} added"
    if kind == REMOVED:
        return f"{change['name']} {old['version']} removed"
    if kind == REPUBLISHED:
        same = "the same file name" if old.get("filename") else "the same version"
        return (
            f"{change['name']} {new['version']} republished ({new.get('filename') or 'its wheel'}: {same} with other"
            f" bytes, sha256 {old['sha256']} -> {new['sha256']})"
        )
    if kind == OTHER_FILE:
        return (
            f"{change['name']} {new['version']} from another file ({old['filename']} -> {new['filename']}, sha256"
            f" {old['sha256']} -> {new['sha256']})"
        )
    return f"{change['name']} {old['version']} -> {new['version']} ({'newer' if kind == NEWER else 'older'} build)"


def judge(located, plan, profile, host="host", controller_dir=None, accept=False) -> dict:
    """Whether the plan ``plan`` (the planner's lock) moves a host off the lock it runs only because an index
    changed. ``located``: ``venv_host.py locate``'s answer with ``recorded``; ``profile``: the loaded profile.

    Returns ``{status, changes, lines, notes, refuse, message}``: ``refuse`` when the host runs its recorded lock of
    this profile, the plan differs in its wheels and ``accept`` is false. ``notes`` say what else changed since that
    lock was planned, read from this controller's copy of it: the profile's content, the plan's platform."""
    located = located or {}
    record = located.get("recorded") or {}
    name = profile.get("name") if isinstance(profile, dict) else str(profile)
    result = {"status": SAME, "changes": [], "lines": [], "notes": [], "refuse": False, "message": ""}
    lock = lf.recorded_lock(record, name)
    if lock.get("no_lock"):
        return dict(result, status=NO_LOCK)
    if lock["hash"] == plan.get("hash"):
        return result
    if not runs_lock(located, lock):
        return dict(result, status=NOT_RUNNING)
    doc = planned_file(controller_dir, lock["venv_name"])
    entry = _entry_of(doc, lock["venv_name"], lock["hash"])
    files = {canonical_name(p["name"]): p.get("filename") for p in (entry or {}).get("packages") or []}
    hashes = recorded_hashes(record.get("lock_text"))
    old = [
        {
            "name": p["name"],
            "version": p["version"],
            "sha256": hashes.get(canonical_name(p["name"])),
            "filename": files.get(canonical_name(p["name"])),
        }
        for p in lock["packages"]
    ]
    changes = classify(_packages(old), _packages(plan.get("packages")))
    if not changes:
        return dict(result, status=SAME_WHEELS)
    lines = [change_line(c) for c in changes]
    notes = _notes(doc, entry, plan, profile)
    # The summary cuts a reason at 700 characters: the changes and the fix come first, one republished wheel fits.
    message = (
        f"{host}: the indexes changed since this host's lock {lock['venv_name']}, which it runs; the plan made now,"
        f" {plan.get('venv_name')}: {'; '.join(lines)}. {FIX}. Nothing was changed"
        + (f" ({'; '.join(notes)})" if notes else "")
    )
    return dict(result, status=MOVED, changes=changes, lines=lines, notes=notes, refuse=not accept, message=message)


def _notes(doc, entry, plan, profile) -> list:
    """What else changed since the host's lock was planned, as this controller's copy of it says: the profile's
    content (an edit under the same name: if it is what moves the wheels, the operator takes the plan) and the
    plan's platform (the batch's lowest glibc)."""
    if entry is None:
        return []
    notes = []
    was, now = doc["profile"].get("hash") or "", lf.profile_hash(profile) if isinstance(profile, dict) else ""
    if was != now:
        notes.append(f"the profile changed too since that lock was planned, hash {was[:12]} -> {now[:12]}")
    if entry.get("platform") != plan.get("platform"):
        notes.append(f"that lock was planned for {entry.get('platform')}, this plan for {plan.get('platform')}")
    return notes
