# Copyright: (c) 2026, gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a run assumed: one line per variable, value and source, naming a few of its hosts."""

from __future__ import annotations

from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _assumptions as asm


def test_source_is_extra_vars_then_inventory_then_default():
    assert asm.source_of("p", {"p": "lab"}, {"p": "cu130"}) == "extra vars"
    assert asm.source_of("p", {"p": "lab"}, {}) == "inventory"
    assert asm.source_of("p", {}, {}) == "default"


def test_one_line_per_distinct_value_not_per_host():
    assumed = {f"n{i:03}": {"profile": ("cu130", "default of role stack")} for i in range(200)}
    assumed["gpu7"] = {"profile": ("lab", "inventory")}
    assert asm.lines(assumed, ["profile"]) == [
        "profile = cu130 (default of role stack) for 200 hosts: n000, n001, n002, n003, n004 and 195 more",
        "profile = lab (inventory) for 1 host: gpu7",
    ]
