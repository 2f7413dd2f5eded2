# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fleet's lock file: the reviewed wheel set a fleet runs. Controller side only.

``playbooks/plan.yml`` writes it (one entry per group of hosts: architecture and Python, each planned for the lowest
glibc of its group), the operator reviews and commits it, and ``upgrade.yml``, ``audit.yml`` and ``rollback.yml``
apply or judge exactly it (``gpufleet_lock_file``) without asking an index anything. The file is YAML with sorted
keys, entries and packages in a fixed order, so two plans of the same wheels give the same bytes and a review's
diff shows only what changed. The profile's hash inside it ties it to the profile it was planned from.

The file is a trust boundary: what plan.yml wrote carries its digest (``seal``), and every reader refuses a file that
does not match it, whose wheels' names and versions are not their file names' (``loads``), or, when it is applied,
whose wheel URLs are off the profile's indexes (``check_urls``) or whose wheels' METADATA disagree (``check_metadata``),
each before any host changes.
"""

from __future__ import annotations

import copy
import email.parser
import hashlib
import json
import os
import re
import tempfile
import traceback
import urllib.error
import urllib.parse
import zipfile

import yaml
from ansible.module_utils.basic import missing_required_lib
from ansible.module_utils.urls import open_url

try:
    from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
    from packaging.version import InvalidVersion, Version

    HAS_PACKAGING = True
    PACKAGING_IMPORT_ERROR = None
except ImportError:  # read on the controller; the checks that compare names and versions refuse without it
    HAS_PACKAGING = False
    PACKAGING_IMPORT_ERROR = traceback.format_exc()

from ansible_collections.gpufleet.upgrade.plugins.module_utils._hash_record import HashRecord, MetadataRecord
from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _lock

# 2: the file carries the digest plan.yml computed of it (``seal``); a file of schema 1 has none and is refused.
SCHEMA = "gpufleet-lock-file/2"
OLD_SCHEMAS = ("gpufleet-lock-file/1",)
# What a lock entry keeps of the planner's lock (``_wheel_plan.make_lock``): what hosts install and the rules it
# kept. The planner's candidate report is long and changes with every listing: it goes to the report beside the file.
ENTRY_KEYS = ("platform", "python", "hash", "hash12", "venv_name", "packages", "tools", "overrides", "lock_rules")
PACKAGE_KEYS = ("name", "version", "filename", "url", "sha256", "index", "size", "role")
# Written only where the planner knew them (lock files written before them lack them): who computed the hash
# (index, controller, uv) and what the wheel takes unpacked (preflight sizes the new venv by it).
OPTIONAL_PACKAGE_KEYS = ("sha256_source", "installed_size")
_PLATFORM = re.compile(r"^(?P<arch>[A-Za-z0-9_]+)-(?:manylinux_(?P<major>\d+)_(?P<minor>\d+)|linux)$")
# In the form an operator with the installed collection types (a checkout runs playbooks/<name>.yml the same way).
HEADER = (
    "# gpufleet lock file: the wheel set the fleet runs, planned by gpufleet.upgrade.plan.\n"
    "# Review it and commit it; apply it with\n"
    "#   ansible-playbook -i <inventory> gpufleet.upgrade.upgrade -e gpufleet_lock_file=<this file>\n"
)


class LockFileError(Exception):
    """A lock file that cannot be used as it is; the message names the value seen and the fix."""


def replan(path: str) -> str:
    """The fix for a lock file that is not as plan.yml wrote it: plan.yml reads it as it is and shows the diff."""
    return (
        f"fix: plan it again with ansible-playbook playbooks/plan.yml -e gpufleet_lock_file={path} (its diff shows"
        " what differs from a plan), review and commit the file it writes, then apply that. No host was changed"
    )


# ---------------------------------------------------------------------------------------------------- profile hash


# What a site's mirrors (``gpufleet_index_urls``) change in a profile: an index's URL, where its files are, the mark.
SITE_KEYS = ("url", "files", "site_mirror")


def profile_hash(profile: dict) -> str:
    """sha256 of the profile's content in canonical JSON, without where it was read from and without any URL or URL
    prefix (``SITE_KEYS``): a site's mirrors may differ between planning and applying, the lock pins every wheel by
    sha256 anyway, and its URLs are checked against the profile as loaded (``check_urls``). Comments and key order
    in the profile's file do not count; every other value does."""

    def strip(value):
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k not in SITE_KEYS}
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


