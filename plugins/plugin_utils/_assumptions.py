# Copyright: (c) 2026, gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a run assumed, said at its start: each variable's value per host and where it came from.

A host whose inventory lacks gpufleet_stack_profile is judged against the default profile; said nowhere, a newcomer
fixes the host instead of the inventory. One line per distinct value and source, never one per host.
"""

from __future__ import annotations

SHOWN_HOSTS = 5


def source_of(name: str, host_vars, extra_vars) -> str:
    """extra vars, inventory (any host or group variable) or default (the role's)."""
    if name in extra_vars:
        return "extra vars"
    if name in host_vars:
        return "inventory"
    return "default"


def lines(assumed: dict[str, dict[str, tuple[str, str]]], names: list[str]) -> list[str]:
    """assumed: host -> name -> (value, source). One line per name, value and source, naming its hosts."""
    out = []
    for name in names:
        groups: dict[tuple[str, str], list[str]] = {}
        for host, values in assumed.items():
            groups.setdefault(values[name], []).append(host)
        for (value, source), hosts in sorted(groups.items(), key=lambda item: (-len(item[1]), item[0])):
            shown = ", ".join(hosts[:SHOWN_HOSTS])
            more = f" and {len(hosts) - SHOWN_HOSTS} more" if len(hosts) > SHOWN_HOSTS else ""
            count = f"{len(hosts)} host{'s' if len(hosts) != 1 else ''}"
            out.append(f"{name} = {value} ({source}) for {count}: {shown}{more}")
    return out
