# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A host an operator took out of rotation before the run, behind a real HAProxy (lab/haproxy.py), two lab hosts.

Node 2's server is in maintenance (an operator's hardware ticket) before the run; node 1 is in rotation.

* By default the run refuses node 2 at its drain, naming the drain it found and the fix: node 2 is rolled back to
  its backup (nothing was switched), never undrained, and still in maintenance at the end; node 1 upgrades and is
  back in rotation.
* With gpufleet_upgrade_drained_hosts=true the next run upgrades node 2, leaves it in maintenance, and its
  state.json records that someone else had drained it.
"""

from __future__ import annotations

import json

import pytest

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _drain_haproxy as hx
from lab import haproxy as lab_haproxy

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ENV = {"ANSIBLE_TIMEOUT": "60"}
DRAIN_TASK = "Take the host out of HAProxy's rotation and wait until its requests end"


@pytest.fixture(scope="module")
def fleet(lab_fleet):
    return lab_fleet(2, name="drain-found")


@pytest.fixture(scope="module")
def balancer(fleet):
    info = lab_haproxy.start(fleet.name)
    yield info
    lab_haproxy.stop(fleet.name)


def admin(balancer, server):
    api = hx.Runtime(balancer["socket"])
    rows = hx.parse_servers_state(api.command(f"show servers state {balancer['backend']}"))
    return hx.server_view(rows, [], balancer["backend"], server)["admin"]


def test_a_host_found_drained_is_upgraded_only_when_told_and_stays_drained(
    fleet, balancer, run_playbook, node_exec, tmp_path
):
    free, held = fleet.nodes
    api = hx.Runtime(balancer["socket"])
    assert api.command(f"set server {balancer['backend']}/{held} state maint").strip() == ""
    extravars = {
        "gpufleet_batch_size": 2,
        "gpufleet_max_failed_hosts": 1,
        "gpufleet_drain": "haproxy",
        "gpufleet_haproxy_socket": balancer["socket"],
        "gpufleet_haproxy_backend": balancer["backend"],
        "gpufleet_drain_record_dir": str(tmp_path / "records"),
        "gpufleet_drain_timeout_s": 60,
    }
    refused = run_playbook("playbooks/upgrade.yml", fleet.inventory, envvars=ENV, extravars=extravars)
    assert refused.rc != 0
    res = refused.task(DRAIN_TASK, host=held).res
    print(res["msg"])
    assert res["drained_by"] == "other" and not res["changed"]
    assert f"HAProxy server {balancer['backend']}/{held} was in maint before this run, not by gpufleet" in res["msg"]
    assert "fix: set gpufleet_upgrade_drained_hosts=true" in res["msg"]
    assert refused.task(DRAIN_TASK, host=free).res["drained_by"] == "run"
    assert admin(balancer, held) == "maint" and admin(balancer, free) == "ready"

    told = run_playbook(
        "playbooks/upgrade.yml",
        fleet.inventory,
        envvars=ENV,
        extravars={**extravars, "gpufleet_upgrade_drained_hosts": True},
    )
    assert told.rc == 0, str(told)
    assert told.task(DRAIN_TASK, host=held).res["drained_by"] == "other"
    assert admin(balancer, held) == "maint" and admin(balancer, free) == "ready"
    state = json.loads(node_exec(held, ["cat", "/var/lib/gpufleet/state.json"], check=True).stdout)
    assert state["reason"].endswith("; drained by other"), state
    assert list((tmp_path / "records").glob("*.json")) == []
