#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: backup_manifest
short_description: Snapshot a serving host before an upgrade
version_added: 0.1.0
description:
  - Records what a restore needs under O(state_dir)/backups/<id>/, with C(manifest.json) listing the sha256 of every
    file.
  - The venv's exact package list (C(venv.lock)), the C(/usr/local/cuda) target and alternatives choice, the toolkits
    present, copies of the serving unit and environment files, baseline results and, optionally, a venv archive.
  - A backup is written under C(.partial-<id>) and renamed into place when complete; partial folders left by a killed
    run are removed.
  - When the newest backup already describes the host as it is (same digest), it is reused and nothing changes.
  - Keeps the newest O(keep) backups.
author:
  - gpufleet maintainers (@gpufleet)
attributes:
  check_mode:
    support: full
    description: Reports the backup it would write (or reuse) without writing.
  diff_mode:
    support: full
    description: Shows the newest backup id before and after.
options:
  state_dir:
    description: Host state folder; backups live in its C(backups/) sub-folder.
    type: path
    required: true
  host:
    description: Inventory name of the host, recorded so that a manifest is never restored on another host.
    type: str
    required: true
  profile:
    description: Name of the stack profile of the run taking the backup.
    type: str
    required: true
  run_id:
    description: Id of the run taking the backup.
    type: str
    default: ""
  venv_link:
    description: The serving C(current) link; the venv it points at is the one recorded.
    type: path
    required: true
  venv_lock_names:
    description:
      - Lock files (with hashes) to prefer over a freeze, first found wins. Relative paths are inside the venv;
        C({venv_name}) stands for the venv's folder name.
    type: list
    elements: str
    default: []
  uv:
    description: Path of C(uv) on the host for C(uv pip freeze); without it the venv's own Python lists its packages.
    type: path
  indexes:
    description: Package index URLs the venv can be rebuilt from, recorded in the manifest.
    type: list
    elements: str
    default: []
  cuda_root:
    description: Folder holding the side-by-side toolkits C(cuda-X.Y).
    type: path
    default: /usr/local
  cuda_link:
    description: The C(cuda) link whose target is recorded.
    type: path
    default: /usr/local/cuda
  alternatives_name:
    description: Name of the alternatives group that may manage O(cuda_link); empty to skip.
    type: str
    default: cuda
  files:
    description: Files to copy (serving unit, drop-ins, environment files); absent ones are recorded as absent.
    type: list
    elements: path
    default: []
  file_globs:
    description:
      - Patterns of more files to copy (the serving unit's drop-ins, C(<unit>.service.d/*.conf)), each match in name
        order after O(files); a pattern that matches nothing (no drop-in folder) adds nothing and warns nothing.
    type: list
    elements: path
    default: []
  results_dir:
    description: Folder of baseline post-check and benchmark results (C(*.json)) to keep with the backup.
    type: path
  archive:
    description: Also write C(venv.tar.gz) of the venv.
    type: bool
    default: false
  keep:
    description: Number of newest backups to keep.
    type: int
    default: 5
  protect:
    description: Backup ids never pruned (for example the one an interrupted run recorded).
    type: list
    elements: str
    default: []
  env_file:
    description:
      - The serving unit's environment file (one of O(files)). Its C(CUDA_HOME) is held against the toolkits and
        the venv's CUDA builds to record whether the stack fits together (RV(manifest.state)).
    type: path
  model:
    description:
      - The host model's verdict from just before the backup (role C(assess)'s C(assess_result) with the profile it
        judged against), recorded in RV(manifest.state) (its C(model)). A backup taken while the host ran its
        profile with drift is not what a rollback restores by default.
    type: dict
"""

EXAMPLES = r"""
- name: Back up the serving host
  gpufleet.upgrade.backup_manifest:
    state_dir: /var/lib/gpufleet
    host: "{{ inventory_hostname }}"
    profile: "{{ gpufleet_stack.name }}"
    venv_link: /opt/gpufleet/serving/current
    uv: /opt/gpufleet/tools/bin/uv
    files:
      - /etc/systemd/system/gpufleet-serving.service
      - /etc/gpufleet/gpufleet-serving.env
    results_dir: /var/lib/gpufleet/results
    keep: 5
