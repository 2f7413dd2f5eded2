#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: cuda_redist
short_description: Install a CUDA toolkit side by side from NVIDIA redist archives already on the host
description:
  - Builds the toolkit in a staging folder next to O(dest) from the archives in O(archive_dir) (as planned by
    M(gpufleet.upgrade.cuda_redist_fetch)), writes C(version.json) in NVIDIA's format, checks that the new
    C(nvcc --version) reports the release, and only then renames the staging folder to O(dest).
    An interrupted run leaves no partial toolkit at O(dest); its staging folder is removed by the next run.
  - Every archive is verified against the manifest's size and sha256 before extraction.
  - Other toolkits are never touched. A O(dest) that holds something else than a toolkit, or a toolkit this
    collection did not install that does not match, is refused.
  - Changed only when O(dest) lacks the release or a component; the diff names the components.
version_added: 0.1.0
options:
  dest:
    description: Toolkit folder to create, e.g. C(/usr/local/cuda-13.0).
    type: path
    required: true
  release:
    description: CUDA release, C(X.Y.Z) (C(13.0.2)); C(version.json) records it. Checked first, in check mode too.
    type: str
    required: true
  archives:
    description: The archives for this host's platform, as in RV(gpufleet.upgrade.cuda_redist_fetch#module:plan).
    type: list
    elements: dict
    required: true
  archive_dir:
    description: Folder on the host holding the archives (file names as in the manifest). Not read in check mode.
    type: path
  pull_url:
    description:
      - Where the host pulls the archives from (the fleet cache's C(redist) mount, e.g. C(http://controller:8765/redist));
        each archive O(archive_dir) lacks, or holds otherwise than the manifest says, is downloaded to
        C(<archive_dir>/<file name>) from C(<pull_url>/<relative_path>) after the free space check, in the same call
        (the folder is created, mode C(0700)). Every archive is then checked against the manifest's sha256 and size
        before it is extracted. Empty (the default) when the controller pushed the archives.
    type: str
    default: ""
    version_added: 0.2.0
  pull_timeout:
    description: Seconds each pull may wait for the fleet cache to answer.
    type: int
    default: 600
    version_added: 0.2.0
  extract_factor:
    description: Extracted size as a multiple of the archives' size, for the free space check.
    type: float
    default: 4.0
  link_before:
    description:
      - The global CUDA link's state before this install (C(cuda_toolkit_info)'s C(link) - C(exists), C(target),
        C(resolved)), kept in the install marker; link policy C(keep) holds the link to it on later runs, and the host
        model judges it. A reinstall keeps the first install's record.
    type: dict
  reinstall:
    description:
      - Build and swap in the toolkit even when O(dest) holds it complete, e.g. when the host model (module
        M(gpufleet.upgrade.host_state)) found files changed since the install. The old tree is renamed away first.
    type: bool
    default: false
  verify_nvcc:
    description: Require C(bin/nvcc --version) of the new toolkit to report O(release)'s C(major.minor).
    type: bool
    default: true
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
  platform:
    platforms: posix
author:
  - gpufleet maintainers (@gpufleet)
"""

EXAMPLES = r"""
- name: Install CUDA 13.0 beside the existing toolkits
  gpufleet.upgrade.cuda_redist:
    dest: /usr/local/cuda-13.0
    release: 13.0.2
    archives: "{{ fetched.plan['linux-x86_64'] }}"
    archive_dir: /usr/local/.gpufleet-redist
"""

RETURN = r"""
home:
  description: The toolkit folder (O(dest)).
  returned: success
  type: str
installed:
  description: Components written by this run (would be, in check mode).
  returned: success
  type: list
  elements: str
status_before:
  description: What O(dest) was before (absent, present, incomplete, other_release).
  returned: success
  type: str
nvcc_version:
  description: C(nvcc --version) of the new toolkit (C(13.0.88)).
  returned: when installed and O(verify_nvcc)
  type: str
pulled:
  description: The archives (relative paths) this call downloaded from O(pull_url); those already there are left out.
  returned: when installed with O(pull_url)
  type: list
  elements: str
