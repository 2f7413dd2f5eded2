#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: cuda_redist_fetch
short_description: Fetch NVIDIA's redist manifest and archives once into a controller-side cache
description:
  - Meant to run once per play on the controller (C(delegate_to=localhost), C(run_once=true)).
  - Reads C(redistrib_<release>.json) from O(base_url) (or the cache), checks that every component in
    O(components) exists for the platform of every host in O(hosts), and with O(download) fetches each
    archive not yet in O(cache_dir), verifying size and sha256 against the manifest before keeping it.
  - Cached archives are verified again each run; a bad one is fetched anew. A partial download is never kept.
  - Errors say which host, which value and what to do (wrong release, unknown component or one NVIDIA renamed
    such as C(cuda_cccl) -> C(cccl) in 13.3, platform missing from the manifest, another release's manifest under
    the name, an entry with a missing or bad C(sha256), C(size), C(relative_path) or C(version), no
    C(cuda_variant) archive for the release, mirror unreachable or answering HTML, truncated or altered archive).
    A manifest with such an entry is not cached.
  - Components shipped per CUDA version (C(cuda_variant), e.g. C(cuda_compat) from 13.1) get the archive of
    O(release)'s C(cudaX.Y) (else C(cudaX)); the plan's C(variant) names it. C(linux-all) archives serve every
    platform.
  - In check mode nothing is written; the manifest is read into memory and the archives that would be
    fetched are reported.
