# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""NVIDIA redistributable manifests (redistrib_<release>.json): parse, select, verify, extract.

Plain functions, no Ansible: the modules cuda_redist_fetch (controller) and cuda_redist (host) call them.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
import shutil
import tarfile

from ansible_collections.gpufleet.upgrade.plugins.module_utils._hash_record import file_sha256

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
_SHA256_RE = re.compile(r"[0-9a-fA-F]{64}")
_SIZE_RE = re.compile(r"-?[0-9]+")
# NVIDIA's per-CUDA variants of one platform's archive: {"linux-x86_64": {"cuda13.1": {...}}} (cuda_variant).
_VARIANT_RE = re.compile(r"cuda[0-9]+(\.[0-9]+)*")
# Components NVIDIA renamed between releases (13.3 ships CCCL as "cccl"; 13.2 and before as "cuda_cccl").
# A profile naming the other one gets a hint instead of a bare "not in the manifest".
COMPONENT_ALIASES = {
    "cuda_cccl": ("cccl",),
    "cccl": ("cuda_cccl",),
}


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


def _is_archive(item) -> bool:
    return isinstance(item, dict) and "relative_path" in item


def _variants(item) -> dict:
    """A platform object holding per-CUDA archives ({"cuda13.1": {...}}), as NVIDIA writes cuda_variant entries.

    Keyed by name, not by content, so a damaged variant is reported as such instead of as a damaged archive.
    """
    if not isinstance(item, dict) or "relative_path" in item:
        return {}
    return {key: value for key, value in item.items() if _VARIANT_RE.fullmatch(key) and isinstance(value, dict)}


def platforms_of(manifest: dict, component: str) -> list[str]:
    entry = manifest.get(component) or {}
    return sorted(key for key, value in entry.items() if _is_archive(value) or _variants(value))


def manifest_label_of(manifest: dict) -> str:
    label = manifest.get("release_label")
    return f"redistrib_{label}.json" if isinstance(label, str) and label else "the manifest"


def _refetch_fix(label: str) -> str:
    name = posixpath.basename(label) if label.endswith(".json") else "redistrib_<release>.json"
    return (
        f"the manifest is damaged or was edited: copy {name} again from the profile's redist source"
        " (cuda.sources.redist) into the mirror"
    )


def _alias_hint(manifest: dict, component: str, label: str) -> str | None:
    present = [alias for alias in COMPONENT_ALIASES.get(component, ()) if alias in manifest]
    if not present:
        return None
    return (
        f"{component} is not in {label}; this release calls it {present[0]!r} \u2014 use that name in the profile's"
        " cuda.components (or cuda_toolkit_components)"
    )


def _check_components(manifest: dict, components, label: str) -> None:
    # A component is an object; anything else under a component's name (not a top-level key) is a damaged entry.
    damaged = [c for c in components if c in manifest and c not in MANIFEST_KEYS and not isinstance(manifest[c], dict)]
    if damaged:
        raise RedistError(
            "; ".join(
                f"{label}: {c} is {str(manifest[c])[:120]!r}, not a component entry; {_refetch_fix(label)}"
                for c in damaged
            ),
            kind="bad_entry",
        )
    unknown = [c for c in components if not isinstance(manifest.get(c), dict)]
    if not unknown:
        return
    known = components_of(manifest)
    hinted = {c: _alias_hint(manifest, c, label) for c in unknown}
    parts = [hint for hint in hinted.values() if hint]
    plain = [c for c in unknown if not hinted[c]]
    if plain:
        parts.append(
            f"component(s) {', '.join(plain)} not in {label}; remove them from cuda.components"
            f" (or cuda_toolkit_components). Components it offers: {', '.join(known)}"
        )
    raise RedistError("; ".join(parts), kind="unknown_component")


def _platform_key(entry: dict, platform: str) -> str | None:
    """The entry's key for this platform; linux-all archives (NVIDIA's platform-independent ones) fit any Linux."""
    for key in (platform, "linux-all"):
        if isinstance(entry.get(key), dict):
            return key
    return None


