#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: fleet_cache
short_description: Start, locate or stop the run's fleet cache, the HTTP server hosts pull wheels and archives from
version_added: 0.1.0
description:
  - Runs on the controller (action plugin). O(state=started) starts, once per run, an HTTP server (Python's
    C(http.server)) that serves the controller's verified wheelhouse under C(/wheels/) and its redist cache under
    C(/redist/), read-only and nothing else; later calls of the same run reuse it. It ends with the
    ansible-playbook process that started it, or at O(state=stopped).
  - It serves regular files under those folders only - the real path of each file, every link resolved, must lie in
    the folder (a link out of it is refused with 403), a request with C(.) or C(..) segments (encoded or not) is
    refused, and folders are never listed.
  - It listens on the controller address the host reaches it at (O(host_address), else the first field of
    O(ssh_client)), not on every interface, unless O(bind) names another; hosts that reach the controller at other
    addresses get a server on each.
  - Returns the URL under which this host reaches it (RV(url)) - the controller's address this host's SSH session
    comes from (C(SSH_CLIENT)), or O(host_address).
  - Hosts fetch each file with its sha256 from the lock or the redist manifest (C(ansible.builtin.get_url) with
    C(checksum)), so a file the cache serves wrong is refused on the host and nothing is installed.
  - O(state=stopped) stops it and returns what it served (RV(served)), the run's bytes through the controller.
  - Starting or stopping the cache is no change to any host (C(changed=false)).
author:
  - gpufleet maintainers (@gpufleet)
attributes:
  check_mode:
    support: full
    description: The cache is started in check mode too (hosts then only ask whether a file is there); nothing of
      any host is changed.
  diff_mode:
    support: none
    description: Changes no host.
options:
  state:
    description: C(started) (start or reuse), C(stopped) (stop and count).
    type: str
    choices: [started, stopped]
    default: started
  run_dir:
    description: Controller folder of this run's cache state and access log.
    type: path
    required: true
  mounts:
    description: URL prefix -> controller folder to serve, for example C(wheels) -> C(~/.gpufleet/wheelhouse).
    type: dict
    default: {}
  bind:
    description: Address the server listens on; empty - the controller address the host reaches it at (see
      O(host_address)). C(0.0.0.0) listens on every interface.
    type: str
    default: ""
  port:
    description: Port; 0 picks a free one.
    type: int
    default: 0
  ssh_client:
    description: The host's C(SSH_CLIENT) (C(ansible_env.SSH_CLIENT)), whose first field is the controller's
      address as the host sees it.
    type: str
  host_address:
    description: The controller's address for the hosts, instead of the one in O(ssh_client).
    type: str
"""

EXAMPLES = r"""
- name: Start the fleet cache (once for the run) and learn its URL for this host
  gpufleet.upgrade.fleet_cache:
    run_dir: "{{ gpufleet_controller_dir }}/runs/{{ gpufleet_run_id }}"
    mounts:
      wheels: "{{ gpufleet_controller_dir }}/wheelhouse"
      redist: "{{ gpufleet_controller_dir }}/cache/redist"
    ssh_client: "{{ ansible_env.SSH_CLIENT | default('') }}"
  register: __cache

- name: Stop it at the end of the run and keep the count
  gpufleet.upgrade.fleet_cache:
    state: stopped
    run_dir: "{{ gpufleet_controller_dir }}/runs/{{ gpufleet_run_id }}"
  run_once: true
"""

RETURN = r"""
url:
  description: Base URL of the cache as this host reaches it (state=started).
  returned: when started
  type: str
  sample: http://10.0.0.5:43127
bind:
  description: The address the cache listens on.
  returned: when started
  type: str
  sample: 10.0.0.5
port:
  description: The port it listens on.
  returned: when started
  type: int
reused:
  description: Whether the cache was already running for this run.
  returned: when started
  type: bool
served:
  description: Requests, bytes and errors (status 400 or more) the cache served, in all and per client address.
  returned: when stopped
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule

ARGUMENT_SPEC = {
    "state": {"type": "str", "choices": ["started", "stopped"], "default": "started"},
    "run_dir": {"type": "path", "required": True},
    "mounts": {"type": "dict", "default": {}},
    "bind": {"type": "str", "default": ""},
    "port": {"type": "int", "default": 0},
    "ssh_client": {"type": "str"},
    "host_address": {"type": "str"},
}


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    module.fail_json(msg="gpufleet.upgrade.fleet_cache runs as its action plugin on the controller; call it by FQCN")


if __name__ == "__main__":
    main()