"""

RETURN = r"""
backup_id:
  description: Id of the backup written or reused.
  returned: always
  type: str
  sample: 20261202T130501Z-1a2b3c4d
path:
  description: Folder of the backup on the host.
  returned: always
  type: str
reused:
  description: True when the newest backup already described the host.
  returned: always
  type: bool
manifest:
  description: The manifest (as written, or as it would be written in check mode).
  returned: always
  type: dict
  contains:
    state:
      description:
        - The host when the backup was taken - C(consistent) and C(problems) (the serving environment's
          C(CUDA_HOME) is an installed toolkit and every CUDA build of the venv is for that toolkit's CUDA),
          C(cuda_home), C(cuda_version), and C(model) (O(model), or null).
        - A reused backup keeps the record of when it was taken.
      type: dict
venv_packages:
  description: The serving venv's packages as listed now (C(name==version) lines, the venv's lock or freeze).
  returned: always
  type: list
  elements: str
pruned:
  description: Backup ids removed by retention.
  returned: always
  type: list
  elements: str
partials_removed:
  description: Partial backup folders of killed runs that were removed.
  returned: always
  type: list
  elements: str
"""

import datetime
import glob
import json
import os
import shutil

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _backup as bk
from ansible_collections.gpufleet.upgrade.plugins.module_utils import _host_model as hm

FREEZE_SCRIPT = (
    "import importlib.metadata as m\n"
    "for d in m.distributions():\n"
    "    print('%s==%s' % (d.metadata['Name'], d.version))\n"
)


def read_pyvenv(venv):
    cfg = {}
    try:
        with open(os.path.join(venv, "pyvenv.cfg"), encoding="utf-8") as handle:
            for line in handle:
                if "=" in line:
                    key, value = line.split("=", 1)
                    cfg[key.strip()] = value.strip()
    except OSError:
        pass
    return cfg.get("version_info") or cfg.get("version")


def venv_lock(module, venv):
    """(source, text) of the venv's exact package list."""
    for name in module.params["venv_lock_names"]:
        candidate = os.path.join(venv, name.replace("{venv_name}", os.path.basename(venv)))
        if os.path.isfile(candidate):
            with open(candidate, encoding="utf-8") as handle:
                return name, handle.read()
    python = os.path.join(venv, "bin", "python")
    uv = module.params["uv"]
    if uv and os.access(uv, os.X_OK):
        rc, out, err = module.run_command([uv, "pip", "freeze", "--python", python])
        source = "uv pip freeze"
    else:
        rc, out, err = module.run_command([python, "-c", FREEZE_SCRIPT])
        source = "importlib.metadata"
    if rc != 0:
        module.fail_json(
            msg=f"{module.params['host']}: listing the packages of {venv} with {source} failed (rc={rc}); "
            "fix: check that the venv's Python runs",
            rc=rc,
            stdout=out,
            stderr=err,
        )
    lines = bk.freeze_lines(out)
    return source, "".join(line + "\n" for line in lines)


def toolkits(cuda_root):
    found = []
    try:
        names = sorted(os.listdir(cuda_root))
    except FileNotFoundError:
        return found
    for name in names:
        path = os.path.join(cuda_root, name)
        if not name.startswith("cuda-") or os.path.islink(path) or not os.path.isdir(path):
            continue
        version = None
        try:
            with open(os.path.join(path, "version.json"), encoding="utf-8") as handle:
                version = json.load(handle).get("cuda", {}).get("version")
        except (OSError, ValueError, AttributeError):
            pass
        files = size = 0
        for folder, _dirs, leaves in os.walk(path):
            for leaf in leaves:
                full = os.path.join(folder, leaf)
                if not os.path.islink(full):
                    files += 1
                    size += os.lstat(full).st_size
        found.append({"path": path, "version": version, "files": files, "bytes": size})
    return found


def alternatives(module, name):
    if not name:
        return None
    tool = module.get_bin_path("update-alternatives")
    if not tool:
        return None
    rc, out, _err = module.run_command([tool, "--query", name])
    if rc != 0:
        return None
    fields = dict(line.split(": ", 1) for line in out.splitlines() if ": " in line)
    return {"name": name, "link": fields.get("Link"), "value": fields.get("Value"), "status": fields.get("Status")}