version_added: 0.1.0
options:
  base_url:
    description: URL of the redist tree (NVIDIA's C(compute/cuda/redist) or a mirror); C(file://) works.
    type: str
    required: true
  release:
    description: CUDA release, C(X.Y.Z); selects C(redistrib_<release>.json).
    type: str
    required: true
  components:
    description: Manifest keys to fetch (C(cuda_nvcc), C(cuda_cudart), ...).
    type: list
    elements: str
    required: true
  hosts:
    description: Inventory host name to its C(uname -m); decides the platforms fetched, and names hosts in errors.
    type: dict
    required: true
  cache_dir:
    description: Controller folder of the cache; keeps the mirror's layout below it.
    type: path
    required: true
  download:
    description: Fetch the archives too; false reads and checks the manifest only.
    type: bool
    default: true
  timeout:
    description: Seconds before a silent connection is given up.
    type: int
    default: 60
  validate_certs:
    description: Check the mirror's TLS certificate.
    type: bool
    default: true
  http_agent:
    description: User-Agent sent to the mirror, so its logs can attribute the traffic to a fleet run.
    type: str
    default: gpufleet.upgrade.cuda_redist_fetch
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  platform:
    platforms: posix
author:
  - gpufleet maintainers (@gpufleet)
"""

EXAMPLES = r"""
- name: Fetch the 13.0.2 archives for every host once
  gpufleet.upgrade.cuda_redist_fetch:
    base_url: http://127.0.0.1:38102/redist
    release: 13.0.2
    components: [cuda_nvcc, cuda_crt, libnvvm, cuda_cudart, cuda_cccl]
    hosts: "{{ dict(ansible_play_hosts | zip(ansible_play_hosts | map('extract', hostvars, 'ansible_architecture'))) }}"
    cache_dir: ~/.gpufleet/cache/redist
  delegate_to: localhost
  run_once: true
"""

RETURN = r"""
manifest_path:
  description: Cached manifest (absent in check mode when it was not cached yet).
  returned: success
  type: str
release_label:
  description: The manifest's C(release_label).
  returned: success
  type: str
plan:
  description:
    - Platform to the archives it needs (component, name, version, platform, variant, relative_path, sha256, size,
      top_dir). C(sha256) is lower case; C(size) an int; C(variant) the C(cudaX.Y) archive picked, else null.
  returned: success
  type: dict
platforms:
  description: Host to its manifest platform (C(linux-x86_64), C(linux-sbsa)).
  returned: success
  type: dict
downloaded:
  description: Relative paths fetched from O(base_url) by this run (would be, in check mode).
  returned: success
  type: list
  elements: str
downloaded_bytes:
  description: Bytes fetched from O(base_url) by this run, manifest included.
  returned: success
  type: int
"""

import http.client
import os
import tempfile
import urllib.error
import urllib.parse

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.urls import open_url

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _redist as rd
from ansible_collections.gpufleet.upgrade.plugins.module_utils._hash_record import HashRecord

CHUNK = 1 << 20


class Fetcher:
    def __init__(self, module):
        self.module = module
        self.p = module.params
        self.base = self.p["base_url"].rstrip("/")
        self.manifest_url = f"{self.base}/{rd.manifest_name(self.p['release'])}"
        self.bytes = 0

    def open(self, rel, what):
        url = f"{self.base}/{rel}"
        try:
            return open_url(
                url,
                timeout=self.p["timeout"],
                validate_certs=self.p["validate_certs"],
                follow_redirects="safe",
                http_agent=self.p["http_agent"],
            )
        except urllib.error.HTTPError as exc:
            if exc.code == 404 and what == "manifest":
                raise self.unknown_release(url) from exc
            raise rd.RedistError(
                f"{url} answered HTTP {exc.code} {exc.reason}; check that the redist mirror (gpufleet_redist_url or"
                f" the profile's cuda.sources.redist.url) holds the {what}",
                kind="http",
            ) from exc
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
            reason = getattr(exc, "reason", exc)
            if isinstance(reason, FileNotFoundError) and what == "manifest":
                raise self.unknown_release(url) from exc
            raise rd.RedistError(
                f"cannot reach the redist mirror at {url} ({reason}); start the mirror or set gpufleet_redist_url"
                " to one the controller can reach",
                kind="unreachable",
            ) from exc

    def unknown_release(self, url):
        listed = []
        try:
            if self.base.startswith("file://"):
                text = " ".join(os.listdir(urllib.parse.urlparse(self.base).path))
            else:
                text = (
                    open_url(self.base + "/", timeout=self.p["timeout"], http_agent=self.p["http_agent"])
                    .read(1 << 20)
                    .decode("utf-8", "replace")
                )
            listed = rd.releases_in_listing(text)
        except Exception:  # the listing is only a hint for the message
            pass
        known = f"; the mirror lists {', '.join(listed)}" if listed else ""
        return rd.RedistError(
            f"CUDA release {self.p['release']!r} is unknown to the redist mirror: {url} does not exist{known}."
            " Fix cuda.release in the profile (or cuda_toolkit_release)",
            kind="unknown_version",
        )

    def read_cached(self, path):
        """The cached manifest, or None when absent or damaged (a damaged one is fetched again)."""
        if not os.path.isfile(path):
            return None
        with open(path, "rb") as handle:
            raw = handle.read()
        try:
            return rd.parse_manifest(raw, path)
        except rd.RedistError:
            return None

    def fetch_manifest(self, rel):
        """The mirror's manifest and its bytes; the caller caches them only once they are known to be usable."""
        response = self.open(rel, "manifest")
        try:
            raw = response.read()
        except http.client.IncompleteRead as exc:
            raise rd.RedistError(f"{self.base}/{rel} was cut short; run again", kind="truncated") from exc
        self.bytes += len(raw)
        return rd.parse_manifest(raw, f"{self.base}/{rel}"), raw

    def download(self, archive, dest):
        rel = archive["relative_path"]
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        response = self.open(rel, f"archive {rel}")
        fd, part = tempfile.mkstemp(dir=os.path.dirname(dest), prefix=".part-")
        try:
            with os.fdopen(fd, "wb") as out:
                try:
                    for block in iter(lambda: response.read(CHUNK), b""):
                        out.write(block)
                        self.bytes += len(block)
                except http.client.IncompleteRead as exc:
                    raise rd.RedistError(
                        f"{self.base}/{rel} was cut short after {out.tell()} of {archive['size']} bytes; run again",
                        kind="truncated",
                    ) from exc
            with open(part, "rb") as check:
                if rd.looks_like_html(check.read(512)):
                    raise rd.RedistError(
                        f"{self.base}/{rel} returned an HTML page, not the archive; fix the redist mirror", kind="html"
                    )
            rd.verify_file(
                part,
                archive["sha256"],
                archive["size"],
                label=f"{self.base}/{rel}",
                component=archive["component"],
                manifest=self.manifest_url,
            )
            os.replace(part, dest)
        finally:
            if os.path.exists(part):
                os.unlink(part)


def write_atomic(path, raw):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".part-")
    with os.fdopen(fd, "wb") as out:
        out.write(raw)
    os.replace(tmp, path)


