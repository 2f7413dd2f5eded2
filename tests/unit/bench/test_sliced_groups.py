# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""bench/sliced_run.py's serving groups: contiguous groups, whole groups a slice, the most hosts of a group seen down
at once over both slices, the collection's cap; and bench/idle_cost.py's playbooks."""

from __future__ import annotations

import yaml

from ansible_collections.gpufleet.upgrade.bench import idle_cost as ic
from ansible_collections.gpufleet.upgrade.bench import sliced_run as sr

HOSTS = [f"n{i}" for i in range(8)]


def test_groups_are_contiguous_and_slices_take_whole_groups():
    groups = sr.group_of(HOSTS, 4)
    assert [groups[h] for h in HOSTS] == ["group-0"] * 2 + ["group-1"] * 2 + ["group-2"] * 2 + ["group-3"] * 2
    assert sr.slices_of(HOSTS, groups) == [["n0", "n1", "n4", "n5"], ["n2", "n3", "n6", "n7"]]
    assert sr.slices_of(HOSTS, {}) == [HOSTS[:4], HOSTS[4:]] and sr.group_of(HOSTS, 0) == {}


def test_most_down_at_once_counts_both_slices_in_one_sample():
    groups = sr.group_of(HOSTS, 4)
    samples = [(0.0, {"n0"}), (1.0, {"n0", "n1", "n2"}), (2.0, {"n6"})]
    assert sr.most_down_at_once(samples, groups) == {"group-0": 2, "group-1": 1, "group-2": 0, "group-3": 1}


def test_the_cap_is_the_collections():
    assert sr._cap("10%", 2) == 1 and sr._cap("10%", 20) == 2 and sr._cap("25%", 8) == 2


def test_idle_cost_playbooks():
    play = yaml.safe_load(ic.wait_play(20, True))[0]
    task = play["tasks"][0]
    assert task["ansible.builtin.command"] == "sleep 20" and task["async"] == 80 and task["poll"] == ic.ASYNC_POLL_S
    assert "async" not in yaml.safe_load(ic.wait_play(0, False))[0]["tasks"][0]
    assert len(yaml.safe_load(ic.tasks_play(3))[0]["tasks"]) == 3
    assert len(yaml.safe_load(ic.inventory(4))["all"]["hosts"]) == 4
    assert "internal_poll_interval = 0.05" in ic.cfg(0.05)
