# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The rollout's batches and failure budget, planned on the controller before the first batch starts.

``plan`` cuts the play's hosts into batches. The sizes follow ``serial`` exactly as Ansible reads it (a number, a
percentage or a list whose last item repeats). With ``groups`` (a serving group per host, from the host variable
``gpufleet_batch_by`` names), no batch takes more than ``group_max`` of any group's hosts (a count or a percentage
of that group, at least 1), so a group never loses more than that share of its hosts at once; a batch that would
break the share is cut short and the rest of its hosts wait for the next one. Without groups the batches are
Ansible's own, in inventory order. ``upgrade_hosts.yml`` runs the plan as its ``hosts`` (the hosts in batch order)
and ``serial`` (the batch sizes), so one mechanism cuts every rollout.
"""

from __future__ import annotations

import math


class BatchError(ValueError):
    """A batch setting that cannot be read; the message names the setting, the value and the fix."""


def _amount(value, total, setting, minimum=0):
    """An int, or 'N%' of total rounded down but at least ``minimum``; negative or unreadable values raise."""
    text = str(value).strip()
    try:
        if text.endswith("%"):
            share = float(text[:-1])
            if share < 0:
                raise ValueError(text)
            return max(minimum, math.floor(total * share / 100.0))
        number = int(text)
    except ValueError as exc:
        raise BatchError(
            f"{setting}={value!r} is neither a number of hosts nor a percentage; fix: set it to e.g. 2 or '25%'"
        ) from exc
    if number < 0:
        raise BatchError(f"{setting}={value!r} is negative; fix: set it to 0 or more hosts, or a percentage")
    return number


def _serial_items(serial):
    items = serial if isinstance(serial, (list, tuple)) else [serial]
    return [item for item in items if item is not None and str(item).strip() != ""] or [0]


def _target(items, index, count, left):
    """The size of batch ``index`` as Ansible reads serial (its pct_to_int: a percentage is rounded down but is at
    least 1 host; 0 takes every host left); the last item repeats."""
    size = _amount(items[min(index, len(items) - 1)], count, "gpufleet_batch_size", minimum=1)
    return left if size <= 0 else min(size, left)


def sizes(serial, count):
    """Ansible's batch sizes for ``serial`` over ``count`` hosts (0 or an empty serial: one batch of all)."""
    items = _serial_items(serial)
    out, left = [], count
    while left > 0:
        out.append(_target(items, len(out), count, left))
        left -= out[-1]
    return out


def plan(hosts, serial=None, groups=None, group_max=None):
    """``[[host, ...], ...]``: the batches, each in the hosts' own order.

    hosts: the play's hosts in inventory order. groups: ``{host: group}`` (a host absent from it is in the group
    ``""``); None plans Ansible's own batches. group_max: the most hosts of one group per batch, a count or a
    percentage of the group (default '10%' when groups are given).
    """
    hosts = list(hosts)
    position = {host: i for i, host in enumerate(hosts)}
    if groups is None:
        out, start = [], 0
        for size in sizes(serial, len(hosts)):
            out.append(hosts[start : start + size])
            start += size
        return out
    items = _serial_items(serial)
    members = {}
    for host in hosts:
        members.setdefault(str(groups.get(host, "") or ""), []).append(host)
    cap = group_caps(groups, hosts, group_max)
    out = []
    while any(members.values()):
        size = _target(items, len(out), len(hosts), sum(len(waiting) for waiting in members.values()))
        batch, taken = [], dict.fromkeys(members, 0)
        moved = True
        while len(batch) < size and moved:
            moved = False
            for group, waiting in members.items():
                if len(batch) >= size:
                    break
                if waiting and taken[group] < cap[group]:
                    batch.append(waiting.pop(0))
                    taken[group] += 1
                    moved = True
        out.append(sorted(batch, key=position.__getitem__))
    return out


def failure_budget(value, total):
    """Failed hosts the rollout tolerates: gpufleet_max_failed_hosts as a count, or 'N%' of the run's hosts."""
    if value is None or str(value).strip() == "":
        return 0
    return _amount(value, total, "gpufleet_max_failed_hosts")


def group_caps(groups, hosts, group_max):
    """``{group: the most of its hosts out of service at once}`` (gpufleet_batch_group_max over each group)."""
    members = {}
    for host in hosts:
        members.setdefault(str(groups.get(host, "") or ""), []).append(host)
    limit = "10%" if group_max is None or str(group_max).strip() == "" else group_max
    return {g: max(1, _amount(limit, len(m), "gpufleet_batch_group_max", minimum=1)) for g, m in members.items()}


def admit(batch, groups, caps, out):
    """The batch as the serving groups' budget allows it now: ``(admitted, deferred)``.

    batch: this batch's hosts; groups: ``{host: group}`` of every host of the rollout; caps: ``group_caps``; out:
    ``{host: why}`` for every host of the rollout's groups out of service now (drained, down, failing its health
    check), as the drain backend reports them before the batch. During the batch a group has out of service its hosts
    already out plus the batch's hosts in service now; the batch's hosts in service beyond the cap wait (deferred:
    ``{host: reason}``). A batch host already out of service takes nothing more from its group.
    """
    admitted, deferred = [], {}
    for group in sorted({str(groups.get(h, "") or "") for h in batch}):
        mine = [h for h in batch if str(groups.get(h, "") or "") == group]
        already = sorted(h for h, g in groups.items() if str(g or "") == group and h in out)
        room = caps.get(group, 1) - len(already)
        for host in mine:
            if host in out or room > 0:
                admitted.append(host)
                room -= 0 if host in out else 1
                continue
            shown = "; ".join(f"{h}: {out[h]}" for h in already)
            deferred[host] = (
                f"serving group {group or '(none)'} already has {len(already)} host(s) out of service ({shown}) and "
                f"gpufleet_batch_group_max allows {caps.get(group, 1)} at once: upgrading {host} now would take more "
                "out; fix: bring those hosts back into service (or raise gpufleet_batch_group_max), then run the "
                "upgrade again for the hosts left"
            )
    order = {h: i for i, h in enumerate(batch)}
    return sorted(admitted, key=order.__getitem__), deferred