"""

import datetime
import hashlib
import http.client
import json
import os
import shutil

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.urls import open_url

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _redist as rd
from ansible_collections.gpufleet.upgrade.plugins.module_utils import _toolkit as tk


def describe(release, components):
    lines = [f"release: {release or 'none'}"] + [f"  {c}" for c in components]
    return "\n".join(lines) + "\n"


def refuse(module, dest, status):
    if status["status"] == "not_a_toolkit":
        module.fail_json(
            msg=f"{dest} exists but is not a CUDA toolkit ({status['reason']}); move it away or set cuda_toolkit_root"
            " to another folder. Nothing was installed",
            kind="not_a_toolkit",
        )
    module.fail_json(
        msg=f"{dest} holds CUDA {status.get('release')} installed by other means"
        f"{' without ' + ', '.join(status['missing']) if status['missing'] else ''}; this role does not overwrite"
        " toolkits it did not install. Remove it, or install the profile's components with the method that made it",
        kind="foreign",
    )


ARCHIVE_KEYS = ("component", "version", "relative_path", "sha256", "size", "top_dir")


def check_archives(module, archives):
    """archives come from cuda_redist_fetch's plan; a hand-made or truncated list fails here, not with a KeyError."""
    problems = []
    for index, archive in enumerate(archives):
        missing = [key for key in ARCHIVE_KEYS if key not in archive]
        if missing:
            problems.append(f"archives[{index}] ({archive.get('component', '?')}) lacks {', '.join(missing)}")
            continue
        for field, problem in (
            ("size", rd.size_problem(archive["size"])),
            ("sha256", rd.sha256_problem(archive["sha256"])),
        ):
            if problem:
                problems.append(
                    f"archives[{index}] ({archive['component']}) has {field} {archive[field]!r} ({problem})"
                )
    if problems:
        module.fail_json(
            msg="; ".join(problems) + ". Pass the plan of gpufleet.upgrade.cuda_redist_fetch for this host's platform"
            " unchanged. Nothing was installed",
            kind="archives",
        )
    for archive in archives:
        archive["size"] = int(archive["size"])


def preflight(module, dest, archives):
    parent = os.path.dirname(dest)
    if not os.access(parent, os.W_OK | os.X_OK):
        module.fail_json(
            msg=f"cannot write {parent} as uid {os.geteuid()}; run the role with become: true (root is needed to"
            " install into it) or set cuda_toolkit_root to a folder this user owns",
            kind="permission",
        )
    stat = os.statvfs(parent)
    free = stat.f_bavail * stat.f_frsize
    need = int(sum(a["size"] for a in archives) * module.params["extract_factor"])
    if free < need:
        module.fail_json(
            msg=f"{parent} has {free // 2**20} MiB free, the toolkit needs about {need // 2**20} MiB; free space there"
            " or set cuda_toolkit_root to a larger file system",
            kind="disk",
        )


def _holds(path, archive) -> bool:
    """Whether path is the manifest's archive already (a run that stopped after its pull: nothing to fetch again)."""
    try:
        rd.verify_file(path, archive["sha256"], archive["size"])
    except (rd.RedistError, OSError):
        return False
    return True


def pull(module, archives) -> tuple[list, set]:
    """Download into archive_dir each archive it lacks. Returns the archives downloaded (relative paths) and the
    archive paths already checked against the manifest: those found in place (_holds hashed them) and those whose
    download hashed to the manifest's sha256 and size as it was written. build() hashes only the others, so no
    archive is read twice; one that did not match is left to build(), which names what is wrong with it."""
    archive_dir, base = module.params["archive_dir"], module.params["pull_url"].rstrip("/")
    os.makedirs(archive_dir, mode=0o700, exist_ok=True)
    pulled, checked = [], set()
    for archive in archives:
        path = os.path.join(archive_dir, os.path.basename(archive["relative_path"]))
        if os.path.isfile(path) and _holds(path, archive):
            checked.add(path)
            continue
        url = f"{base}/{archive['relative_path']}"
        tmp = f"{path}.part"
        digest, size = hashlib.sha256(), 0
        try:
            with open_url(url, timeout=module.params["pull_timeout"]) as resp, open(tmp, "wb") as out:
                for block in iter(lambda: resp.read(1 << 20), b""):
                    digest.update(block)
                    size += len(block)
                    out.write(block)
            os.replace(tmp, path)
        except (OSError, http.client.HTTPException) as exc:
            raise rd.RedistError(
                f"{archive['component']} archive {url} could not be pulled to {path}: {exc}; fix: check that the"
                " fleet cache answers and that the archive folder has room, then run again",
                kind="pull",
            ) from exc
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        pulled.append(archive["relative_path"])
        if digest.hexdigest() == archive["sha256"].strip().lower() and size == archive["size"]:
            checked.add(path)
    return pulled, checked


def build(module, staging, archives, manifest, checked=frozenset()):
    """Extract every archive into staging, each checked against the manifest first unless in checked (pull() did)."""
    archive_dir = module.params["archive_dir"]
    for archive in archives:
        path = os.path.join(archive_dir, os.path.basename(archive["relative_path"]))
        if not os.path.isfile(path):
            raise rd.RedistError(
                f"archive {path} is missing on the host; run the role again to push it", kind="missing"
            )
        if path not in checked:
            rd.verify_file(
                path,
                archive["sha256"],
                archive["size"],
                label=path,
                component=archive["component"],
                manifest=manifest,
            )
        rd.extract_archive(path, archive["top_dir"], staging)


def installed_files(top):
    """``(files, stats)``: relative path -> sha256, and -> its stat signature (size, mtime, ctime, inode), of every
    regular file under top (links and the marker itself left out)."""
    files, stats = {}, {}
    for folder, _dirs, names in os.walk(top):
        for name in names:
            path = os.path.join(folder, name)
            if name != tk.MARKER and os.path.isfile(path) and not os.path.islink(path):
                rel = os.path.relpath(path, top)
                files[rel] = rd.file_sha256(path)
                stats[rel] = tk.stat_signature(path)
    return files, stats