def make_document(profile: dict, locks: list, generated_at: str, extra_urls=()) -> dict:
    """The lock file of the planner's ``locks`` (one per target) for ``profile``: entries in platform order, sealed
    with its digest. A wheel URL its audit would refuse (``check_urls``: off every index's files and ``extra_urls``,
    ``gpufleet_lock_allowed_urls``) is refused here, so no lock file holds one: LockFileError."""
    entries = sorted((entry_from_lock(lock) for lock in locks), key=_entry_key)
    # A profile names at least one index (its schema): a stand-in without any has nothing to judge URLs by.
    judged = bool((profile.get("wheels") or {}).get("indexes"))
    refused = judged and url_refusal(entries, allowed_urls(profile, None, extra_urls), profile)
    if refused:
        raise LockFileError(f"the plan {refused}. No lock file was written; no host was changed")
    return seal(
        {
            "schema": SCHEMA,
            "profile": {"name": profile["name"], "hash": profile_hash(profile)},
            "generated_at": generated_at,
            "entries": entries,
        }
    )


def _entry_key(entry: dict) -> tuple:
    arch, glibc = parse_platform(entry["platform"])
    return arch, str(entry["python"]), glibc


def dumps(doc: dict) -> str:
    """Stable YAML: sorted keys, block style, no line wrapping (URLs and hashes stay on one line)."""
    # Plain data first: values templated by Ansible are str subclasses (data tagging) that safe_dump refuses.
    plain = json.loads(json.dumps(doc))
    return HEADER + yaml.safe_dump(plain, sort_keys=True, default_flow_style=False, width=100000, allow_unicode=True)


# ---------------------------------------------------------------------------------------------------- digest


