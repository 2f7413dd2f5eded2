# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Drain a Slurm node: the commands, the parsing of their answers and the decisions. Pure logic, no Ansible.

Commands (Slurm's scontrol, sinfo and squeue man pages, Slurm 22.05 as in Debian 12):

* ``scontrol update nodename=N state=drain reason="gpufleet <run id>"``: no new jobs; running jobs go on (the node is
  DRAINING), and it is DRAINED once they ended. ``scontrol update nodename=N state=resume`` puts it back.
* ``sinfo --noheader --Node --nodes=N --format=%N|%T|%E``: node name, state in the extended form and the reason.
  The extended state is Slurm's ``node_state_string`` in lower case (``idle``, ``mixed``, ``allocated``, ``draining``,
  ``drained``, ``down``, ...), a drained node never shows its base state, and one trailing character flags more
  (``*`` not responding, ``~`` powered down, ``#`` powering up, ``%`` powering down, ``!`` to power down, ``@``
  reboot pending, ``^`` reboot issued, ``$`` maintenance). The reason is ``none`` when there is none. A node in two
  partitions is listed twice.
* ``squeue --noheader --nodelist=N --format=%i|%u|%j|%T|%M``: the jobs on the node (id, user, name, state, time
  used), for the message of a drain that ran out of time.

The reason tells gpufleet's drain from anyone else's: a node drained before the run with another reason stays
drained after it (and is reported); a node drained by an earlier gpufleet run that never resumed it (a killed run)
is resumed.
"""

from __future__ import annotations

from ansible_collections.gpufleet.upgrade.plugins.module_utils._drain import DrainError

REASON_PREFIX = "gpufleet "
FLAGS = "*~#%!@^$"
DRAIN_STATES = ("draining", "drained")
# Out of service: drained, or down / failed (an operator's hardware ticket); only a gpufleet reason is put back.
OUT_STATES = (*DRAIN_STATES, "down", "fail", "failing")
JOB_LINES = 3


def reason_for(run_id):
    return f"{REASON_PREFIX}{run_id}"


def sinfo_argv(node):
    return ["sinfo", "--noheader", "--Node", f"--nodes={node}", "--format=%N|%T|%E"]


def squeue_argv(node):
    return ["squeue", "--noheader", f"--nodelist={node}", "--format=%i|%u|%j|%T|%M"]


def drain_argv(node, reason):
    return ["scontrol", "update", f"nodename={node}", "state=drain", f"reason={reason}"]


def resume_argv(node):
    return ["scontrol", "update", f"nodename={node}", "state=resume"]


def parse_sinfo(text, node):
    """``{node, state, flags, reason}`` of ``node`` from sinfo's answer; DrainError when it is not there."""
    for line in text.splitlines():
        name, sep, rest = line.strip().partition("|")
        if not sep or name != node:
            continue
        state, _bar, reason = rest.partition("|")
        state = state.strip().lower()
        flags = "".join(c for c in state if c in FLAGS)
        reason = reason.strip()
        return {
            "node": name,
            "state": state.rstrip(FLAGS),
            "flags": flags,
            "reason": "" if reason in ("none", "(null)") else reason,
        }
    raise DrainError(
        f"Slurm does not know node {node!r} (sinfo answered {text.strip()[:200]!r}); fix: set gpufleet_slurm_node "
        "to the host's NodeName in slurm.conf (default: the short inventory name)"
    )


def sinfo_all_argv(nodes=()):
    """sinfo of the given nodes, or of every node (one call either way)."""
    return ["sinfo", "--noheader", "--Node", *([f"--nodes={','.join(nodes)}"] if nodes else []), "--format=%N|%T|%E"]


def out_of_service(view):
    """Why Slurm runs no job on the node now ("" when it does): drained, down or failed, or not responding."""
    if is_out(view):
        return f"Slurm {view['state']}" + (f" ({view['reason']})" if view["reason"] else "")
    if "*" in view["flags"]:
        return "Slurm: not responding"
    return ""


def nodes_view(text):
    """``{node: why it is out of service, "" in service}`` of every node sinfo listed: one look."""
    names = dict.fromkeys(line.strip().partition("|")[0] for line in text.splitlines() if "|" in line)
    return {name: out_of_service(parse_sinfo(text, name)) for name in names}


def parse_squeue(text):
    jobs = []
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 5:
            jobs.append(dict(zip(("id", "user", "name", "state", "time"), parts, strict=True)))
    return jobs


def is_drained(view):
    return view["state"] in DRAIN_STATES


def is_out(view):
    return view["state"] in OUT_STATES


def is_ours(view):
    return view["reason"].startswith(REASON_PREFIX)


def idle(view):
    """Drained with nothing left running (DRAINING becomes DRAINED when the last job ended)."""
    return view["state"] == "drained"


def plan(want, view):
    """``(action or None, why)`` for ``want`` (drained | resumed): drain, resume or nothing."""
    if want == "drained":
        if not is_out(view):
            return "drain", f"drained (was {view['state']})"
        if is_ours(view):
            return None, f"already {view['state']} by gpufleet ({view['reason']})"
        return None, f"already {view['state']} by someone else (reason {view['reason']!r}): left so, also after the run"
    if want != "resumed":
        raise DrainError(f"unknown wanted state {want!r}: drained or resumed")
    if not is_out(view):
        return None, f"already in service ({view['state']})"
    if is_ours(view):
        return "resume", f"resumed (was {view['state']}, {view['reason']})"
    return None, f"left {view['state']}: drained by someone else (reason {view['reason']!r}), not by gpufleet"


def timeout_message(host, view, jobs, waited_s):
    shown = "; ".join(f"job {j['id']} ({j['user']}, {j['name']}, {j['state']}, {j['time']})" for j in jobs[:JOB_LINES])
    more = f" (+{len(jobs) - JOB_LINES} more)" if len(jobs) > JOB_LINES else ""
    return (
        f"{host}: Slurm node {view['node']} is still {view['state']} after {waited_s:.1f}s"
        + (f", running {shown}{more}" if shown else "")
        + "; fix: raise gpufleet_drain_timeout_s or end those jobs (scancel); nothing on the host was changed yet"
    )