def write_metadata(staging, release, archives, version_json, link_before=None):
    with open(os.path.join(staging, "version.json"), "w", encoding="utf-8") as out:
        json.dump(version_json, out, indent=3, sort_keys=True)
        out.write("\n")
    files, stats = installed_files(staging)
    marker = {
        "method": "redist",
        "release": release,
        "installed_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "archives": {a["relative_path"]: a["sha256"] for a in archives},
        # Every installed file's sha256: the host model (module host_state) finds a file changed since.
        "files": files,
        # Each file's stat signature as installed: the host model hashes only a file whose signature changed since
        # (a write changes its ctime, which no one sets back; verify sha256 hashes every file).
        "stat": stats,
        # Where the global CUDA link resolved before this toolkit came: what link policy keep holds it to.
        "link_before": link_before or None,
    }
    with open(os.path.join(staging, tk.MARKER), "w", encoding="utf-8") as out:
        json.dump(marker, out, indent=2, sort_keys=True)


def check_nvcc(module, staging, release):
    nvcc = os.path.join(staging, "bin", "nvcc")
    rc, out, err = module.run_command([nvcc, "--version"])
    parsed = tk.parse_nvcc_version(out)
    want = ".".join(release.split(".")[:2])
    if rc != 0 or not parsed or parsed["release"] != want:
        raise rd.RedistError(
            f"the new toolkit's nvcc does not report release {want} (rc={rc}, output: {(out or err).strip()[-300:]});"
            " the profile's components must include what nvcc needs (cuda_nvcc, cuda_crt, libnvvm for 13.x)",
            kind="verify",
        )
    return parsed["version"]


def swap_into_place(staging, dest):
    """Rename staging to dest; a managed older toolkit at dest is renamed away first and removed after."""
    old = None
    if os.path.lexists(dest):
        old = f"{os.path.dirname(dest)}/.{os.path.basename(dest)}.gpufleet-old"
        shutil.rmtree(old, ignore_errors=True)
        os.rename(dest, old)
    os.rename(staging, dest)
    if old:
        shutil.rmtree(old)


def main():
    module = AnsibleModule(
        argument_spec={
            "dest": {"type": "path", "required": True},
            "release": {"type": "str", "required": True},
            "archives": {"type": "list", "elements": "dict", "required": True},
            "archive_dir": {"type": "path"},
            "pull_url": {"type": "str", "default": ""},
            "pull_timeout": {"type": "int", "default": 600},
            "extract_factor": {"type": "float", "default": 4.0},
            "verify_nvcc": {"type": "bool", "default": True},
            "reinstall": {"type": "bool", "default": False},
            "link_before": {"type": "dict"},
        },
        supports_check_mode=True,
    )
    p = module.params
    dest, release, archives = p["dest"].rstrip("/"), p["release"], p["archives"]
    manifest = None
    try:
        # The manifest's name, for errors; checked before anything else so check mode refuses a bad release too.
        manifest = rd.manifest_name(release)
    except rd.RedistError as exc:
        module.fail_json(msg=f"{exc}. Nothing was installed", kind=exc.kind)
    check_archives(module, archives)
    components = [a["component"] for a in archives]
    status = tk.target_status(dest, release, components)
    result = {"changed": False, "home": dest, "status_before": status["status"], "installed": []}
    if status["status"] == "present" and not p["reinstall"]:
        module.exit_json(**result)
    if status["status"] in ("not_a_toolkit", "foreign"):
        refuse(module, dest, status)
    have_release, have = tk.summarize_version_json(tk.read_version_json(dest))
    result.update(changed=True, installed=components)
    if module._diff:
        result["diff"] = {
            "before_header": f"{dest} ({status['status']})",
            "after_header": f"{dest} (CUDA {release})",
            "before": describe(have_release, sorted(have)),
            "after": describe(release, [f"{a['component']} {a['version']}" for a in archives]),
        }
    if module.check_mode:
        module.exit_json(**result)
    if not p["archive_dir"]:
        module.fail_json(msg="archive_dir is required to install (it holds the pushed archives)")
    preflight(module, dest, archives)
    staging = f"{os.path.dirname(dest)}/.{os.path.basename(dest)}.gpufleet-staging"
    shutil.rmtree(staging, ignore_errors=True)
    os.makedirs(staging)
    try:
        checked = set()
        if p["pull_url"]:
            result["pulled"], checked = pull(module, archives)
        build(module, staging, archives, manifest, checked)
        # A reinstall keeps the first install's record of the link: the link may have drifted since.
        old = tk.read_marker(dest) if os.path.isdir(dest) else None
        link_before = (old or {}).get("link_before") or p["link_before"]
        write_metadata(staging, release, archives, rd.version_json(archives, release), link_before)
        if p["verify_nvcc"] and "cuda_nvcc" in components:
            result["nvcc_version"] = check_nvcc(module, staging, release)
        os.chmod(staging, 0o755)
        swap_into_place(staging, dest)
    except (rd.RedistError, OSError) as exc:
        shutil.rmtree(staging, ignore_errors=True)
        module.fail_json(msg=f"{exc}. Nothing was installed at {dest}", kind=getattr(exc, "kind", "os"), home=dest)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
