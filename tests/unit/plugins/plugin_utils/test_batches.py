# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The rollout's batch plan: Ansible's serial without groups, a share of each serving group per batch with them."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError
from ansible.utils.helpers import pct_to_int

from ansible_collections.gpufleet.upgrade.plugins.filter import batches as filters
from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _batches

HOSTS = [f"gpu-{i:02d}" for i in range(1, 21)]


def ansible_sizes(serial, count):
    """Ansible's own cut (PlaybookExecutor._get_serialized_batches), written out with its pct_to_int."""
    serial = list(serial) or [-1]
    out, left, item = [], count, 0
    while left > 0:
        size = pct_to_int(serial[item], count)
        size = left if size <= 0 else min(size, left)
        out.append(size)
        left -= size
        item = min(item + 1, len(serial) - 1)
    return out


@pytest.mark.parametrize("count", [1, 2, 3, 7, 16, 20, 33, 100, 500])
@pytest.mark.parametrize("serial", [[1, "10%", "25%"], ["50%"], [2], ["1%"], [3, 1], ["100%"], [0]])
def test_without_groups_the_batches_are_ansibles(serial, count):
    hosts = [f"h{i}" for i in range(count)]
    batches = _batches.plan(hosts, serial)
    assert [len(b) for b in batches] == ansible_sizes(serial, count)
    assert [h for b in batches for h in b] == hosts


def test_no_group_loses_more_than_its_share_in_one_batch():
    # Two serving groups of 8 and one of 4; at most 25 % of a group (2, 2, 1) per batch.
    groups = {h: ("llama" if i < 8 else "qwen" if i < 16 else "mixtral") for i, h in enumerate(HOSTS)}
    batches = _batches.plan(HOSTS, [1, "50%"], groups, "25%")
    assert batches[0] == ["gpu-01"]
    for batch in batches:
        for group, cap in (("llama", 2), ("qwen", 2), ("mixtral", 1)):
            taken = [h for h in batch if groups[h] == group]
            assert len(taken) <= cap, (group, batch)
    # The 50 % batches (10 hosts) are cut to what the shares allow: 2 + 2 + 1.
    assert [len(b) for b in batches[1:3]] == [5, 5]
    assert sorted(h for b in batches for h in b) == HOSTS
    for batch in batches:
        assert batch == sorted(batch, key=HOSTS.index)


def test_a_count_caps_each_group_and_a_small_group_still_moves():
    groups = {"a1": "a", "a2": "a", "a3": "a", "b1": "b"}
    assert _batches.plan(["a1", "a2", "a3", "b1"], [10], groups, 1) == [["a1", "b1"], ["a2"], ["a3"]]
    # 25 % of a group of 1 is still 1 host: every group can be upgraded.
    assert _batches.plan(["a1", "b1"], [10], {"a1": "a", "b1": "b"}, "25%") == [["a1", "b1"]]


def test_hosts_without_a_group_form_their_own():
    groups = {"a1": "a", "a2": "a"}
    assert _batches.plan(["a1", "a2", "x1", "x2"], [4], groups, 1) == [["a1", "x1"], ["a2", "x2"]]


@pytest.mark.parametrize(
    ("value", "total", "budget"),
    [(0, 10, 0), ("", 10, 0), (None, 10, 0), (3, 10, 3), ("10%", 40, 4), ("10%", 5, 0), ("25%", 10, 2)],
)
def test_failure_budget(value, total, budget):
    assert _batches.failure_budget(value, total) == budget


@pytest.mark.parametrize(
    ("call", "words"),
    [
        (lambda: _batches.failure_budget("ten", 10), ["gpufleet_max_failed_hosts='ten'", "'25%'"]),
        (lambda: _batches.failure_budget(-1, 10), ["gpufleet_max_failed_hosts=-1", "negative"]),
        (lambda: _batches.plan(["a"], ["x%"]), ["gpufleet_batch_size='x%'"]),
        (lambda: _batches.plan(["a"], [1], {"a": "g"}, "lots"), ["gpufleet_batch_group_max='lots'"]),
    ],
)
def test_bad_settings_name_the_setting_the_value_and_the_fix(call, words):
    with pytest.raises(_batches.BatchError) as info:
        call()
    for word in words:
        assert word in str(info.value)
    assert "fix:" in str(info.value)


def test_the_filter_reads_each_hosts_group_and_refuses_a_variable_no_host_sets():
    hostvars = {"a1": {"pool": "a"}, "a2": {"pool": "a"}, "b1": {"pool": "b"}}
    assert filters.batch_plan(["a1", "a2", "b1"], [3], hostvars, "pool", 1) == [["a1", "b1"], ["a2"]]
    with pytest.raises(AnsibleFilterError, match="no host sets the variable 'serving_group'"):
        filters.batch_plan(["a1", "a2", "b1"], [3], hostvars, "serving_group")
    with pytest.raises(AnsibleFilterError, match="gpufleet_max_failed_hosts"):
        filters.failure_budget("many", 3)


# --------------------------------------------------------------------------- the budget before each batch

GROUPS = {"a1": "a", "a2": "a", "a3": "a", "a4": "a", "b1": "b", "b2": "b"}


def test_hosts_already_out_of_service_count_against_the_group_max():
    caps = _batches.group_caps(GROUPS, list(GROUPS), 2)
    # a3 and a4 are down: group a has no room left, so a1 waits; b is untouched
    admitted, deferred = _batches.admit(["a1", "b1"], GROUPS, caps, {"a3": "HAProxy maint", "a4": "Slurm down (PSU)"})
    assert admitted == ["b1"]
    assert deferred["a1"] == (
        "serving group a already has 2 host(s) out of service (a3: HAProxy maint; a4: Slurm down (PSU)) and "
        "gpufleet_batch_group_max allows 2 at once: upgrading a1 now would take more out; fix: bring those hosts back "
        "into service (or raise gpufleet_batch_group_max), then run the upgrade again for the hosts left"
    )


def test_the_batch_shrinks_to_the_room_left():
    caps = _batches.group_caps(GROUPS, list(GROUPS), 2)
    admitted, deferred = _batches.admit(["a1", "a2"], GROUPS, caps, {"a4": "HAProxy health check DOWN"})
    assert admitted == ["a1"] and list(deferred) == ["a2"]
    assert _batches.admit(["a1", "a2"], GROUPS, caps, {}) == (["a1", "a2"], {})


def test_a_batch_host_already_out_takes_nothing_more():
    caps = _batches.group_caps(GROUPS, list(GROUPS), 1)
    admitted, deferred = _batches.admit(["a1", "a2"], GROUPS, caps, {"a1": "HAProxy maint"})
    # a1 is out already and stays so; a2 would be a second host of a out at once
    assert admitted == ["a1"] and list(deferred) == ["a2"]


def test_the_filter_maps_server_names_and_leaves_batches_alone_without_groups():
    from ansible_collections.gpufleet.upgrade.plugins.filter.batches import batch_admit

    hostvars = {h: {"grp": g, "srv": f"srv-{h}"} for h, g in GROUPS.items()}
    seen = {"srv-a3": "HAProxy maint", "srv-a4": "", "srv-a1": ""}
    got = batch_admit(["a1", "a2"], hostvars, list(GROUPS), "grp", "25%", seen, "srv")
    assert got["out"] == {"a3": "HAProxy maint"} and got["admitted"] == [] and sorted(got["deferred"]) == ["a1", "a2"]
    assert batch_admit(["a1"], hostvars, list(GROUPS), "", 1, seen, "srv")["admitted"] == ["a1"]