def _sha256(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


# The fields a short digest names one by one (4 hex digits each, in this order, then one for any other key): a
# refusal says which field of which package was edited. The file's sha256 is what decides; these only name.
PACKAGE_FIELDS = (*PACKAGE_KEYS, *OPTIONAL_PACKAGE_KEYS)
ENTRY_FIELDS = ("platform", "python", "hash", "hash12", "venv_name", "overrides", "lock_rules")


def _fields_digest(item: dict, fields: tuple, skip=()) -> str:
    rest = {k: v for k, v in item.items() if k not in fields and k not in skip}
    return "".join(_sha256(item.get(k))[:4] for k in fields) + _sha256(rest)[:4]


def _edited_fields(before, now: str, fields: tuple) -> list:
    if not isinstance(before, str) or len(before) != len(now):
        return ["its digest"]
    names = [*fields, "another key"]
    return [names[i // 4] for i in range(0, len(now), 4) if before[i : i + 4] != now[i : i + 4]]


def digest_of(doc: dict) -> dict:
    """The digest of a lock file's content: ``sha256`` of everything but the digest (canonical JSON), and per entry
    (by platform and Python) a short digest per field of the entry and of each package and tool (by name), so that a
    refusal names what was edited, and a plan's diff of the file changes only the lines of what changed."""
    entries = {}
    for entry in doc.get("entries") or []:
        entries[_label(entry)] = {
            "entry": _fields_digest(entry, ENTRY_FIELDS, skip=("packages", "tools")),
            **{
                group: {str(p.get("name")): _fields_digest(p, PACKAGE_FIELDS) for p in entry.get(group) or []}
                for group in ("packages", "tools")
            },
        }
    return {"sha256": _sha256({k: v for k, v in doc.items() if k != "digest"}), "entries": entries}


def seal(doc: dict) -> dict:
    """``doc`` as plain data with its digest (``digest_of``): what plan.yml writes."""
    plain = json.loads(json.dumps({k: v for k, v in doc.items() if k != "digest"}))
    plain["digest"] = digest_of(plain)
    return plain


def check_digest(doc: dict, path: str) -> None:
    """Refuse a lock file whose content is not the one its digest was computed of (edited by hand), naming each
    entry, package and field that differs, or the head of the file."""
    edited = digest_mismatch(doc)
    if edited is not None:
        raise LockFileError(f"{path} {edited}; {replan(path)}")


def digest_mismatch(doc: dict) -> str | None:
    """What in ``doc`` differs from its digest, in words; None when it matches."""
    recorded = doc.get("digest")
    if not isinstance(recorded, dict) or not recorded.get("sha256"):
        return "carries no digest: it is not as playbooks/plan.yml wrote it"
    want = digest_of(doc)
    if recorded.get("sha256") == want["sha256"] and recorded.get("entries") == want["entries"]:
        return None
    seen = recorded.get("entries") if isinstance(recorded.get("entries"), dict) else {}
    named = [f"entry {label} (removed)" for label in sorted(set(seen) - set(want["entries"]))]
    for entry in doc["entries"]:
        named += _edited_entry(entry, seen.get(_label(entry)), want["entries"][_label(entry)])
    where = "; ".join(named) or "its head (schema, profile or generated_at)"
    return f"was edited since plan.yml wrote it (its digest does not match): {where}"


def _edited_entry(entry: dict, was, now: dict) -> list:
    label = _label(entry)
    if not isinstance(was, dict):
        return [f"entry {label} (not an entry plan.yml wrote)"]
    named = []
    if was.get("entry") != now["entry"]:
        fields = _edited_fields(was.get("entry"), now["entry"], ENTRY_FIELDS)
        named.append(f"entry {label}: {', '.join(fields)}")
    for group in ("packages", "tools"):
        before = was.get(group) if isinstance(was.get(group), dict) else {}
        for package in entry.get(group) or []:
            name = str(package.get("name"))
            if name not in before:
                named.append(f"entry {label}, {group[:-1]} {name} (not one plan.yml wrote)")
            elif before[name] != now[group][name]:
                fields = _edited_fields(before[name], now[group][name], PACKAGE_FIELDS)
                shown = ", ".join(f"{f} {package[f]}" if f in package else f for f in fields)
                named.append(f"entry {label}, {group[:-1]} {name}: {shown}")
        named += [f"entry {label}, {group[:-1]} {n} (removed)" for n in sorted(set(before) - set(now[group]))]
    return named


# ---------------------------------------------------------------------------------------------------- names


def require_packaging(what: str) -> None:
    """Refuse ``what`` (a lock file's check) when the controller's Python lacks packaging, naming the fix."""
    if not HAS_PACKAGING:
        raise LockFileError(
            f"{what} needs the Python library packaging on the controller: {missing_required_lib('packaging')};"
            " nothing was changed"
        )


def wheel_name_problem(package: dict) -> str | None:
    """Why a package's name and version disagree with its wheel's file name, or None."""
    require_packaging(f"checking the wheel {package.get('filename')} of the lock file")
    filename = str(package.get("filename"))
    try:
        name, version, _build, _tags = parse_wheel_filename(filename)
    except InvalidWheelFilename as exc:
        return f"file {filename} is not a wheel's file name ({exc})"
    if canonicalize_name(str(package.get("name"))) != name:
        return f"name {package.get('name')}, but its file {filename} is a wheel of {name}"
    try:
        same = Version(str(package.get("version"))) == version
    except InvalidVersion:
        return f"version {package.get('version')!r} is not a version (its file {filename} is version {version})"
    if not same:
        return f"version {package.get('version')}, but its file {filename} is version {version}"
    return None


def name_problems(doc: dict) -> list:
    """Each package or tool whose name or version is not its wheel's file name's, in words."""
    return [
        f"entry {_label(entry)}, {group[:-1]} {package.get('name')}: {problem}"
        for entry in doc["entries"]
        for group in ("packages", "tools")
        for package in entry.get(group) or []
        for problem in [wheel_name_problem(package)]
        if problem
    ]


def check_names(doc: dict, path: str) -> None:
    """Refuse a lock file where an entry's package or tool names another name or version than its wheel's file."""
    problems = name_problems(doc)
    if problems:
        raise LockFileError(f"{path} does not agree with itself: {'; '.join(problems)}; {replan(path)}")


def not_as_planned(doc: dict) -> str | None:
    """Why ``doc`` (read with ``verify=False``) is not a file plan.yml writes now, in words; None when it is."""
    if doc.get("schema") != SCHEMA:
        return f"it is of schema {doc.get('schema')!r}, without a digest"
    problems = name_problems(doc)
    if problems:
        return f"it does not agree with itself: {'; '.join(problems)}"
    edited = digest_mismatch(doc)
    return f"it {edited}" if edited else None


def read_metadata(path: str) -> list:
    """(Name, Version) of a wheel's METADATA, read from the zip (``<name>-<version>.dist-info/METADATA``)."""
    with zipfile.ZipFile(path) as archive:
        members = [n for n in archive.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n)]
        if len(members) != 1:
            raise ValueError(f"{len(members)} .dist-info/METADATA files instead of one")
        headers = email.parser.BytesHeaderParser().parsebytes(archive.read(members[0]))
    return [headers.get("Name"), headers.get("Version")]


def metadata_problems(entries: list, wheelhouse: str) -> list:
    """Packages and tools whose wheel the wheelhouse holds with the locked sha256 (as recorded: no file is hashed
    here) but whose METADATA names another name or version, or that is no readable wheel. What a wheel's METADATA
    says is kept by its sha256 (``MetadataRecord``): each wheel is opened once."""
    require_packaging(f"checking the wheels' METADATA in {wheelhouse}")
    held = HashRecord(wheelhouse)
    said = MetadataRecord(wheelhouse)
    problems = []
    for entry in entries:
        for group in ("packages", "tools"):
            for package in entry.get(group) or []:
                filename, sha = package["filename"], package["sha256"]
                if held.recorded(filename) != sha:
                    continue
                label = f"entry {_label(entry)}, {group[:-1]} {package['name']}: {filename}"
                try:
                    if said.get(sha) is None:
                        said.put(sha, read_metadata(os.path.join(wheelhouse, filename)))
                    name, version = said.get(sha)
                    if canonicalize_name(str(name)) != canonicalize_name(package["name"]):
                        problems.append(f"{label} holds METADATA Name {name}, not {package['name']}")
                    elif Version(str(version)) != Version(str(package["version"])):
                        problems.append(f"{label} holds METADATA Version {version}, not {package['version']}")
                except (OSError, ValueError, KeyError, zipfile.BadZipFile) as exc:
                    problems.append(f"{label} is not a readable wheel ({exc})")
    if os.path.isdir(wheelhouse):
        said.save()
    return problems


def check_metadata(entries: list, wheelhouse: str, path: str) -> None:
    problems = metadata_problems(entries, wheelhouse)
    if problems:
        raise LockFileError(
            f"{path} names wheels that are not what their METADATA says: {'; '.join(problems)}; the locked sha256"
            f" pins these files, so the plan that wrote it took a wheel that pip and uv refuse; {replan(path)}"
        )


# ---------------------------------------------------------------------------------------------------- URLs


def _origin(url: str) -> tuple | None:
    """(scheme, host, port) of an http(s) URL without user info, else None."""
    try:
        split = urllib.parse.urlsplit(str(url))
        port = split.port
    except ValueError:
        return None
    if split.scheme.lower() not in ("http", "https") or not split.hostname or "@" in split.netloc:
        return None
    return split.scheme.lower(), split.hostname.lower(), port or (443 if split.scheme.lower() == "https" else 80)


def _default_index_files(url: str) -> str | None:
    """Where pip's own default index serves its files from (another host than its listings), when ``url`` is it."""
    try:
        from pip._internal.models.index import PyPI  # pip's own notion of the default index, as _profile reads it
    except ImportError:
        return None
    if _origin(url) != _origin(PyPI.simple_url):
        return None
    return f"https://{PyPI.file_storage_domain}/"


def index_files(index: dict) -> list:
    """Where an index's pages may link its wheel files: its ``files`` (the profile's, or a site mirror's), else its
    own origin, and for pip's default index where pip says it serves its files."""
    if index.get("files"):
        return [str(prefix) for prefix in index["files"] if _origin(prefix)]
    origin = _origin(index.get("url"))
    default = _default_index_files(index.get("url"))
    return [prefix for prefix in (origin and _prefix(origin), default) if prefix]


def allowed_urls(profile: dict, fleet_cache_url: str | None = None, extra=()) -> dict:
    """{URL prefix: what allows it}: where each of the profile's indexes (after the site's mirrors,
    ``gpufleet_index_urls``) links its files (``index_files``), the fleet or site cache, and the operator's ``extra``
    prefixes (``gpufleet_lock_allowed_urls``)."""
    allowed = {}
    for index in (profile.get("wheels") or {}).get("indexes") or []:
        for prefix in index_files(index):
            allowed.setdefault(prefix, f"index {index['name']}")
    if fleet_cache_url and _origin(fleet_cache_url):
        allowed.setdefault(_prefix(_origin(fleet_cache_url)), "the fleet cache (gpufleet_fleet_cache_url)")
    for prefix in extra or ():
        if _origin(prefix):
            allowed.setdefault(str(prefix), "gpufleet_lock_allowed_urls")
    return allowed


def _prefix(origin: tuple) -> str:
    scheme, host, port = origin
    return f"{scheme}://{host}:{port}/"


def _normal(url: str) -> str | None:
    """``url`` as ``scheme://host:port/path`` for prefix comparison; None for one that is not plain http(s) (user
    info, a dot segment that climbs out of a prefix)."""
    origin = _origin(url)
    if origin is None:
        return None
    path = urllib.parse.urlsplit(str(url)).path or "/"
    if any(part in (".", "..") for part in urllib.parse.unquote(path).split("/")):
        return None
    return _prefix(origin) + path.lstrip("/")


def url_allowed(url: str, allowed: dict) -> bool:
    normal = _normal(url)
    if normal is None:
        return False
    return any(normal.startswith(_normal(prefix) or "\0") for prefix in allowed)


def check_urls(doc: dict, path: str, allowed: dict, profile: dict | None = None) -> None:
    """Refuse a lock file naming a wheel URL outside ``allowed`` (``allowed_urls``), before anything is fetched. The
    same check as ``make_document``'s when plan.yml writes it (``url_refusal``)."""
    refused = url_refusal(doc["entries"], allowed, profile)
    if refused:
        raise LockFileError(
            f"{path} {refused}; or plan the lock file again from the profile's indexes (ansible-playbook"
            f" playbooks/plan.yml -e gpufleet_lock_file={path}). Nothing was fetched. No host was changed"
        )


def url_refusal(entries: list, allowed: dict, profile: dict | None = None) -> str | None:
    """The wheels of ``entries`` whose URL is off ``allowed``, in words, each with the index it was planned from,
    and the fix: the field that declares where that index links its files; None when every URL is allowed."""
    refused, fixes = [], []
    for entry in entries:
        for group in ("packages", "tools"):
            for package in entry.get(group) or []:
                if url_allowed(package.get("url"), allowed):
                    continue
                index = _index_named(profile, package.get("index"))
                where = f" (planned from index {index['name']})" if index else ""
                refused.append(
                    f"entry {_label(entry)}, {group[:-1]} {package.get('name')}: {package.get('url')}{where}"
                )
                fix = _files_fix(profile, index, package.get("url"))
                if fix not in fixes:
                    fixes.append(fix)
    if not refused:
        return None
    under = ", ".join(sorted(allowed)) or "nothing (the profile names no http(s) index)"
    return (
        f"names wheel URLs off every place the profile's indexes link their files and off the fleet cache"
        f" ({'; '.join(refused)}); allowed: http(s) under {under}. fix: {'; '.join(fixes)}"
    )


def _index_named(profile: dict | None, name) -> dict | None:
    for index in ((profile or {}).get("wheels") or {}).get("indexes") or []:
        if name and index.get("name") == name:
            return index
    return None


def _files_fix(profile: dict | None, index: dict | None, url) -> str:
    """Where to declare that an index links its files at ``url``: the profile's field, or the site mirror's."""
    folder = str(url).rsplit("/", 1)[0] + "/" if _origin(url) else None
    what = f"a prefix of {folder} (its folder, or a shorter one)" if folder else "the URL prefix its files are under"
    if index is None:
        return (
            f"if one of the profile's indexes links its files there, add {what} to that index's files"
            " (wheels.indexes[<name>].files in the profile), or to gpufleet_lock_allowed_urls"
        )
    name = index["name"]
    if index.get("site_mirror"):
        field = f"gpufleet_index_urls.{name}.files (the site's mirror of index {name}: {{url, files}})"
    else:
        source = ((profile or {}).get("source") or {}).get("path")
        field = f"wheels.indexes[{name}].files of profile {profile.get('name')}" + (f" ({source})" if source else "")
    return f"if index {name} links its wheel files there, add {what} to {field}, or to gpufleet_lock_allowed_urls"


# ---------------------------------------------------------------------------------------------------- read


def loads(text: str, path: str = "lock file", verify: bool = True) -> dict:
    """Parse and check a lock file: its shape, then (``verify``) that each wheel's name and version are its file
    name's and that its content is the one its digest was computed of. Raises LockFileError naming what is wrong
    and the fix. ``verify=False`` (plan.yml reading the previous file to diff against) takes a file of an older
    schema, or edited by hand, as it is."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise LockFileError(f"{path} is not valid YAML ({exc}); fix: restore it from version control") from exc
    schema = doc.get("schema") if isinstance(doc, dict) else None
    if verify and schema in OLD_SCHEMAS:
        raise LockFileError(
            f"{path} is a lock file of schema {schema!r}, written before lock files carried their digest (schema"
            f" {SCHEMA!r}); {replan(path)}"
        )
    if not isinstance(doc, dict) or schema not in (SCHEMA, *(() if verify else OLD_SCHEMAS)):
        seen = schema if isinstance(doc, dict) else type(doc).__name__
        raise LockFileError(
            f"{path} is not a gpufleet lock file (schema {seen!r}, expected {SCHEMA!r}); fix: pass a file written by"
            " playbooks/plan.yml"
        )
    problems = _shape_problems(doc)
    if problems:
        raise LockFileError(
            f"{path} lacks {'; '.join(problems)}; fix: restore it from version control or plan it again with"
            " playbooks/plan.yml"
        )
    if verify:
        check_names(doc, path)
        check_digest(doc, path)
    return doc


def _shape_problems(doc: dict) -> list:
    problems = []
    if not isinstance(doc.get("profile"), dict) or not doc["profile"].get("name") or not doc["profile"].get("hash"):
        problems.append("profile name and hash")
    entries = doc.get("entries")
    if not isinstance(entries, list) or not entries:
        return [*problems, "entries"]
    for number, entry in enumerate(entries, start=1):
        if not isinstance(entry, dict):
            problems.append(f"entry {number} (not a mapping)")
            continue
        missing = [k for k in ("platform", "python", "hash", "venv_name", "packages") if not entry.get(k)]
        missing += [
            f"{group}[{i}].{k}"
            for group in ("packages", "tools")
            for i, p in enumerate(entry.get(group) or [])
            for k in ("name", "version", "filename", "url", "sha256")
            if not isinstance(p, dict) or not p.get(k)
        ]
        if missing:
            problems.append(f"entry {number} ({', '.join(missing)})")
    return problems


def read(path: str, verify: bool = True) -> dict:
    try:
        with open(path, encoding="utf-8") as handle:
            return loads(handle.read(), path, verify)
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
    """``missing``: {venv_name: [file, ...]} of wheels ``where`` does not hold with the locked sha256, each named
    with the locked sha256 and the one found (``wheelhouse_mismatches``)."""
    if not any(missing.values()):
        return
    named = "; ".join(f"{venv}: {', '.join(files)}" for venv, files in sorted(missing.items()) if files)
    raise LockFileError(
        f"{where} no longer holds every wheel of {path} with its locked sha256 ({named}); fix: put the locked files"
        " back (a file put back is hashed anew), or fetch exactly them from the URLs the lock names, sha256 checked:"
        f" ansible-playbook playbooks/plan.yml -e gpufleet_lock_file={path} -e gpufleet_lock_fetch=true; or plan a new"
        " lock file. No host was changed"
    )


def wheelhouse_mismatches(names: list, entries: list, wheelhouse: str) -> list:
    """The files ``names`` (a wheelhouse check found them missing or other) in words: each with the sha256 the lock
    has and the one the wheelhouse's file has (recorded by that check: read again only if it changed since)."""
    locked = {p["filename"]: p["sha256"] for e in entries for p in (e.get("packages") or []) + (e.get("tools") or [])}
    record = HashRecord(wheelhouse)
    out = []
    for name in names:
        try:
            found = f"the file there has {record.sha256(name)}"
        except OSError:
            found = "no such file there"
        out.append(f"{name} (locked sha256 {locked.get(name)}, {found})")
    return out


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
    # A previous file that is not as plan.yml writes it (an older schema, an edit by hand) is written anew even when
    # its wheels are the plan's: kept, it would be refused when applied.
    rewritten = not_as_planned(old) if old is not None else None
    return {
        "previous": old is not None,
        "profile": {"old": old_profile.get("hash"), "new": new["profile"]["hash"]},
        "entries": entries,
        "rewritten": rewritten,
        "changed": any(e["added"] or e["removed"] or e["changed"] for e in entries)
        or old_profile.get("hash") != new["profile"]["hash"]
        or rewritten is not None,
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
        if change.get("rewritten"):
            lines.append(f"the previous lock file is written anew: {change['rewritten']}")
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
