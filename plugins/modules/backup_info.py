#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: backup_info
short_description: Read and verify a gpufleet backup
version_added: 0.1.0
description:
  - Loads C(manifest.json) of one backup (the newest by default), checks it against its sha256 file, re-reads the
    sha256 of every file of the backup, parses the venv lock and lists the venv archive.
  - Refuses a manifest of another host or, when O(profile) is given, of another profile.
  - A host without any backup is reported with RV(found=false), not as a failure, so that callers can say
    "never upgraded".
  - Also runs on the controller against a fetched copy (C(delegate_to) localhost), where the lock is parsed with
    C(packaging).
author:
  - gpufleet maintainers (@gpufleet)
attributes:
  check_mode:
    support: full
    description: Read-only; runs the same in check mode.
  diff_mode:
    support: none
    description: Changes nothing.
options:
  state_dir:
    description: State folder holding C(backups/).
    type: path
  backups_dir:
    description: Folder holding the backup folders themselves (for example the controller's copies); instead of
      O(state_dir).
    type: path
  backup_id:
    description: Backup to read; the newest when omitted.
    type: str
  host:
    description: The host the backup must belong to.
    type: str
    required: true
  profile:
    description: The profile the backup must have been taken for; not checked when omitted.
    type: str
  verify:
    description: Re-read checksums, parse the lock and list the archive.
    type: bool
    default: true
  unlike_digest:
    description:
      - Without O(backup_id), pick the newest backup whose snapshot digest differs from this one (the digest of the
        host as it is now), so that "roll back" undoes the last change instead of restoring the present state.
    type: str
  unlike_venv:
    description:
      - With O(unlike_digest), also pass over backups taken while the host ran this venv (the one C(current) points
        at now) or a repair of it (C(<venv>.repair-<run id>)), so that a backup of a re-run or a repair on the
        present profile is never what "roll back" restores; the default target is the host before its upgrade.
      - When the backup so found records a state that was not consistent when it was taken (its C(state) - a
        C(CUDA_HOME) that is no toolkit or does not match the venv's CUDA builds, or drift on its profile), the
        module fails and names it and the older backups with a clean record; naming it in O(backup_id) restores
        it anyway (with a warning).
    type: path
  verify_scope:
    description: C(full) checks every file and the archive; C(lock) only the manifest and the venv lock; C(copy)
      every file but the venv archive (what the controller's copy of a backup holds).
    type: str
    choices: [full, lock, copy]
    default: full
  require_lock_check:
    description: Fail when the lock cannot be parsed here because C(packaging) is missing (set on the controller).
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: Load the newest backup of this host
  gpufleet.upgrade.backup_info:
    state_dir: /var/lib/gpufleet
    host: "{{ inventory_hostname }}"
    profile: "{{ gpufleet_stack.name }}"
  register: __rollback_backup
"""

RETURN = r"""
found:
  description: False when the host has no backup at all.
  returned: always
  type: bool
backup_id:
  description: Id of the backup read.
  returned: when found
  type: str
path:
  description: Folder of the backup.
  returned: when found
  type: str
manifest:
  description: The verified manifest.
  returned: when found
  type: dict
backups:
  description: Ids of every complete backup, oldest first.
  returned: always
  type: list
  elements: str
passed_over:
  description: Backups the default choice passed over, newest first, each with C(id) and C(why).
  returned: always
  type: list
  elements: dict
recorded_state_problems:
  description: Why the backup's recorded state was not consistent when it was taken; empty when it was (or when
    the backup records no state).
  returned: when found
  type: list
  elements: str
problems:
  description: What does not verify (a missing or changed file, a lock or archive that does not read), on failure.
  returned: when the backup does not verify
  type: list
  elements: str
lock_checked:
  description: Whether the venv lock was parsed (needs C(packaging) where the module runs).
  returned: when found
  type: bool
msg:
  description: What was found.
  returned: always
  type: str
"""

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _backup as bk


def newest_unlike(module, backups_dir, ids, digest, venv=None):
    """_backup.rollback_choice over the host's backups, failing on an unreadable one or a refused state."""
    host = module.params["host"]
    manifests = []
    for backup_id in ids:
        try:
            manifests.append(bk.load_manifest(os.path.join(backups_dir, backup_id)))
        except bk.BackupError as exc:
            module.fail_json(
                msg=f"{host}: backup {backup_id} is unusable: {exc}; nothing was changed; "
                "fix: name a backup with rollback_backup_id, or move the broken one aside"
            )
    choice = bk.rollback_choice(manifests, digest, venv)
    refused = choice["refused"]
    if refused:
        older = ", ".join(choice["alternatives"]) or "none"
        module.fail_json(
            msg=f"{host}: refused: backup {refused['id']}, the one to roll back to, records a state that was not"
            f" consistent when it was taken ({'; '.join(refused['problems'])}); nothing was changed; fix: name it"
            f" with -e rollback_backup_id={refused['id']} to restore it anyway, or an older backup whose record"
            f" is clean ({older})",
            passed_over=choice["passed_over"],
            backups=ids,
        )
    return choice


def run(module):
    p = module.params
    host = p["host"]
    passed_over = []
    backups_dir = p["backups_dir"] or os.path.join(p["state_dir"], "backups")
    ids = bk.list_backups(backups_dir)
    wanted = p["backup_id"]
    if not wanted:
        if not ids:
            return {
                "changed": False,
                "found": False,
                "backups": [],
                "passed_over": [],
                "msg": f"{host}: no backup under {backups_dir}: this host was never upgraded by gpufleet",
            }
        wanted = ids[-1]
        if p["unlike_digest"]:
            choice = newest_unlike(module, backups_dir, ids, p["unlike_digest"], p["unlike_venv"])
            passed_over, wanted = choice["passed_over"], choice["id"]
            if wanted is None:
                return {
                    "changed": False,
                    "found": False,
                    "backups": ids,
                    "passed_over": passed_over,
                    "msg": f"{host}: every backup describes the host as it is now: nothing to roll back",
                }
    folder = os.path.join(backups_dir, wanted)
    if not os.path.isdir(folder):
        module.fail_json(
            msg=f"{host}: backup {wanted!r} does not exist under {backups_dir} (present: {', '.join(ids) or 'none'}); "
            "fix: pass one of the present ids, or none for the newest",
            backups=ids,
        )
    try:
        manifest = bk.load_manifest(folder)
    except bk.BackupError as exc:
        module.fail_json(
            msg=f"{host}: backup {wanted} is unusable: {exc}; nothing was changed; fix: pick another backup "
            f"(present: {', '.join(ids)}) or restore {folder} from the controller copy",
            backups=ids,
        )
    refused = bk.identity_problems(manifest, host, p["profile"])
    if refused:
        module.fail_json(msg=f"{host}: refused: {'; '.join(refused)}; nothing was changed", backups=ids)
    check_lock = bk.HAS_PACKAGING
    if p["require_lock_check"] and not check_lock:
        module.fail_json(msg=f"{host}: the Python package 'packaging' is missing where backup_info runs")
    if p["verify"]:
        problems = bk.verify_backup(folder, manifest, check_lock=check_lock, scope=p["verify_scope"])
        if problems:
            module.fail_json(
                msg=f"{host}: backup {wanted} does not verify: {'; '.join(problems)}; nothing was changed",
                backups=ids,
                problems=problems,
            )
    recorded = bk.recorded_state_problems(manifest)
    if recorded and p["backup_id"]:
        module.warn(
            f"{host}: backup {wanted} records a state that was not consistent when it was taken"
            f" ({'; '.join(recorded)}); restoring it because it was named"
        )
    return {
        "changed": False,
        "found": True,
        "backup_id": wanted,
        "passed_over": passed_over,
        "recorded_state_problems": recorded,
        "path": folder,
        "manifest": manifest,
        "backups": ids,
        "lock_checked": bool(p["verify"] and check_lock),
        "msg": f"{host}: backup {wanted} verified" if p["verify"] else f"{host}: backup {wanted} loaded",
    }


def main():
    module = AnsibleModule(
        argument_spec={
            "state_dir": {"type": "path"},
            "backups_dir": {"type": "path"},
            "backup_id": {"type": "str"},
            "host": {"type": "str", "required": True},
            "profile": {"type": "str"},
            "verify": {"type": "bool", "default": True},
            "unlike_digest": {"type": "str"},
            "unlike_venv": {"type": "path"},
            "verify_scope": {"type": "str", "choices": ["full", "lock", "copy"], "default": "full"},
            "require_lock_check": {"type": "bool", "default": False},
        },
        mutually_exclusive=[("state_dir", "backups_dir")],
        required_one_of=[("state_dir", "backups_dir")],
        supports_check_mode=True,
    )
    module.exit_json(**run(module))


if __name__ == "__main__":
    main()
