# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""NVIDIA redistributable manifests (redistrib_<release>.json): parse, select, verify, extract.

Plain functions, no Ansible: the modules cuda_redist_fetch (controller) and cuda_redist (host) call them.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import re
import shutil
import tarfile

# uname -m -> the manifest's platform key. NVIDIA calls server-class Arm "sbsa".
PLATFORM_BY_MACHINE = {
    "x86_64": "linux-x86_64",
    "amd64": "linux-x86_64",
    "aarch64": "linux-sbsa",
    "arm64": "linux-sbsa",
    "ppc64le": "linux-ppc64le",
}
MANIFEST_KEYS = ("release_date", "release_label", "release_product")
ARCHIVE_SUFFIXES = (".tar.xz", ".tar.gz", ".tar.bz2", ".tgz", ".tar")
_RELEASE_RE = re.compile(r"^[0-9]+\.[0-9]+\.[0-9]+$")
_LISTED_RE = re.compile(r"redistrib_([0-9]+\.[0-9]+\.[0-9]+)\.json")


class RedistError(Exception):
    """A problem the user can fix; `kind` lets callers and tests tell them apart."""

    def __init__(self, message, kind="invalid"):
        super().__init__(message)
        self.kind = kind


def manifest_name(release: str) -> str:
    if not _RELEASE_RE.match(str(release)):
        raise RedistError(
            f"CUDA release {release!r} is not of the form X.Y.Z; set the profile's cuda.release (e.g. 13.0.2)",
            kind="unknown_version",
        )
    return f"redistrib_{release}.json"


def manifest_url(base_url: str, release: str) -> str:
    return base_url.rstrip("/") + "/" + manifest_name(release)


def platform_for(machine: str) -> str:
    try:
        return PLATFORM_BY_MACHINE[machine]
    except KeyError:
        raise RedistError(
            f"machine type {machine!r} has no NVIDIA redist platform (known: {', '.join(sorted(PLATFORM_BY_MACHINE))})",
            kind="platform",
        ) from None


def looks_like_html(raw: bytes) -> bool:
    head = raw[:512].lstrip().lower()
    return head.startswith((b"<!doctype html", b"<html", b"<head", b"<?xml"))


def parse_manifest(raw: bytes, source: str) -> dict:
    """Parse a manifest; a mirror's HTML error page or a truncated file gives a clear error."""
    if looks_like_html(raw):
        raise RedistError(
            f"{source} returned an HTML page, not a redist manifest; point the redist URL at the directory"
            " that holds redistrib_<release>.json (a mirror of NVIDIA's compute/cuda/redist)",
            kind="html",
        )
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise RedistError(
            f"{source} is not valid JSON ({exc}); the download is truncated or not a manifest", kind="json"
        ) from exc
    if not isinstance(data, dict) or not any(key in data for key in MANIFEST_KEYS):
        raise RedistError(f"{source} is JSON but not a redist manifest (no release_label)", kind="json")
    return data


def components_of(manifest: dict) -> list[str]:
    return sorted(key for key, value in manifest.items() if isinstance(value, dict) and "version" in value)


def platforms_of(manifest: dict, component: str) -> list[str]:
    entry = manifest.get(component) or {}
    return sorted(key for key, value in entry.items() if isinstance(value, dict) and "relative_path" in value)


def select(manifest: dict, components, platform: str, manifest_label: str = "the manifest") -> list[dict]:
    """Archives to install for one platform, in the order the components were asked for."""
    known = components_of(manifest)
    unknown = [c for c in components if c not in known]
    if unknown:
        raise RedistError(
            f"component(s) {', '.join(unknown)} not in {manifest_label}; remove them from cuda.components"
            f" (or cuda_toolkit_components). Components it offers: {', '.join(known)}",
            kind="unknown_component",
        )
    missing = [c for c in components if platform not in platforms_of(manifest, c)]
    if missing:
        offered = sorted({p for c in missing for p in platforms_of(manifest, c)})
        raise RedistError(
            f"{manifest_label} has no {platform} archive for {', '.join(missing)}"
            f" (it offers {', '.join(offered) or 'none'});"
            f" use a mirror that carries {platform} or leave hosts of this platform out of the play",
            kind="platform",
        )
    return [_archive(manifest, c, platform) for c in components]


def _archive(manifest: dict, component: str, platform: str) -> dict:
    entry = manifest[component]
    item = entry[platform]
    rel = item["relative_path"]
    if rel.startswith("/") or ".." in rel.split("/"):
        raise RedistError(f"manifest entry {component}/{platform} has an unsafe relative_path {rel!r}", kind="json")
    return {
        "component": component,
        "name": entry.get("name", component),
        "version": entry["version"],
        "platform": platform,
        "relative_path": rel,
        "sha256": item["sha256"].lower(),
        "size": int(item["size"]),
        "top_dir": top_dir(rel),
    }


