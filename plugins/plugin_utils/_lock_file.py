# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fleet's lock file: the reviewed wheel set a fleet runs. Controller side only.

``playbooks/plan.yml`` writes it (one entry per group of hosts: architecture and Python, each planned for the lowest
glibc of its group), the operator reviews and commits it, and ``upgrade.yml``, ``audit.yml`` and ``rollback.yml``
apply or judge exactly it (``gpufleet_lock_file``) without asking an index anything. The file is YAML with sorted
keys, entries and packages in a fixed order, so two plans of the same wheels give the same bytes and a review's
diff shows only what changed. The profile's hash inside it ties it to the profile it was planned from.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import tempfile
import urllib.error
import urllib.parse

import yaml
from ansible.module_utils.urls import open_url

from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _lock

SCHEMA = "gpufleet-lock-file/1"
# What a lock entry keeps of the planner's lock (``_wheel_plan.make_lock``): what hosts install and the rules it
# kept. The planner's candidate report is long and changes with every listing: it goes to the report beside the file.
ENTRY_KEYS = ("platform", "python", "hash", "hash12", "venv_name", "packages", "tools", "overrides", "lock_rules")
PACKAGE_KEYS = ("name", "version", "filename", "url", "sha256", "index", "size", "role")
# Written only where the planner knew them (lock files written before them lack them): who computed the hash
# (index, controller, uv) and what the wheel takes unpacked (preflight sizes the new venv by it).
OPTIONAL_PACKAGE_KEYS = ("sha256_source", "installed_size")
_PLATFORM = re.compile(r"^(?P<arch>[A-Za-z0-9_]+)-(?:manylinux_(?P<major>\d+)_(?P<minor>\d+)|linux)$")
HEADER = (
    "# gpufleet lock file: the wheel set the fleet runs, planned by playbooks/plan.yml.\n"
    "# Review it and commit it; apply it with\n"
    "#   ansible-playbook playbooks/upgrade.yml -e gpufleet_lock_file=<this file>\n"
)


class LockFileError(Exception):
    """A lock file that cannot be used as it is; the message names the value seen and the fix."""


# ---------------------------------------------------------------------------------------------------- profile hash


def profile_hash(profile: dict) -> str:
    """sha256 of the profile's content in canonical JSON, without where it was read from and without any URL: a
    site's mirrors (``gpufleet_index_urls``) may differ between planning and applying, and the lock pins every wheel
    by sha256 anyway. Comments and key order in the profile's file do not count; every value does."""

    def strip(value):
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k != "url"}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    doc = {k: v for k, v in profile.items() if k != "source"}
    return hashlib.sha256(json.dumps(strip(doc), sort_keys=True, default=str).encode()).hexdigest()


# ---------------------------------------------------------------------------------------------------- platforms


def parse_platform(platform: str) -> tuple:
    """``x86_64-manylinux_2_36`` -> ("x86_64", (2, 36)); ``ARCH-linux`` -> (ARCH, (0, 0)): glibc unknown."""
    match = _PLATFORM.match(platform or "")
    if not match:
        raise LockFileError(
            f"platform {platform!r} is not ARCH-manylinux_2_MINOR or ARCH-linux; fix: give the hosts' platform as"
            " the venv inspection reads it (e.g. x86_64-manylinux_2_36)"
        )
    if match.group("major") is None:
        return match.group("arch"), (0, 0)
    return match.group("arch"), (int(match.group("major")), int(match.group("minor")))


def plan_targets(hosts: dict, python: str | dict) -> list:
    """The (platform, Python) groups to plan for ``hosts`` ({host: platform}): one per architecture and Python,
    at the lowest glibc among its hosts (a wheel that fits that glibc fits every host of the group). ``python`` is
    one version for every host or {host: version}. Returns ``[{platform, python, hosts}]`` in a fixed order."""
    groups = {}
    for host, platform in sorted(hosts.items()):
        version = python[host] if isinstance(python, dict) else python
        arch, glibc = parse_platform(platform)
        group = groups.setdefault((arch, str(version)), {"glibc": glibc, "platform": platform, "hosts": []})
        if glibc < group["glibc"]:
            group["glibc"], group["platform"] = glibc, platform
        group["hosts"].append(host)
    return [{"platform": g["platform"], "python": key[1], "hosts": g["hosts"]} for key, g in sorted(groups.items())]


