# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""gpufleet_batch_group_max's default: 10 % of a serving group out of service at once (at least one host), in the
planner and in the playbooks that pass it."""

from __future__ import annotations

from pathlib import Path

from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _batches

REPO = Path(__file__).resolve().parents[4]


def test_the_default_cap_is_ten_percent_of_a_group():
    hosts = [f"h{i:02d}" for i in range(20)]
    groups = dict.fromkeys(hosts, "g")
    assert _batches.group_caps(groups, hosts, None) == {"g": 2}
    assert [len(b) for b in _batches.plan(hosts, [20], groups)] == [2] * 10


def test_the_playbooks_pass_the_same_default():
    for play in ("playbooks/plays/batches.yml", "playbooks/plays/upgrade_hosts.yml"):
        lines = [x for x in (REPO / play).read_text().splitlines() if "gpufleet_batch_group_max | default(" in x]
        assert lines and all("gpufleet_batch_group_max | default('10%')" in x for x in lines), play