def top_dir(relative_path: str) -> str:
    base = posixpath.basename(relative_path)
    for suffix in ARCHIVE_SUFFIXES:
        if base.endswith(suffix):
            return base[: -len(suffix)]
    return base


def plan(manifest: dict, components, platforms, manifest_label: str = "the manifest") -> dict:
    """platform -> archives, for every platform some host needs."""
    return {p: select(manifest, components, p, manifest_label) for p in sorted(set(platforms))}


def unique_archives(per_platform: dict) -> list[dict]:
    seen, out = set(), []
    for archives in per_platform.values():
        for archive in archives:
            if archive["relative_path"] not in seen:
                seen.add(archive["relative_path"])
                out.append(archive)
    return out


def required_bytes(archives, extract_factor: float) -> int:
    """Archives pushed to the host plus their extracted size (estimated: archives are xz, about 3-4x)."""
    total = sum(a["size"] for a in archives)
    return int(total * (1 + extract_factor))


def file_sha256(path: str, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(chunk), b""):
            digest.update(block)
    return digest.hexdigest()


def verify_file(path: str, sha256: str, size: int | None = None, label: str | None = None) -> None:
    """Raise unless the file has the manifest's size and sha256."""
    label = label or path
    actual_size = os.path.getsize(path)
    if size is not None and actual_size < size:
        raise RedistError(
            f"{label} is truncated: {actual_size} of {size} bytes; the download was cut short, run again"
            " (the partial file is discarded)",
            kind="truncated",
        )
    actual = file_sha256(path)
    if actual != sha256.lower():
        raise RedistError(
            f"{label} has sha256 {actual}, the manifest says {sha256}; the archive was altered or the mirror"
            " is out of step with its manifest. Refresh the mirror from NVIDIA and run again",
            kind="sha256",
        )


def releases_in_listing(text: str) -> list[str]:
    """Releases named by a mirror's directory listing (for 'unknown version' errors)."""
    return sorted(set(_LISTED_RE.findall(text)), key=lambda r: tuple(int(x) for x in r.split(".")))


def version_json(archives, release: str) -> dict:
    """version.json in NVIDIA's format: "cuda" holds the release, one entry per component."""
    out = {"cuda": {"name": "CUDA SDK", "version": release}}
    for archive in archives:
        out[archive["component"]] = {"name": archive["name"], "version": archive["version"]}
    return out


def _member_ok(member: tarfile.TarInfo) -> bool:
    name = member.name
    if name.startswith("/") or ".." in name.split("/"):
        return False
    if member.issym() or member.islnk():
        target = member.linkname
        if target.startswith("/") or ".." in posixpath.normpath(posixpath.join(posixpath.dirname(name), target)).split(
            "/"
        ):
            return False
    return member.isfile() or member.isdir() or member.issym() or member.islnk()


def extract_archive(path: str, top: str, dest: str) -> list[str]:
    """Extract one archive and merge its top folder into dest. Returns the relative paths it wrote."""
    work = os.path.join(dest, ".extract-" + top)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    with tarfile.open(path) as tar:
        members = tar.getmembers()
        bad = [m.name for m in members if not _member_ok(m)]
        if bad:
            raise RedistError(f"{path} holds unsafe entries ({', '.join(bad[:3])}); refusing to extract", kind="unsafe")
        for member in members:  # files belong to the installing user, not the archive's build account
            member.uid, member.gid, member.uname, member.gname = os.geteuid(), os.getegid(), "", ""
        tops = {m.name.split("/", 1)[0] for m in members}
        if tops != {top}:
            raise RedistError(f"{path} should unpack to one folder {top!r}, found {sorted(tops)[:5]}", kind="layout")
        if hasattr(tarfile, "data_filter"):
            tar.extractall(work, filter="tar")
        else:  # pragma: no cover - Python without extraction filters; members were checked above
            tar.extractall(work)
    written = merge_tree(os.path.join(work, top), dest)
    shutil.rmtree(work)
    return written


def merge_tree(src: str, dest: str) -> list[str]:
    """Move src's contents into dest; directories merge, files of later archives win (e.g. LICENSE)."""
    written = []
    for dirpath, dirnames, filenames in os.walk(src):
        rel = os.path.relpath(dirpath, src)
        target_dir = dest if rel == "." else os.path.join(dest, rel)
        os.makedirs(target_dir, exist_ok=True)
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            target = os.path.join(target_dir, name)
            if os.path.lexists(target) and not os.path.isdir(target):
                os.unlink(target)
            os.replace(os.path.join(dirpath, name), target)
            written.append(os.path.normpath(os.path.join(rel, name)))
    return written