def snapshot(module):
    p = module.params
    venv_link = p["venv_link"]
    venv = {"link": venv_link, "path": None}
    lock_text = None
    if os.path.islink(venv_link) or os.path.isdir(venv_link):
        path = os.path.realpath(venv_link)
        source, lock_text = venv_lock(module, path)
        venv.update(
            path=path,
            link_target=os.readlink(venv_link) if os.path.islink(venv_link) else None,
            python=read_pyvenv(path),
            lock_source=source,
            lock_sha256=bk.sha256_text(lock_text),
            package_count=len(bk.freeze_lines(lock_text)),
            indexes=p["indexes"],
        )
    cuda_link = p["cuda_link"]
    cuda = {
        "link": cuda_link,
        "target": os.readlink(cuda_link) if os.path.islink(cuda_link) else None,
        "alternatives": alternatives(module, p["alternatives_name"]),
        "toolkits": toolkits(p["cuda_root"]),
    }
    matched = [path for pattern in p["file_globs"] for path in sorted(glob.glob(pattern))]
    files = [bk.file_record(path) for path in p["files"] + matched]
    results = []
    if p["results_dir"] and os.path.isdir(p["results_dir"]):
        for name in sorted(os.listdir(p["results_dir"])):
            full = os.path.join(p["results_dir"], name)
            if name.endswith(".json") and os.path.isfile(full):
                results.append({"path": full, "sha256": bk.sha256_file(full), "backup": "results/" + name})
    return {"venv": venv, "cuda": cuda, "files": files, "results": results}, lock_text


def host_state_record(params, snap, lock_text):
    """The verdict a backup records: does the stack fit together (the host model's stack_consistency), and the
    model's verdict the upgrade passed in."""
    env_text = None  # not given: the environment is not judged
    if params["env_file"]:
        try:
            with open(params["env_file"], encoding="utf-8") as handle:
                env_text = handle.read()
        except FileNotFoundError:
            env_text = ""  # no environment file: no CUDA_HOME
        except OSError:
            env_text = None
    packages = bk.pinned_versions(lock_text) if lock_text else []
    consistency = hm.stack_consistency(packages, env_text, snap["cuda"]["toolkits"])
    return bk.recorded_state(consistency, params["model"])


def machine_id():
    try:
        with open("/etc/machine-id", encoding="utf-8") as handle:
            return handle.read().strip() or None
    except OSError:
        return None


def newest_matching(backups_dir, digest, host):
    ids = bk.list_backups(backups_dir)
    if not ids:
        return None
    newest = ids[-1]
    folder = os.path.join(backups_dir, newest)
    try:
        manifest = bk.load_manifest(folder)
    except bk.BackupError:
        return None
    if manifest.get("digest") != digest or manifest.get("host", {}).get("name") != host:
        return None
    if bk.verify_backup(folder, manifest, check_lock=bk.HAS_PACKAGING):
        return None
    return manifest


def write_backup(module, backups_dir, backup_id, created, snap, lock_text, state=None):
    p = module.params
    partial = os.path.join(backups_dir, bk.PARTIAL_PREFIX + backup_id)
    os.makedirs(partial, mode=0o700)
    if lock_text is not None:
        with open(os.path.join(partial, bk.LOCK), "w", encoding="utf-8") as handle:
            handle.write(lock_text)
    for record in snap["files"]:
        if record["state"] == "file":
            dest = os.path.join(partial, record["backup"])
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            shutil.copy2(record["path"], dest)
    for record in snap["results"]:
        dest = os.path.join(partial, record["backup"])
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        shutil.copy2(record["path"], dest)
    archive = None
    if p["archive"] and snap["venv"]["path"]:
        archive = {"members": bk.archive_venv(snap["venv"]["path"], os.path.join(partial, bk.ARCHIVE))}
    checksums = bk.checksum_tree(partial)
    # A source file that changed while it was copied would make the backup lie: compare with the snapshot.
    for record in snap["files"] + snap["results"]:
        if record.get("sha256") and checksums.get(record["backup"]) != record["sha256"]:
            bk.remove_tree(partial)
            module.fail_json(msg=f"{p['host']}: {record['path']} changed while it was backed up; fix: re-run")
    host = {"name": p["host"], "machine_id": machine_id()}
    manifest = bk.build_manifest(
        backup_id, created, host, p["profile"], p["run_id"], snap, checksums, archive, state=state
    )
    bk.write_manifest(partial, manifest)
    problems = bk.verify_backup(partial, manifest, check_lock=bk.HAS_PACKAGING)
    if problems:
        bk.remove_tree(partial)
        module.fail_json(msg=f"{p['host']}: backup {backup_id} does not verify: {'; '.join(problems)}")
    os.rename(partial, os.path.join(backups_dir, backup_id))
    return manifest


