#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# The work happens in the action plugin of the same name (plugins/action/wheel_lock.py), on the controller, where
# the lock file and the wheelhouse are.

from __future__ import annotations

DOCUMENTATION = r"""
module: wheel_lock
short_description: Take the fleet's reviewed lock file, refusing one made for another profile or whose wheels are gone
description:
  - Reads the lock file O(path) that C(playbooks/plan.yml) wrote (module C(gpufleet.upgrade.wheel_plan) with
    C(lock_file)) and returns its entries, each shaped as the fact C(gpufleet_wheel_lock) that role C(venv_rebuild)
    installs and role C(assess) judges. Asks no index anything.
  - Refuses a file that is not as C(playbooks/plan.yml) wrote it, naming the entry, package and field and the fix
    (plan it again); that is, a digest of its content that does not match (an edit by hand), an older schema without
    one, or a package whose name or version is not its wheel's file name's.
  - Refuses the file when its profile's name or hash differs from the profile loaded now (role C(stack)); the hash
    covers the profile's content without its URLs and its indexes' C(files) (site mirrors may differ between planning
    and applying).
  - Refuses a wheel URL (packages and tools) that is not C(http)/C(https) under where one of the profile's indexes
    links its files (the index's C(files) in the profile, else its origin, and for pip's default index where pip
    serves its files; a site mirror of C(gpufleet_index_urls) its own origin or its C(files)), on
    O(fleet_cache_url), or under one of O(allowed_urls); a C(file:) URL, another host or user info in the URL is
    refused naming the entry, the URL, the index it was planned from and the field to set, before anything is
    fetched. plan.yml refuses the same URLs when it writes the lock file.
  - Refuses it when the wheels it locks are not at hand, naming every missing file, before any host changes. Without
    O(fleet_cache_url) the controller's wheelhouse must hold each wheel with its locked sha256 (hashes recorded for
    unchanged files are reused; a file's size, mtime, ctime and inode key its record, so a file replaced or put back
    is read again; others are read). Each refused file is named with the locked sha256 and the one found. A wheel
    held with its locked sha256 whose METADATA names another name or version is refused. With O(fleet_cache_url)
    (a site cache the hosts pull from) each wheel must be served there at C(/wheels/<file>) with the locked size
    (one HEAD request each); the hosts check the sha256 as they pull.
  - With O(fetch), wheels missing from the wheelhouse are first downloaded from the URLs the lock file names, sha256
    checked (the lock's own files; no index listing is read).
  - Each host picks its entry with filter C(gpufleet.upgrade.lock_entry) (same architecture and Python, the newest
    glibc no newer than the host's).
version_added: 0.1.0
options:
  path:
    description: The lock file.
    type: path
    required: true
  profile:
    description: The validated stack profile; defaults to the fact C(gpufleet_stack) set by role C(stack).
    type: dict
  controller_dir:
    description: Controller folder of the wheelhouse; defaults to C(gpufleet_controller_dir).
    type: path
  fleet_cache_url:
    description: A site cache the hosts pull the wheels from (C(gpufleet_fleet_cache_url)); unset, the controller's
      wheelhouse is checked.
    type: str
  fetch:
    description: Download the lock's wheels missing from the controller's wheelhouse from the URLs it names.
    type: bool
    default: false
  timeout:
    description: Seconds to wait for each request (site cache, fetch).
    type: int
    default: 30
  allowed_urls:
    description:
      - URL prefixes a wheel URL of the lock file may also start with, besides where the profile's indexes link
        their files and O(fleet_cache_url). Defaults to C(gpufleet_lock_allowed_urls) (role C(stack)), else none.
    type: list
    elements: str
attributes:
  check_mode:
    support: full
    description: Reads and checks as usual; with O(fetch) it reports the wheels it would download and downloads none.
  diff_mode:
    support: none
    description: Nothing to show as a diff.
  action:
    support: full
    description: Runs as an action plugin on the controller.
notes:
  - Use with C(run_once); every host then takes its entry with filter C(gpufleet.upgrade.lock_entry).
author:
  - gpufleet maintainers (@gpufleet)
"""

EXAMPLES = r"""
- name: Take the reviewed lock file
  gpufleet.upgrade.wheel_lock:
    path: "{{ gpufleet_lock_file }}"
  run_once: true
  register: lock_file

- name: Install the host's entry of it
  ansible.builtin.set_fact:
    gpufleet_wheel_lock: "{{ lock_file | gpufleet.upgrade.lock_entry(platform, '3.12', inventory_hostname) }}"
"""

RETURN = r"""
path:
  description: The lock file read.
  returned: success
  type: str
profile:
  description: The lock file's profile, C(name) and C(hash).
  returned: success
  type: dict
entries:
  description: One lock per entry, as fact C(gpufleet_wheel_lock) holds it (C(platform), C(python), C(hash),
    C(venv_name), C(packages), C(tools), C(overrides), C(lock_rules), C(profile), C(profile_hash), C(path) the lock
    file, C(wheelhouse)). A package whose wheel the wheelhouse holds with its locked sha256 has its
    C(installed_size) (the sum of its uncompressed members; role C(preflight) sizes the new venv from them).
  returned: success
  type: list
  elements: dict
fetched:
  description: Files downloaded into the wheelhouse (O(fetch)); in check mode the files it would download.
  returned: success
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule

ARGUMENT_SPEC = {
    "path": {"type": "path", "required": True},
    "profile": {"type": "dict"},
    "controller_dir": {"type": "path"},
    "fleet_cache_url": {"type": "str"},
    "fetch": {"type": "bool", "default": False},
    "timeout": {"type": "int", "default": 30},
    "allowed_urls": {"type": "list", "elements": "str"},
}


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    module.fail_json(msg="gpufleet.upgrade.wheel_lock runs as its action plugin on the controller; call it by its FQCN")


if __name__ == "__main__":
    main()