def select_entry(doc: dict, platform: str, python: str, host: str = "host") -> dict:
    """The entry of the lock file ``doc`` a host of ``platform`` and ``python`` installs: same architecture and
    Python, planned for a glibc no newer than the host's; of several, the newest such glibc."""
    arch, glibc = parse_platform(platform)
    fitting = []
    for entry in doc.get("entries") or []:
        e_arch, e_glibc = parse_platform(entry["platform"])
        if e_arch == arch and str(entry["python"]) == str(python) and e_glibc <= glibc:
            fitting.append((e_glibc, entry))
    if not fitting:
        have = ", ".join(f"{e['platform']} Python {e['python']}" for e in doc.get("entries") or []) or "none"
        raise LockFileError(
            f"{host}: the lock file has no entry for its platform {platform} and Python {python} (entries: {have});"
            " fix: run playbooks/plan.yml over an inventory that includes this host, review and commit the new lock"
            " file, then apply it. Nothing was changed"
        )
    return max(fitting, key=lambda pair: pair[0])[1]


# ---------------------------------------------------------------------------------------------------- document


def _package(package: dict) -> dict:
    out = {k: package.get(k) for k in PACKAGE_KEYS}
    out.update({k: package[k] for k in OPTIONAL_PACKAGE_KEYS if package.get(k) is not None})
    return out


def entry_from_lock(lock: dict) -> dict:
    """The lock file's entry of one planner lock: ``ENTRY_KEYS``, packages and tools in name order."""
    entry = {key: copy.deepcopy(lock.get(key)) for key in ENTRY_KEYS}
    entry["python"] = str(entry["python"])
    for key in ("packages", "tools"):
        entry[key] = sorted((_package(p) for p in entry[key] or []), key=lambda p: (p["name"], p["filename"]))
    entry["overrides"] = entry["overrides"] or []
    # The dependency graph the planner judged with stays in the planner's lock: the reviewed file names the rows.
    entry["lock_rules"] = {k: v for k, v in (entry["lock_rules"] or {}).items() if k != "required_by"}
    return entry


def make_document(profile: dict, locks: list, generated_at: str) -> dict:
    """The lock file of the planner's ``locks`` (one per target) for ``profile``: entries in platform order."""
    entries = sorted((entry_from_lock(lock) for lock in locks), key=_entry_key)
    return {
        "schema": SCHEMA,
        "profile": {"name": profile["name"], "hash": profile_hash(profile)},
        "generated_at": generated_at,
        "entries": entries,
    }


def _entry_key(entry: dict) -> tuple:
    arch, glibc = parse_platform(entry["platform"])
    return arch, str(entry["python"]), glibc


def dumps(doc: dict) -> str:
    """Stable YAML: sorted keys, block style, no line wrapping (URLs and hashes stay on one line)."""
    # Plain data first: values templated by Ansible are str subclasses (data tagging) that safe_dump refuses.
    plain = json.loads(json.dumps(doc))
    return HEADER + yaml.safe_dump(plain, sort_keys=True, default_flow_style=False, width=100000, allow_unicode=True)


def loads(text: str, path: str = "lock file") -> dict:
    """Parse and check the shape of a lock file; raises LockFileError naming what is wrong and the fix."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise LockFileError(f"{path} is not valid YAML ({exc}); fix: restore it from version control") from exc
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        seen = doc.get("schema") if isinstance(doc, dict) else type(doc).__name__
        raise LockFileError(
            f"{path} is not a gpufleet lock file (schema {seen!r}, expected {SCHEMA!r}); fix: pass a file written by"
            " playbooks/plan.yml"
        )
    problems = []
    if not isinstance(doc.get("profile"), dict) or not doc["profile"].get("name") or not doc["profile"].get("hash"):
        problems.append("profile name and hash")
    entries = doc.get("entries")
    if not isinstance(entries, list) or not entries:
        problems.append("entries")
    else:
        for number, entry in enumerate(entries, start=1):
            missing = [k for k in ("platform", "python", "hash", "venv_name", "packages") if not entry.get(k)]
            missing += [
                f"packages[{i}].{k}"
                for i, p in enumerate(entry.get("packages") or [])
                for k in ("name", "version", "filename", "sha256")
                if not p.get(k)
            ]
            if missing:
                problems.append(f"entry {number} ({', '.join(missing)})")
    if problems:
        raise LockFileError(
            f"{path} lacks {'; '.join(problems)}; fix: restore it from version control or plan it again with"
            " playbooks/plan.yml"
        )
    return doc


def read(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as handle:
            return loads(handle.read(), path)
    except OSError as exc:
        raise LockFileError(
            f"lock file {path} cannot be read ({exc.strerror}); fix: pass gpufleet_lock_file as the path of a file"
            " written by playbooks/plan.yml"
        ) from exc


def write(path: str, text: str) -> None:
    """Write atomically: a reviewer never sees half a file."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".lock-file-")
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def report_path(path: str) -> str:
    """The plan report beside the lock file: ``fleet.lock.yml`` -> ``fleet.lock.report.txt``."""
    base = path[: -len(".yml")] if path.endswith(".yml") else path[: -len(".yaml")] if path.endswith(".yaml") else path
    return base + ".report.txt"