def select(
    manifest: dict, components, platform: str, manifest_label: str | None = None, release: str | None = None
) -> list[dict]:
    """Archives to install for one platform, in the order the components were asked for.

    `release` (X.Y.Z, default the manifest's release_label) picks the variant of components that NVIDIA ships per
    CUDA version (cuda_variant, e.g. cuda_compat's "cuda13.1" archives).
    """
    label = manifest_label or manifest_label_of(manifest)
    _check_components(manifest, components, label)
    missing = [c for c in components if _platform_key(manifest[c], platform) is None]
    if missing:
        offered = sorted({p for c in missing for p in platforms_of(manifest, c)})
        raise RedistError(
            f"{label} has no {platform} archive for {', '.join(missing)}"
            f" (it offers {', '.join(offered) or 'none'});"
            f" use a mirror that carries {platform} or leave hosts of this platform out of the play",
            kind="platform",
        )
    archives, problems = [], []
    for component in components:
        try:
            archives.append(_archive(manifest, component, platform, label, release))
        except RedistError as exc:
            problems.append(exc)
    if problems:
        raise RedistError("; ".join(str(p) for p in problems), kind=problems[0].kind)
    return archives


def _cuda_version(release) -> tuple[str, str] | None:
    match = re.match(r"^([0-9]+)\.([0-9]+)", str(release or ""))
    return (match.group(1), match.group(2)) if match else None


def _wanted_variants(release) -> list[str]:
    version = _cuda_version(release)
    return [f"cuda{version[0]}.{version[1]}", f"cuda{version[0]}"] if version else []


def pick_variant(variants, release) -> str | None:
    """The variant for this CUDA release: cudaX.Y, else cudaX, else the only one of major X."""
    for wanted in _wanted_variants(release):
        if wanted in variants:
            return wanted
    version = _cuda_version(release)
    if not version:
        return None
    same_major = [v for v in variants if re.fullmatch(rf"cuda{version[0]}(\.[0-9]+)*", v)]
    return same_major[0] if len(same_major) == 1 else None


def _archive(manifest: dict, component: str, platform: str, label: str, release: str | None = None) -> dict:
    entry = manifest[component]
    key = _platform_key(entry, platform)
    item, variant = entry[key], None
    # A linux-all archive serves every platform: name both, so an error says which host platform met it.
    where = key if key == platform else f"{key} (for {platform})"
    variants = _variants(item)
    if variants:
        release = release or manifest.get("release_label")
        variant = pick_variant(variants, release)
        if variant is None:
            wanted = " or ".join(_wanted_variants(release)) or "a cudaX.Y variant"
            raise RedistError(
                f"{label}: {component} is shipped per CUDA version (cuda_variant) and its {where} variants are"
                f" {', '.join(sorted(variants))}, none of them {wanted} (release {release!r}); remove {component}"
                " from the profile's cuda.components, or set cuda.release to a release whose manifest has that variant",
                kind="variant",
            )
        item, where = variants[variant], f"{where}/{variant}"
    return {
        "component": component,
        "name": entry.get("name", component),
        "version": _version_field(entry, component, where, label),
        "platform": platform,
        "variant": variant,
        "relative_path": _relative_path(item, component, where, label),
        "sha256": _sha256_field(item, component, where, label),
        "size": _size_field(item, component, where, label),
        "top_dir": top_dir(item["relative_path"]),
    }


def _bad_field(label, component, where, field, item, problem) -> RedistError:
    value = f"{item[field]!r}" if field in item else "missing"
    return RedistError(
        f"{label}: {component} {where} field {field!r} is {value} ({problem}); {_refetch_fix(label)}",
        kind="bad_entry",
    )


def _version_field(entry: dict, component: str, where: str, label: str) -> str:
    version = entry.get("version")
    if not isinstance(version, str) or not version.strip():
        # version belongs to the component, not the platform; `where` still says which plan met it.
        raise _bad_field(label, component, where, "version", entry, "version.json and the host model need it")
    return version