def cached_ok(path, archive, record):
    """The cached archive has the manifest's size and sha256 (read only if it changed since its hash was recorded:
    the cache is read by every batch of a run)."""
    if not os.path.isfile(path) or os.path.getsize(path) != archive["size"]:
        return False
    return record.sha256(os.path.relpath(path, record.folder)) == archive["sha256"].lower()


def host_platforms(hosts):
    platforms, errors = {}, []
    for host, machine in sorted(hosts.items()):
        try:
            platforms[host] = rd.platform_for(str(machine))
        except rd.RedistError as exc:
            errors.append(f"host {host}: {exc}; leave it out of the play")
    if errors:
        raise rd.RedistError("; ".join(errors), kind="platform")
    return platforms


def plan_for(manifest, platforms, p, label):
    # The release decides the file name and the cuda_variant picked: a manifest of another release must not plan.
    rd.check_release(manifest, p["release"], label)
    per_platform = {}
    for platform in sorted(set(platforms.values())):
        try:
            per_platform[platform] = rd.select(manifest, p["components"], platform, label, release=p["release"])
        except rd.RedistError as exc:
            names = ", ".join(h for h, pl in platforms.items() if pl == platform)
            raise rd.RedistError(f"host(s) {names} ({platform}): {exc}", kind=exc.kind) from exc
    return per_platform


def run(module):
    p = module.params
    fetcher = Fetcher(module)
    platforms = host_platforms(p["hosts"])
    rel = rd.manifest_name(p["release"])
    manifest_path = os.path.join(p["cache_dir"], rel)
    manifest, fetched = fetcher.read_cached(manifest_path), False
    per_platform, cached_error = None, None
    if manifest is not None:
        try:
            per_platform = plan_for(manifest, platforms, p, manifest_path)
        except rd.RedistError as exc:
            # The mirror's copy may have been fixed since it was cached: read it again.
            manifest, cached_error = None, exc
    if manifest is None:
        try:
            manifest, raw = fetcher.fetch_manifest(rel)
        except rd.RedistError:
            if cached_error:  # the mirror cannot be read now: the cached copy's problem is the one to fix
                raise cached_error from None
            raise
        fetched = True
        # Planned before caching, so a manifest with a bad entry is never kept (nothing is written on error).
        per_platform = plan_for(manifest, platforms, p, fetcher.manifest_url)
        if not module.check_mode:
            write_atomic(manifest_path, raw)
    downloaded = [rel] if fetched else []
    if p["download"]:
        record = HashRecord(p["cache_dir"])
        for archive in rd.unique_archives(per_platform):
            dest = os.path.join(p["cache_dir"], archive["relative_path"])
            if cached_ok(dest, archive, record):
                continue
            downloaded.append(archive["relative_path"])
            if not module.check_mode:
                fetcher.download(archive, dest)
                record.note(archive["relative_path"], archive["sha256"].lower())
        if not module.check_mode:
            record.save()
    return {
        "changed": bool(downloaded),
        "manifest_path": manifest_path,
        "release_label": manifest.get("release_label"),
        "plan": per_platform,
        "platforms": platforms,
        "downloaded": downloaded,
        "downloaded_bytes": fetcher.bytes,
    }


def main():
    module = AnsibleModule(
        argument_spec={
            "base_url": {"type": "str", "required": True},
            "release": {"type": "str", "required": True},
            "components": {"type": "list", "elements": "str", "required": True},
            "hosts": {"type": "dict", "required": True},
            "cache_dir": {"type": "path", "required": True},
            "download": {"type": "bool", "default": True},
            "timeout": {"type": "int", "default": 60},
            "validate_certs": {"type": "bool", "default": True},
            "http_agent": {"type": "str", "default": "gpufleet.upgrade.cuda_redist_fetch"},
        },
        supports_check_mode=True,
    )
    try:
        result = run(module)
    except rd.RedistError as exc:
        module.fail_json(msg=str(exc), kind=exc.kind)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