# ---------------------------------------------------------------------------------------------------- apply


def check_profile(doc: dict, profile: dict, path: str = "lock file") -> None:
    """Refuse a lock file planned for another profile, or for another content of this profile."""
    want = profile_hash(profile)
    got = doc["profile"]
    if got["name"] != profile["name"] or got["hash"] != want:
        raise LockFileError(
            f"{path} was planned for profile {got['name']} (hash {got['hash'][:12]}), not for profile"
            f" {profile['name']} as loaded now (hash {want[:12]}"
            f"{', the profile changed since the plan' if got['name'] == profile['name'] else ''}); fix: plan the"
            f" fleet again with ansible-playbook playbooks/plan.yml -e gpufleet_stack_profile={profile['name']},"
            " review and commit the lock file, then apply it. No host was changed"
        )


def entry_lock(doc: dict, entry: dict, path: str, wheelhouse: str) -> dict:
    """The lock a host's roles take (fact ``gpufleet_wheel_lock``) from one entry of the lock file."""
    lock = copy.deepcopy(entry)
    lock.update(profile=doc["profile"]["name"], profile_hash=doc["profile"]["hash"], path=path, wheelhouse=wheelhouse)
    lock["origin"] = f"from lock file {path}"
    lock.setdefault("hash12", lock["hash"][:12])
    lock.setdefault("tools", [])
    lock.setdefault("report", {})
    return lock


def missing_from_site_cache(entries: list, url: str, timeout: float = 10, opener=None) -> list:
    """Wheels a site cache (``gpufleet_fleet_cache_url``: hosts pull ``<url>/wheels/<file>``) does not serve, or
    serves with another size than the lock's: one HEAD request each. The sha256 is checked by each host as it pulls
    a wheel, before anything is installed."""
    head = opener or (lambda target, timeout: open_url(target, method="HEAD", timeout=timeout))
    missing = []
    for wheel in entries:
        target = f"{url.rstrip('/')}/wheels/{urllib.parse.quote(wheel['filename'])}"
        try:
            with head(target, timeout=timeout) as answer:
                size = answer.headers.get("Content-Length")
        except (urllib.error.URLError, OSError) as exc:
            missing.append(f"{wheel['filename']} (site cache {target}: {getattr(exc, 'code', None) or exc})")
            continue
        if wheel.get("size") and size is not None and int(size) != int(wheel["size"]):
            missing.append(f"{wheel['filename']} (site cache serves {size} bytes, the lock has {wheel['size']})")
    return missing


def refuse_missing(missing: dict, where: str, path: str) -> None:
    """``missing``: {venv_name: [file, ...]} of wheels ``where`` does not hold with the locked sha256."""
    if not any(missing.values()):
        return
    named = "; ".join(f"{venv}: {', '.join(files)}" for venv, files in sorted(missing.items()) if files)
    raise LockFileError(
        f"{where} no longer holds every wheel of {path} with its locked sha256 ({named}); fix: put those files back"
        " (ansible-playbook playbooks/plan.yml -e gpufleet_lock_file=<the file> -e gpufleet_lock_fetch=true fetches"
        " exactly them from the URLs the lock names), or plan a new lock file. No host was changed"
    )


# ---------------------------------------------------------------------------------------------------- diff


def diff(old: dict | None, new: dict) -> dict:
    """What applying ``new`` changes against ``old`` (the previous lock file, None when there was none): per entry
    (platform and Python) the packages added, removed and changed, each with versions and sha256."""
    old_entries = {_label(e): e for e in (old or {}).get("entries") or []}
    new_entries = {_label(e): e for e in new.get("entries") or []}
    entries = []
    for label in sorted(set(old_entries) | set(new_entries)):
        before, after = old_entries.get(label), new_entries.get(label)
        was = {p["name"]: p for p in (before or {}).get("packages") or []}
        now = {p["name"]: p for p in (after or {}).get("packages") or []}
        changed = [
            {"name": n, "old": _pkg(was[n]), "new": _pkg(now[n])}
            for n in sorted(set(was) & set(now))
            if (was[n]["version"], was[n]["sha256"]) != (now[n]["version"], now[n]["sha256"])
        ]
        entries.append(
            {
                "entry": label,
                "old_venv": (before or {}).get("venv_name"),
                "new_venv": (after or {}).get("venv_name"),
                "added": [_pkg(now[n]) for n in sorted(set(now) - set(was))],
                "removed": [_pkg(was[n]) for n in sorted(set(was) - set(now))],
                "changed": changed,
            }
        )
    old_profile = (old or {}).get("profile") or {}
    return {
        "previous": old is not None,
        "profile": {"old": old_profile.get("hash"), "new": new["profile"]["hash"]},
        "entries": entries,
        "changed": any(e["added"] or e["removed"] or e["changed"] for e in entries)
        or old_profile.get("hash") != new["profile"]["hash"],
    }