def run(module):
    p = module.params
    backups_dir = os.path.join(p["state_dir"], "backups")
    snap, lock_text = snapshot(module)
    digest = bk.snapshot_digest(snap)
    state = host_state_record(p, snap, lock_text)
    ids_before = bk.list_backups(backups_dir)
    partials = bk.list_partials(backups_dir)
    result = {"changed": False, "reused": False, "pruned": [], "partials_removed": partials}
    reuse = newest_matching(backups_dir, digest, p["host"])
    if reuse:
        backup_id, manifest = reuse["id"], reuse
        result["reused"] = True
    else:
        now = datetime.datetime.now(datetime.timezone.utc)
        backup_id = bk.new_backup_id(now.strftime("%Y%m%dT%H%M%S%fZ"), digest)
        manifest = bk.build_manifest(
            backup_id,
            now.isoformat(),
            {"name": p["host"], "machine_id": machine_id()},
            p["profile"],
            p["run_id"],
            snap,
            {},
            state=state,
        )
    ids_after = sorted(set(ids_before) | {backup_id})
    try:
        result["pruned"] = bk.plan_prune(ids_after, p["keep"], protect=[*p["protect"], backup_id])
    except bk.BackupError as exc:
        module.fail_json(msg=f"{p['host']}: {exc}")
    result["changed"] = bool(not reuse or result["pruned"] or partials)
    if not module.check_mode:
        os.makedirs(backups_dir, mode=0o700, exist_ok=True)
        for name in partials:
            bk.remove_tree(os.path.join(backups_dir, name))
        if not reuse:
            manifest = write_backup(module, backups_dir, backup_id, manifest["created"], snap, lock_text, state)
        for old in result["pruned"]:
            bk.remove_tree(os.path.join(backups_dir, old))
    result.update(backup_id=backup_id, path=os.path.join(backups_dir, backup_id), manifest=manifest)
    # The venv's packages as listed now (the manifest keeps only their sha256): a rollback compares them with the
    # backup's lock package by package.
    result["venv_packages"] = bk.freeze_lines(lock_text) if lock_text else []
    if module._diff:
        result["diff"] = {
            "before": {"backups": ids_before},
            "after": {"backups": [i for i in ids_after if i not in result["pruned"]]},
        }
    return result


def main():
    module = AnsibleModule(
        argument_spec={
            "state_dir": {"type": "path", "required": True},
            "host": {"type": "str", "required": True},
            "profile": {"type": "str", "required": True},
            "run_id": {"type": "str", "default": ""},
            "venv_link": {"type": "path", "required": True},
            "venv_lock_names": {"type": "list", "elements": "str", "default": []},
            "uv": {"type": "path"},
            "indexes": {"type": "list", "elements": "str", "default": []},
            "cuda_root": {"type": "path", "default": "/usr/local"},
            "cuda_link": {"type": "path", "default": "/usr/local/cuda"},
            "alternatives_name": {"type": "str", "default": "cuda"},
            "files": {"type": "list", "elements": "path", "default": []},
            "file_globs": {"type": "list", "elements": "path", "default": []},
            "results_dir": {"type": "path"},
            "archive": {"type": "bool", "default": False},
            "keep": {"type": "int", "default": 5},
            "protect": {"type": "list", "elements": "str", "default": []},
            "env_file": {"type": "path"},
            "model": {"type": "dict"},
        },
        supports_check_mode=True,
    )
    module.exit_json(**run(module))


if __name__ == "__main__":
    main()
