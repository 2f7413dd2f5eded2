# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A host an operator took out of rotation before the run, behind a real HAProxy (lab/haproxy.py), two lab hosts.

Node 2's server is in maintenance (an operator's hardware ticket) before the run; node 1 is in rotation. Both are
one serving group.

* The first run allows one host of the group out of service at once (gpufleet_batch_group_max 1, batches of one).
  Before node 1's batch, HAProxy shows node 2 in maintenance: the group has no room, so node 1 is not started, with
  the reason. Node 2's own batch takes nothing more from the group (it is out already), but by default its drain
  refuses it, naming the drain it found and the fix: node 2 is rolled back to its backup (nothing was switched),
  never undrained, and still in maintenance at the end.
* The next run, with gpufleet_upgrade_drained_hosts=true and no serving groups, upgrades both: node 1 is back in
  rotation, node 2 stays in maintenance, and its state.json records that someone else had drained it.
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
        "gpufleet_batch_size": 1,
        "gpufleet_max_failed_hosts": 2,
        "gpufleet_drain": "haproxy",
        "gpufleet_haproxy_socket": balancer["socket"],
        "gpufleet_haproxy_backend": balancer["backend"],
        "gpufleet_drain_record_dir": str(tmp_path / "records"),
        "gpufleet_drain_timeout_s": 60,
    }
    group = {"gpufleet_batch_by": "lab_group", "lab_group": "serving", "gpufleet_batch_group_max": 1}
    refused = run_playbook("playbooks/upgrade.yml", fleet.inventory, envvars=ENV, extravars={**extravars, **group})
    assert refused.rc != 0
    runs = fleet.inventory.parent / "controller" / "runs"
    report = json.loads(sorted(runs.glob("*/report.json"), key=lambda p: p.stat().st_mtime)[-1].read_text())
    hosts = {h["host"]: h for h in report["hosts"]}
    assert hosts[free]["outcome_kind"] == "not_started", hosts[free]
    print(hosts[free]["outcome"])
    assert (
        f"serving group serving already has 1 host(s) out of service ({held}: HAProxy maint) and "
        f"gpufleet_batch_group_max allows 1 at once: upgrading {free} now would take more out"
    ) in hosts[free]["outcome"]
    assert hosts[held]["outcome_kind"] == "rolled_back", hosts[held]
    res = refused.task(DRAIN_TASK, host=held).res
    print(res["msg"])
    assert res["drained_by"] == "other" and not res["changed"]
    assert f"HAProxy server {balancer['backend']}/{held} was in maint before this run, not by gpufleet" in res["msg"]
    assert "fix: set gpufleet_upgrade_drained_hosts=true" in res["msg"]
    assert admin(balancer, held) == "maint" and admin(balancer, free) == "ready"

    told = run_playbook(
        "playbooks/upgrade.yml",
        fleet.inventory,
        envvars=ENV,
        extravars={**extravars, "gpufleet_upgrade_drained_hosts": True},
    )
    assert told.rc == 0, str(told)
    assert told.task(DRAIN_TASK, host=held).res["drained_by"] == "other"
    assert told.task(DRAIN_TASK, host=free).res["drained_by"] == "run"
    assert admin(balancer, held) == "maint" and admin(balancer, free) == "ready"
    state = json.loads(node_exec(held, ["cat", "/var/lib/gpufleet/state.json"], check=True).stdout)
    assert state["reason"].endswith("; drained by other"), state
    assert list((tmp_path / "records").glob("*.json")) == []