def _relative_path(item: dict, component: str, where: str, label: str) -> str:
    rel = item.get("relative_path")
    if not isinstance(rel, str) or not rel:
        raise _bad_field(label, component, where, "relative_path", item, "no archive path")
    if rel.startswith("/") or ".." in rel.split("/"):
        raise _bad_field(label, component, where, "relative_path", item, "it points outside the redist tree")
    return rel


def sha256_problem(sha) -> str | None:
    """Why `sha` is not a usable sha256 (64 hex digits, either case), or None."""
    if sha is None:
        return "the archive cannot be verified without it"
    if not isinstance(sha, str) or not _SHA256_RE.fullmatch(sha):
        return "not 64 hexadecimal digits"
    return None


def size_problem(size) -> str | None:
    """Why `size` is not a byte count, or None. NVIDIA writes sizes as strings of digits; an int is accepted
    too, bool (an int subclass) is not."""
    if isinstance(size, bool) or not isinstance(size, (int, str)) or not _SIZE_RE.fullmatch(str(size)):
        return "not a whole number of bytes"
    if int(size) < 0:
        return "a negative byte count"
    return None


def _sha256_field(item: dict, component: str, where: str, label: str) -> str:
    problem = sha256_problem(item.get("sha256"))
    if problem:
        raise _bad_field(label, component, where, "sha256", item, problem)
    return item["sha256"].lower()


def _size_field(item: dict, component: str, where: str, label: str) -> int:
    problem = size_problem(item.get("size"))
    if problem:
        raise _bad_field(label, component, where, "size", item, problem)
    return int(item["size"])


def check_release(manifest: dict, release: str, label: str | None = None) -> None:
    """Raise unless the manifest is the one of `release` (its release_label), e.g. another release's file copied
    under this name into a mirror."""
    have = manifest.get("release_label")
    if have != release:
        name = manifest_name(release)
        raise RedistError(
            f"{label or name}: release_label is {have!r}, not {release!r}: the file under this name is not the"
            f" manifest of CUDA {release}; {_refetch_fix(name)}",
            kind="release_mismatch",
        )


def top_dir(relative_path: str) -> str:
    base = posixpath.basename(relative_path)
    for suffix in ARCHIVE_SUFFIXES:
        if base.endswith(suffix):
            return base[: -len(suffix)]
    return base


def plan(manifest: dict, components, platforms, manifest_label: str | None = None, release: str | None = None) -> dict:
    """platform -> archives, for every platform some host needs."""
    return {p: select(manifest, components, p, manifest_label, release) for p in sorted(set(platforms))}


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


def verify_file(
    path: str,
    sha256: str,
    size: int | None = None,
    label: str | None = None,
    component: str | None = None,
    manifest: str | None = None,
) -> None:
    """Raise unless the file has the manifest's size and sha256 (compared case-insensitively).

    The sha256 decides what a size difference means: same sha256, other size -> the manifest's size is wrong;
    other sha256 and smaller -> a cut download; other sha256 and larger -> the mirror serves another file.
    """
    label = label or path
    what = f"{component} archive {label}" if component else label
    listed = f" in {manifest}" if manifest else ""
    actual_size = os.path.getsize(path)
    actual = file_sha256(path)
    if actual == sha256.strip().lower():
        if size is not None and actual_size != size:
            raise RedistError(
                f"{what} matches its sha256 but is {actual_size} bytes, while the size field{listed} says {size}:"
                f" the manifest's size is wrong, not the download. Correct the size of {component or 'the archive'}"
                f"{listed} (or copy the manifest again from NVIDIA); running again will not help",
                kind="manifest_size",
            )
        return
    if size is not None and actual_size < size:
        raise RedistError(
            f"{what} is truncated: {actual_size} of {size} bytes; the download was cut short, run again"
            " (the partial file is discarded)",
            kind="truncated",
        )
    if size is not None and actual_size > size:
        raise RedistError(
            f"{what} is {actual_size} bytes, larger than the {size} bytes{listed}, and its sha256 {actual} is not"
            f" the manifest's {sha256}; the mirror serves another file under this name. Refresh the mirror from"
            " NVIDIA and run again",
            kind="size",
        )
    raise RedistError(
        f"{what} has sha256 {actual}, the manifest says {sha256}; the archive was altered or the mirror"
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
