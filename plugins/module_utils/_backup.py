# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Backups of a serving host before an upgrade: pure logic, no Ansible.

A backup is a folder ``<backups>/<id>/`` holding ``manifest.json`` (what the host looked like),
``manifest.json.sha256``, ``venv.lock`` (the venv's exact package list), copies of the serving unit and
environment files under ``files/``, baseline results under ``results/`` and, optionally,
``venv.tar.gz``. Every file's sha256 is in the manifest. A backup is built under ``.partial-<id>`` and
renamed into place when complete, so a killed run never leaves a half backup under a real id.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tarfile

from ansible_collections.gpufleet.upgrade.plugins.module_utils._version import COLLECTION, COLLECTION_VERSION

try:
    from packaging.requirements import InvalidRequirement, Requirement

    HAS_PACKAGING = True
except ImportError:  # lab and fleet hosts need not have it; the controller-side verify does
    HAS_PACKAGING = False

MANIFEST = "manifest.json"
MANIFEST_SUM = "manifest.json.sha256"
LOCK = "venv.lock"
ARCHIVE = "venv.tar.gz"
PARTIAL_PREFIX = ".partial-"
# The manifest's schema: a reader refuses a format it does not know (validate_manifest).
FORMAT_VERSION = 1
FORMAT_VERSIONS = (FORMAT_VERSION,)
MANIFEST_KEYS = ("format", "id", "host", "profile", "snapshot", "checksums")
ID_RE = re.compile(r"^\d{8}T\d{6}(\d{6})?Z-[0-9a-f]{8}$")


class BackupError(Exception):
    """A backup that cannot be used: missing, corrupt, or not this host's."""


# --------------------------------------------------------------------------- hashing


def sha256_file(path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def sha256_text(text) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def canonical(doc) -> str:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"))


# --------------------------------------------------------------------------- ids, listing


def new_backup_id(now_compact, digest) -> str:
    """``20261202T130501123456Z-1a2b3c4d``: sorts by time (microseconds), tells two snapshots apart by content."""
    return f"{now_compact}-{digest[:8]}"


def list_backups(backups_dir):
    """Complete backups, oldest first (ids sort by time)."""
    try:
        names = os.listdir(backups_dir)
    except FileNotFoundError:
        return []
    return sorted(n for n in names if ID_RE.match(n) and os.path.isdir(os.path.join(backups_dir, n)))


def list_partials(backups_dir):
    try:
        names = os.listdir(backups_dir)
    except FileNotFoundError:
        return []
    return sorted(n for n in names if n.startswith(PARTIAL_PREFIX))


def plan_prune(ids, keep, protect=()):
    """Ids to remove so that the newest ``keep`` remain; protected ids are never removed."""
    if keep < 1:
        raise BackupError(f"retention keep={keep} would delete every backup; fix: set backup_keep >= 1")
    doomed = list(ids)[:-keep] if len(ids) > keep else []
    return [i for i in doomed if i not in set(protect)]


# --------------------------------------------------------------------------- venv lock


def freeze_lines(text):
    """Keep the requirement lines of a ``pip freeze`` / ``uv pip freeze`` output, sorted and de-duplicated."""
    lines = set()
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        lines.add(line)
    return sorted(lines, key=str.lower)


def canonical_name(name) -> str:
    """PEP 503 name: ``Lab_Torch`` and ``lab-torch`` are one package."""
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_lock(text):
    """Parse a lock with ``packaging``: one pinned requirement per line (``name==version``, hashes allowed).

    Blank lines, comments (``#`` to the end of the line, so a whole ``# tool: ...`` line) and ``--hash``
    continuation lines are skipped. A ``name @ url`` line is kept with version None (it is pinned by its URL).
    Anything else that is not one pinned requirement, e.g. an editable ``-e ...`` line or another pip option,
    raises BackupError naming the first bad line.

    Returns ``[{name, version, url, line}]``.
    """
    if not HAS_PACKAGING:
        raise BackupError("the Python package 'packaging' is needed to parse a venv lock")
    packages = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip().rstrip("\\").strip()
        if not line or line.startswith("--hash"):
            continue
        requirement_text = line.split(" --hash", 1)[0].strip()
        try:
            requirement = Requirement(requirement_text)
        except InvalidRequirement as exc:
            raise BackupError(f"venv lock line {number} {raw!r} does not parse: {str(exc).splitlines()[0]}") from exc
        pins = [spec for spec in requirement.specifier if spec.operator in ("==", "===")]
        if requirement.url is None and len(pins) != 1:
            raise BackupError(f"venv lock line {number} {raw!r} is not pinned to one version")
        packages.append(
            {
                "name": requirement.name,
                "version": pins[0].version if pins else None,
                "url": requirement.url,
                "line": requirement_text,
            }
        )
    if not packages:
        raise BackupError("venv lock lists no package")
    return packages


def lock_differences(expected, installed):
    """Compare two parsed locks by name and version (names normalised by PEP 503)."""

    def index(packages):
        return {canonical_name(p["name"]): p["version"] for p in packages}

    want, have = index(expected), index(installed)
    problems = []
    for name in sorted(set(want) | set(have)):
        if want.get(name) != have.get(name):
            problems.append(f"{name}: expected {want.get(name) or 'absent'}, found {have.get(name) or 'absent'}")
    return problems


def venv_family(path) -> str:
    """A venv and the repairs built beside it (``<name>.repair-<run id>``) are one venv: the same lock."""
    return os.path.basename(os.path.normpath(path or "")).split(".repair-", 1)[0]


def pinned_versions(lock_text) -> list:
    """``[{name, version}]`` of a venv lock's ``name==version`` lines (no ``packaging`` needed: what a host-side
    consistency check reads); other lines are left out."""
    out = []
    for line in freeze_lines(lock_text or ""):
        requirement = line.split("#", 1)[0].split(" --hash", 1)[0].strip()
        name, sep, version = requirement.partition("==")
        if sep and name.strip() and version.strip() and "@" not in name:
            out.append({"name": name.strip(), "version": version.strip().split(";", 1)[0].strip()})
    return out


def recorded_state(consistency, model=None) -> dict:
    """What a backup records of the host it was taken from: the stack's own consistency (``_host_model.
    stack_consistency``) and, when the upgrade assessed the host first, the model's verdict against its target
    profile (``{profile, in_sync, on_profile, drift}``)."""
    return {**consistency, "model": model or None}


def recorded_state_problems(manifest) -> list:
    """Why a backup's recorded state is not one to roll back to: its stack did not fit together, or it was taken
    while the host ran its profile with drift (the backup before a repair). Backups without a record: none."""
    state = manifest.get("state") or {}
    problems = list(state.get("problems") or []) if state.get("consistent") is False else []
    model = state.get("model") or {}
    if model.get("on_profile") and model.get("in_sync") is False:
        drift = "; ".join(model.get("drift") or []) or "drifted"
        problems.append(f"taken while the host ran profile {model.get('profile')} with drift ({drift})")
    return problems


def rollback_choice(manifests, digest, venv_path=None) -> dict:
    """The backup "roll back" restores by default: the newest that is a rollback target (``is_rollback_target``:
    not the host as it is, not a re-run or repair on the present venv).

    Returns ``{id, passed_over: [{id, why}], refused, alternatives}``. When that backup's recorded state was
    inconsistent or drifted (``recorded_state_problems``) nothing is chosen: ``refused`` is ``{id, problems}`` and
    ``alternatives`` the older targets whose record is clean; only naming a backup (rollback_backup_id) restores
    such a state. Going further back silently could restore a stack from several upgrades ago.
    """
    out = {"id": None, "passed_over": [], "refused": None, "alternatives": []}
    for manifest in sorted(manifests, key=lambda m: m["id"], reverse=True):
        if not is_rollback_target(manifest, digest, venv_path):
            out["passed_over"].append({"id": manifest["id"], "why": "the host as it is now, or a re-run or repair"})
            continue
        problems = recorded_state_problems(manifest)
        if out["refused"] is not None:
            if not problems:
                out["alternatives"].append(manifest["id"])
            continue
        if problems:
            out["refused"] = {"id": manifest["id"], "problems": problems}
            continue
        out["id"] = manifest["id"]
        return out
    return out


def restore_differences(backed_up, now, compare_lock=True) -> list:
    """What of a backup's snapshot the host does not match after a restore, in words: the venv (path and lock),
    the global CUDA link and the alternatives choice, and every recorded file (content, kind, link target).
    Toolkits are left out: a rollback keeps a new toolkit installed beside the old one. ``compare_lock=False``
    leaves the venv's packages to the caller: a venv the rollback rebuilt from the lock holds what a new venv brings
    (pip, setuptools) besides it, so its package list differs byte for byte and is compared package by package."""
    out = []
    venv_then, venv_now = backed_up.get("venv") or {}, now.get("venv") or {}
    if venv_then.get("path") != venv_now.get("path"):
        out.append(f"serving venv: current is {venv_now.get('path')}, the backup had {venv_then.get('path')}")
    elif compare_lock and venv_then.get("lock_sha256") != venv_now.get("lock_sha256"):
        out.append(f"serving venv {venv_now.get('path')}: its packages differ from the backup's lock")
    cuda_then, cuda_now = backed_up.get("cuda") or {}, now.get("cuda") or {}
    if cuda_then.get("target") != cuda_now.get("target"):
        out.append(
            f"{cuda_now.get('link')}: points at {cuda_now.get('target')}, the backup had {cuda_then.get('target')}"
        )
    if cuda_then.get("alternatives") != cuda_now.get("alternatives"):
        out.append(f"CUDA alternatives: {cuda_now.get('alternatives')}, the backup had {cuda_then.get('alternatives')}")
    files_now = {f["path"]: f for f in now.get("files") or []}
    for record in backed_up.get("files") or []:
        got = files_now.get(record["path"], {"state": "absent"})
        if got.get("state") != record["state"]:
            out.append(f"{record['path']}: {got.get('state')}, the backup had {record['state']}")
        elif record["state"] == "file" and got.get("sha256") != record.get("sha256"):
            out.append(f"{record['path']}: content differs from the backup")
        elif record["state"] == "link" and got.get("target") != record.get("target"):
            out.append(f"{record['path']}: links to {got.get('target')}, the backup had {record.get('target')}")
    return out


def is_rollback_target(manifest, digest, venv_path=None) -> bool:
    """Whether a backup is what "roll back" means: the host as it was before it moved to what it runs now.

    A backup that describes the host as it is (same digest) is not; nor, when ``venv_path`` (the venv the host runs
    now) is given, one taken while the host already ran that venv or a repair of it: those are backups of a re-run or
    a repair on the present profile, and restoring one would put back a drifted copy of the present stack.
    """
    if manifest.get("digest") == digest:
        return False
    if venv_path:
        taken_on = ((manifest.get("snapshot") or {}).get("venv") or {}).get("path")
        if taken_on and venv_family(taken_on) == venv_family(venv_path):
            return False
    return True


# --------------------------------------------------------------------------- snapshot and manifest


def file_record(path):
    """What a restore needs to know about one file; absent files are recorded too (so a restore removes them)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return {"path": path, "state": "absent"}
    if os.path.islink(path):
        return {"path": path, "state": "link", "target": os.readlink(path)}
    return {
        "path": path,
        "state": "file",
        "mode": "%04o" % (st.st_mode & 0o7777),
        "uid": st.st_uid,
        "gid": st.st_gid,
        "sha256": sha256_file(path),
        "size": st.st_size,
        "backup": "files" + path,
    }


RESTORABLE = ("venv", "cuda", "files")


def snapshot_digest(snapshot) -> str:
    """Digest of what a restore puts back (venv, CUDA wiring, files): equal digests mean an equal host.

    Baseline results are kept with a backup but are not host state: a new post-check result alone does not
    make a new backup.
    """
    return sha256_text(canonical({key: snapshot.get(key) for key in RESTORABLE}))


def build_manifest(backup_id, created, host, profile, run_id, snapshot, checksums, archive=None, state=None):
    """``snapshot`` is what the host looked like; ``checksums`` covers every file of the backup folder; ``state`` is
    the verdict on that host when the backup was taken (``recorded_state``)."""
    return {
        "format": FORMAT_VERSION,
        "collection_version": COLLECTION_VERSION,
        "id": backup_id,
        "created": created,
        "host": host,
        "profile": profile,
        "run_id": run_id,
        "digest": snapshot_digest(snapshot),
        "snapshot": snapshot,
        "checksums": checksums,
        "archive": archive,
        "state": state,
    }


def checksum_tree(root, skip=(MANIFEST, MANIFEST_SUM)):
    """sha256 of every regular file under ``root``, keyed by its relative path."""
    sums = {}
    for folder, dirs, names in os.walk(root):
        dirs.sort()
        for name in sorted(names):
            full = os.path.join(folder, name)
            rel = os.path.relpath(full, root)
            if rel in skip or os.path.islink(full):
                continue
            sums[rel] = sha256_file(full)
    return sums


def write_manifest(folder, manifest):
    text = json.dumps(manifest, indent=2, sort_keys=True) + "\n"
    with open(os.path.join(folder, MANIFEST), "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    with open(os.path.join(folder, MANIFEST_SUM), "w", encoding="utf-8") as handle:
        handle.write(f"{sha256_text(text)}  {MANIFEST}\n")
        handle.flush()
        os.fsync(handle.fileno())


def archive_venv(venv, dest):
    """A gzip tar of the venv with paths relative to its parent, so it unpacks beside its siblings."""
    with tarfile.open(dest, "w:gz", compresslevel=1) as tar:
        tar.add(venv, arcname=os.path.basename(venv.rstrip("/")))
    with tarfile.open(dest, "r:gz") as tar:
        return len(tar.getmembers())


# --------------------------------------------------------------------------- read and verify


def load_manifest(folder):
    """Parse ``manifest.json`` after checking it against its sha256 file; BackupError on any defect."""
    path = os.path.join(folder, MANIFEST)
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except FileNotFoundError as exc:
        raise BackupError(f"{path} is missing") from exc
    try:
        with open(os.path.join(folder, MANIFEST_SUM), encoding="utf-8") as handle:
            recorded = handle.read().split()[0]
    except (FileNotFoundError, IndexError) as exc:
        raise BackupError(f"{path}.sha256 is missing or empty") from exc
    if sha256_text(text) != recorded:
        raise BackupError(
            f"{path} does not match its sha256 (recorded {recorded[:12]}..., read {sha256_text(text)[:12]}...)"
        )
    try:
        manifest = json.loads(text)
    except ValueError as exc:
        raise BackupError(f"{path} is not valid JSON ({exc})") from exc
    return validate_manifest(manifest, path, os.path.basename(os.path.normpath(folder)))


def validate_manifest(manifest, path=MANIFEST, backup_id=None):
    """Return ``manifest`` when this collection can restore from it; else BackupError naming the file and the value.

    Every reader takes a manifest through load_manifest, which calls this (modules backup_manifest and backup_info,
    on the host and on the controller's copy). The callers add what to do: pick another backup, or restore it with
    the collection version that wrote it.
    """
    if not isinstance(manifest, dict):
        raise BackupError(f"{path} holds a {type(manifest).__name__}, expected a JSON object")
    version = manifest.get("format")
    if version not in FORMAT_VERSIONS or isinstance(version, bool):
        by = manifest.get("collection_version")
        if by == COLLECTION_VERSION:
            writer = f"edited since {COLLECTION} {by} wrote it"
        else:
            writer = f"written by {COLLECTION} {by}" if isinstance(by, str) and by else "written by another version"
            writer += ", restore it with that version"
        raise BackupError(
            f"{path} records format {version!r} (key format), {COLLECTION} {COLLECTION_VERSION} reads format "
            f"{', '.join(str(v) for v in FORMAT_VERSIONS)}: {writer}"
        )
    for key in MANIFEST_KEYS:
        if key not in manifest:
            raise BackupError(f"{path} lacks the field {key!r}")
    for key in ("snapshot", "checksums"):
        if not isinstance(manifest[key], dict):
            raise BackupError(f"{path} records {key} {manifest[key]!r}, expected a JSON object")
    if backup_id is not None and manifest["id"] != backup_id:
        raise BackupError(f"{path} names backup {manifest['id']!r} but lies in {backup_id!r}")
    return manifest


def verify_backup(folder, manifest, check_lock=True, scope="full"):
    """Prove the backup can restore: every file's checksum re-read, the lock parses, the archive lists.

    ``scope="lock"`` checks only the manifest and the venv lock; ``scope="copy"`` everything but the venv archive,
    which is what the controller keeps of a backup (enough to restore a host that lost its own, the venv rebuilt
    from the lock).
    """
    problems = []
    recorded = manifest.get("checksums", {})
    actual = checksum_tree(folder)
    if scope == "lock":
        recorded = {rel: value for rel, value in recorded.items() if rel == LOCK}
        actual = {rel: value for rel, value in actual.items() if rel == LOCK}
    elif scope == "copy":
        recorded = {rel: value for rel, value in recorded.items() if rel != ARCHIVE}
        actual = {rel: value for rel, value in actual.items() if rel != ARCHIVE}
    for rel in sorted(set(recorded) | set(actual)):
        if rel not in actual:
            problems.append(f"{rel} is missing")
        elif rel not in recorded:
            problems.append(f"{rel} is not in the manifest")
        elif actual[rel] != recorded[rel]:
            problems.append(f"{rel} sha256 {actual[rel][:12]}... differs from the manifest's {recorded[rel][:12]}...")
    venv = manifest["snapshot"].get("venv") or {}
    if venv.get("path") and check_lock:
        try:
            with open(os.path.join(folder, LOCK), encoding="utf-8") as handle:
                packages = parse_lock(handle.read())
            if len(packages) != venv.get("package_count"):
                problems.append(f"{LOCK} lists {len(packages)} packages, the manifest {venv.get('package_count')}")
        except (OSError, BackupError) as exc:
            problems.append(str(exc))
    archive = manifest.get("archive") or {}
    if archive and scope == "full":
        try:
            with tarfile.open(os.path.join(folder, ARCHIVE), "r:gz") as tar:
                count = len(tar.getmembers())
            if count != archive.get("members"):
                problems.append(f"{ARCHIVE} lists {count} members, the manifest {archive.get('members')}")
        except (OSError, tarfile.TarError) as exc:
            problems.append(f"{ARCHIVE} does not list: {exc}")
    return problems


def identity_problems(manifest, host, profile=None):
    """A manifest of another host, or of another profile, must never be restored here."""
    problems = []
    if manifest.get("host", {}).get("name") != host:
        problems.append(
            f"backup {manifest.get('id')} belongs to host {manifest.get('host', {}).get('name')!r}, not {host!r}"
        )
    if profile is not None and manifest.get("profile") != profile:
        problems.append(
            f"backup {manifest.get('id')} was taken for profile {manifest.get('profile')!r}, not {profile!r}"
        )
    return problems


def remove_tree(path):
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
