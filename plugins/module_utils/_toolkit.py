# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""CUDA toolkits on a host: find them, read their version, judge a target path, plan the /usr/local/cuda link.

Plain functions over the file system and command output, no Ansible.
"""

from __future__ import annotations

import json
import os
import re

TOOLKIT_DIR_RE = re.compile(r"^cuda-([0-9]+\.[0-9]+)$")
NVCC_RE = re.compile(r"release ([0-9]+\.[0-9]+), V([0-9]+\.[0-9]+\.[0-9]+)")
MARKER = ".gpufleet-install.json"
# Files whose presence makes a directory a toolkit even without version.json (apt installs of old releases).
TOOLKIT_SIGNS = ("version.json", "bin/nvcc", "include/cuda_runtime.h", "targets")


def parse_nvcc_version(text: str) -> dict | None:
    """`nvcc --version` -> {"release": "13.0", "version": "13.0.88"}."""
    match = NVCC_RE.search(text or "")
    if not match:
        return None
    return {"release": match.group(1), "version": match.group(2)}


def read_version_json(path: str) -> dict | None:
    try:
        with open(os.path.join(path, "version.json"), encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def stat_signature(path: str) -> list:
    """What a write to a file changes: size, mtime, ctime (set by the kernel on every change; no call sets it back)
    and inode (a replaced file). The install marker records it per file; the host model hashes a file only when its
    signature moved since (module host_state, toolkit verify ``stat``)."""
    st = os.stat(path)
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def read_marker(path: str) -> dict | None:
    try:
        with open(os.path.join(path, MARKER), encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


def summarize_version_json(data: dict | None) -> tuple[str | None, dict]:
    """-> (release such as "13.0.2", {component: version})."""
    if not data:
        return None, {}
    release = (data.get("cuda") or {}).get("version")
    components = {k: v.get("version") for k, v in data.items() if k != "cuda" and isinstance(v, dict)}
    return release, components


def is_toolkit(path: str) -> bool:
    return os.path.isdir(path) and any(os.path.exists(os.path.join(path, sign)) for sign in TOOLKIT_SIGNS)


def find_toolkits(root: str) -> list[str]:
    """Toolkit directories named cuda-X.Y under root (the link /usr/local/cuda itself excluded)."""
    try:
        names = os.listdir(root)
    except OSError:
        return []
    out = []
    for name in sorted(names):
        path = os.path.join(root, name)
        if TOOLKIT_DIR_RE.match(name) and not os.path.islink(path) and os.path.isdir(path):
            out.append(path)
    return out


def target_status(path: str, release: str, components) -> dict:
    """Judge the install target: absent, present, incomplete, other_release, foreign, not_a_toolkit."""
    if not os.path.lexists(path):
        return {"status": "absent", "missing": list(components)}
    if os.path.islink(path) or not os.path.isdir(path):
        return {
            "status": "not_a_toolkit",
            "reason": "it is a link or a file, not a directory",
            "missing": list(components),
        }
    data = read_version_json(path)
    if data is None:
        reason = (
            "it holds no version.json" if is_toolkit(path) else "it holds no toolkit (no version.json, no bin/nvcc)"
        )
        if not os.listdir(path):
            return {"status": "absent", "missing": list(components), "empty": True}
        return {"status": "not_a_toolkit", "reason": reason, "missing": list(components)}
    have_release, have = summarize_version_json(data)
    missing = [c for c in components if c not in have]
    managed = read_marker(path) is not None
    if have_release != release:
        status = "other_release" if managed else "foreign"
        return {"status": status, "release": have_release, "missing": missing, "managed": managed}
    if missing:
        return {
            "status": "incomplete" if managed else "foreign",
            "release": have_release,
            "missing": missing,
            "managed": managed,
        }
    return {"status": "present", "release": have_release, "missing": [], "managed": managed}


def parse_alternatives(text: str) -> dict | None:
    """`update-alternatives --query NAME` -> {"mode", "value", "choices": [{"path", "priority"}]}."""
    if not text or "Name:" not in text:
        return None
    out = {"mode": None, "value": None, "link": None, "choices": []}
    current = None
    for line in text.splitlines():
        key, dummy, value = line.partition(":")
        value = value.strip()
        if key == "Status":
            out["mode"] = value
        elif key == "Value":
            out["value"] = None if value == "none" else value
        elif key == "Link":
            out["link"] = value
        elif key == "Alternative":
            current = {"path": value, "priority": None}
            out["choices"].append(current)
        elif key == "Priority" and current is not None:
            current["priority"] = int(value)
    return out


def link_state(link: str) -> dict:
    """Where the link points (one hop) and what it resolves to in the end."""
    if not os.path.lexists(link):
        return {"path": link, "exists": False, "target": None, "resolved": None}
    if not os.path.islink(link):
        return {"path": link, "exists": True, "is_link": False, "target": None, "resolved": os.path.realpath(link)}
    return {
        "path": link,
        "exists": True,
        "is_link": True,
        "target": os.readlink(link),
        "resolved": os.path.realpath(link),
    }


def resolve_home(cuda_home: str, toolkits: list[str]) -> str | None:
    """The toolkit directory a CUDA_HOME value ends up in, or None."""
    real = os.path.realpath(cuda_home)
    for path in toolkits:
        if os.path.realpath(path) == real:
            return path
    return real if is_toolkit(real) else None


def link_plan(policy: str, recorded: str | None, home: str) -> str | None:
    """The toolkit /usr/local/cuda must resolve to after the install, None for 'no link'.

    keep: where it resolved before the install (packages' scripts may have moved it since).
    target: the new toolkit.
    """
    if policy == "target":
        return home
    if policy == "keep":
        return recorded
    raise ValueError(f"unknown link policy {policy!r}")
