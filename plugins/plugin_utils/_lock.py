# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Venv locks as the roles use them: pins, differences, requirements text and diff lists. Controller side only.

Parsing is ``_backup.parse_lock`` (the one parser of lock and ``pip freeze`` text); this module shapes its result
for tasks. The filter plugin ``lock.py`` is a thin wrapper that turns LockError into AnsibleFilterError.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _backup as bk


class LockError(Exception):
    """Input that is not a lock; the message names the value and the fix."""


def as_text(value, what) -> str:
    """A lock or freeze given as text, or as its lines (``stdout_lines``, a list of pins)."""
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)) and all(isinstance(line, str) for line in value):
        return "\n".join(value)
    raise LockError(
        f"{what} must be the text of a lock or of pip freeze, or a list of its lines, not {type(value).__name__}"
        f" {value!r:.80}; fix: pass the slurped/b64decoded file or the command's stdout"
    )


def parse(value, what, skip=()) -> list:
    """``_backup.parse_lock`` of a text or line list, without the packages named in ``skip`` (PEP 503 names)."""
    try:
        packages = bk.parse_lock(as_text(value, what))
    except bk.BackupError as exc:
        raise LockError(
            f"{what}: {exc}; fix: a lock holds one 'name==version' line per package (pip freeze output of a venv"
            " without editable or local-path installs)"
        ) from exc
    dropped = {bk.canonical_name(name) for name in skip}
    return [p for p in packages if bk.canonical_name(p["name"]) not in dropped]


def pins(value, skip=(), what="lock") -> list:
    """Sorted ``name==version`` of every package (names PEP 503), e.g. the exact requirements to reinstall."""
    out = []
    for package in parse(value, what, skip):
        if package["version"] is None:
            # An index cannot serve a URL install: reinstalling it "by version" would install something else.
            raise LockError(
                f"{what}: {package['line']!r} installs {package['name']} from a URL, not a version an index serves;"
                f" fix: pin it as {bk.canonical_name(package['name'])}==VERSION, or skip it"
            )
        out.append(f"{bk.canonical_name(package['name'])}=={package['version']}")
    return sorted(out)


# `uv pip check`'s line for a requirement nothing installed satisfies.
_NOT_INSTALLED = re.compile(r"^The package `[^`]+` requires `([A-Za-z0-9._-]+)[^`]*`, but it's not installed$")


def tooling_needed(value, tooling, check_output, what="lock") -> list:
    """Pins of the lock's venv tooling (pip, setuptools, wheel: ``tooling``) that the packages installed without it
    require: the names `uv pip check` (``check_output``) reports required but not installed, at the version the lock
    pins. A venv rebuilt from a lock leaves tooling out (a seeded pip is no requirement, and an index may not carry
    it) unless something needs it: torch requires setuptools."""
    wanted = {bk.canonical_name(name) for name in tooling}
    required = set()
    for line in as_text(check_output, "uv pip check output").splitlines():
        match = _NOT_INSTALLED.match(line.strip())
        if match and bk.canonical_name(match.group(1)) in wanted:
            required.add(bk.canonical_name(match.group(1)))
    return [pin for pin in pins(value, what=what) if pin.split("==", 1)[0] in required]


def differences(expected, installed, skip=()) -> list:
    """Human-readable problems between two locks (``name: expected X, found Y``); empty when they agree."""
    return bk.lock_differences(parse(expected, "expected lock", skip), parse(installed, "installed lock", skip))


def _entries(entries, keys) -> list:
    if not isinstance(entries, (list, tuple)):
        raise LockError(
            f"lock entries must be a list of packages, not {type(entries).__name__} {entries!r:.80};"
            " fix: pass gpufleet_wheel_lock.packages or gpufleet_wheel_lock.tools"
        )
    for number, entry in enumerate(entries, start=1):
        missing = [key for key in keys if not isinstance(entry, Mapping) or not entry.get(key)]
        if missing:
            raise LockError(
                f"lock entry {number} {entry!r:.120} lacks {', '.join(missing)}; fix: pass the packages or tools of a"
                " lock written by gpufleet.upgrade.wheel_plan (or hashes=false for pins without sha256)"
            )
    # Case-insensitive like Jinja's sort, which wrote these files before: existing hosts see the same bytes.
    return sorted(entries, key=lambda e: str(e["name"]).lower())


def requirements_text(entries, hashes=True, comment_prefix="", header="") -> str:
    """The requirements file uv/pip install with ``--require-hashes``: one ``name==version --hash=sha256:...``
    line per entry, sorted by name, each line after ``comment_prefix`` (``# tool: `` keeps tools out of the
    serving venv's lock yet on record), a ``# header`` line first when given. Empty entries give no lines."""
    keys = ("name", "version", "sha256") if hashes else ("name", "version")
    lines = [f"# {header}\n"] if header else []
    for entry in _entries(entries, keys):
        line = f"{entry['name']}=={entry['version']}"
        if hashes:
            line += f" --hash=sha256:{entry['sha256']}"
        lines.append(f"{comment_prefix}{line}\n")
    return "".join(lines)


def package_lists(installed, entries) -> dict:
    """``{before, after}`` lists of ``name==version`` for a diff: the current venv's packages vs. the lock's."""
    if installed is None:
        installed = []  # no current venv: everything is new
    if not isinstance(installed, (list, tuple)) or not all(isinstance(p, str) for p in installed):
        raise LockError(
            f"installed packages must be a list of 'name==version', not {installed!r:.80};"
            " fix: pass the host inspection's installed list"
        )
    after = [f"{bk.canonical_name(e['name'])}=={e['version']}" for e in _entries(entries, ("name", "version"))]
    return {"before": sorted(installed, key=str.lower), "after": sorted(after, key=str.lower)}