def _label(entry: dict) -> str:
    return f"{entry['platform']} Python {entry['python']}"


def _pkg(p: dict) -> dict:
    return {"name": p["name"], "version": p["version"], "sha256": p["sha256"], "filename": p.get("filename")}


def diff_lines(change: dict) -> list:
    """The diff in words, one line per package: ``~ name old (sha256 abc…) -> new (sha256 def…)``."""
    if not change["previous"]:
        lines = ["no previous lock file: every package below is new"]
    elif not change["changed"]:
        return ["no change against the previous lock file"]
    else:
        lines = []
        if change["profile"]["old"] != change["profile"]["new"]:
            lines.append(f"profile hash {str(change['profile']['old'])[:12]} -> {change['profile']['new'][:12]}")
    for entry in change["entries"]:
        if not (entry["added"] or entry["removed"] or entry["changed"]):
            lines.append(f"{entry['entry']}: unchanged ({entry['new_venv']})")
            continue
        lines.append(f"{entry['entry']}: {entry['old_venv'] or '(none)'} -> {entry['new_venv'] or '(none)'}")
        lines += [f"  + {p['name']} {p['version']} (sha256 {p['sha256'][:12]})" for p in entry["added"]]
        lines += [f"  - {p['name']} {p['version']} (sha256 {p['sha256'][:12]})" for p in entry["removed"]]
        lines += [
            f"  ~ {c['name']} {c['old']['version']} (sha256 {c['old']['sha256'][:12]}) -> {c['new']['version']}"
            f" (sha256 {c['new']['sha256'][:12]})"
            for c in entry["changed"]
        ]
    return lines


# ---------------------------------------------------------------------------------------------------- host record


def recorded_lock(record: dict | None, profile: str) -> dict:
    """The lock a host's last upgrade applied, as the host keeps it (``venv_host.py locate``: the state file's
    ``lock`` record and the text of ``<serving_root>/locks/<venv_name>.txt``), shaped as the roles take a lock
    (``venv_name``, ``hash``, ``packages`` with name and version). A host with no usable record gets a lock with
    no packages and ``no_lock``, the reason in words with the fix: the host model reports it as drift (the host is
    not known to run any lock of this profile), never a plan made now."""
    record = record or {}
    lock = record.get("lock") or {}
    fix = "audit it against a reviewed lock file with -e gpufleet_lock_file=<file>"
    if not lock:
        return _no_lock(
            profile,
            f"the host records no lock of its last upgrade (its state file {record.get('state_path') or ''} names"
            f" none: no upgrade by this collection completed there since it records them); fix: upgrade it, or {fix}",
        )
    if lock.get("profile") != profile:
        return _no_lock(
            profile,
            f"its last upgrade applied lock {lock.get('venv_name')} of profile {lock.get('profile')}, not of"
            f" {profile}; fix: audit it with -e gpufleet_stack_profile={lock.get('profile')}, or {fix}",
        )
    text = record.get("lock_text")
    header = re.search(r"^# (\S+): lock ([0-9a-f]{64})$", text or "", re.MULTILINE)
    if not text or not header or header.group(1) != lock.get("venv_name") or header.group(2) != lock.get("hash"):
        seen = "is missing" if not text else f"is not the lock {lock.get('hash')} the state file records"
        return _no_lock(
            profile,
            f"its last upgrade applied lock {lock.get('venv_name')}, but the host's copy of it,"
            f" {record.get('lock_text_path')}, {seen}; fix: {fix}",
        )
    try:
        packages = [
            {"name": p["name"], "version": p["version"]} for p in _lock.parse(text, record.get("lock_text_path"))
        ]
    except _lock.LockError as exc:
        return _no_lock(profile, f"the host's copy of its lock does not parse ({exc}); fix: {fix}")
    return {
        "profile": lock["profile"],
        "hash": lock["hash"],
        "hash12": lock["hash"][:12],
        "venv_name": lock["venv_name"],
        "packages": packages,
        "tools": [],
        # With the state file lost, the host still keeps the lock of the verified venv current points at.
        "source": "host, its state file missing: the lock of the venv current points at"
        if lock.get("from") == "current"
        else "host",
        "path": record.get("lock_text_path"),
    }


def _no_lock(profile: str, reason: str) -> dict:
    return {
        "profile": profile,
        "hash": "",
        "hash12": "",
        "venv_name": "",
        "packages": [],
        "tools": [],
        "source": "host",
        "path": None,
        "no_lock": reason,
    }
