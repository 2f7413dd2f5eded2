# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Drain through HAProxy's runtime API (its stats socket): pure logic and a small client, no Ansible.

Commands and formats are those of HAProxy's management guide (section "Unix Socket commands"), checked against
HAProxy 2.6 (Debian 12):

* ``set server <backend>/<server> state drain|ready``: the answer is an empty line on success, else a message
  ("No such server.", "No such backend.", "Permission denied").
* ``show servers state <backend>``: a format version line (``1``), a header line starting with ``#`` naming the
  fields (``be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state ...``), one line per server.
  ``srv_op_state``: 0 stopped, 1 starting, 2 running, 3 stopping. ``srv_admin_state`` is a mask: 0x01 forced
  maintenance, 0x02 inherited maintenance, 0x04 maintenance by configuration, 0x08 forced drain, 0x10 inherited
  drain, 0x20 maintenance after a resolution failure, 0x40 FQDN set from the socket.
* ``show stat``: CSV whose first line is the header (``# pxname,svname,qcur,qmax,scur,...,status,...``); ``scur``
  is a server's current sessions, ``status`` UP / DOWN / DRAIN / MAINT / NOLB / no check.
* ``show sess``: one line per stream (``0x...: proto=tcpv4 src=... fe=... be=<backend> srv=<server> ... age=1s``);
  its format is not a stable interface, so it only ever serves as text in a message.
* ``show table``: one line per stick table, ``# table: <name>, type: ip, size:1024, used:1``; ``show table <name>
  data.server_id eq <id>`` adds one line per entry pointing at server ``<id>`` (``0x...: key=127.0.0.1 use=0
  exp=599791 server_id=1 server_key=node1``); ``clear table <name> data.server_id eq <id>`` removes them (an empty
  answer; "No such table" otherwise).
* ``shutdown sessions server <backend>/<server>`` ends every stream of the server at once (an empty answer).

Persistence (management guide, "set server ... state"): a server in ``drain`` leaves load balancing "but still
allows it to be checked and to accept new persistent connections". A client holding the server's cookie, or whose
stick-table entry names it, keeps reaching it while it drains; only ``maint`` sends them elsewhere (a request for a
server in maintenance is balanced to another one, and cookie insertion hands the client the new server's cookie).
So where the backend keeps clients on their server, the drain takes the server to ``maint`` and clears its
stick-table entries: what is in flight still ends (``maint`` ends no stream), nothing new arrives.

In non-interactive mode HAProxy answers one command per connection and closes it.
"""

from __future__ import annotations

import csv
import io
import socket

from ansible_collections.gpufleet.upgrade.plugins.module_utils._drain import DrainError

MAINT_BITS = 0x01 | 0x02 | 0x04 | 0x20
DRAIN_BITS = 0x08 | 0x10
OP_STATES = {0: "stopped", 1: "starting", 2: "running", 3: "stopping"}
ADMIN_STATES = ("ready", "drain", "maint")
SESSION_LINES = 3
# What the drain does about clients that stick to the server: move them (maint + clear its stick-table entries) or
# keep them (HAProxy's drain as it is: they reach the server until it stops).
PERSISTENCE_MODES = ("move", "keep")


class Runtime:
    """One command per connection to the stats socket at ``path``."""

    def __init__(self, path, timeout_s=10.0):
        self.path = path
        self.timeout_s = timeout_s

    def command(self, line):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout_s)
        try:
            sock.connect(self.path)
            sock.sendall(line.encode() + b"\n")
            chunks = []
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
        except OSError as exc:
            raise DrainError(
                f"HAProxy's stats socket {self.path} did not answer {line.split()[0:2]}: {exc}; fix: check "
                "gpufleet_haproxy_socket and gpufleet_haproxy_host (the socket needs `stats socket ... level admin`)"
            ) from None
        finally:
            sock.close()
        return b"".join(chunks).decode("utf-8", "replace")


def check_set_reply(reply, backend, server, state):
    """A ``set server`` answer is an empty line; anything else is HAProxy's refusal."""
    text = reply.strip()
    if text:
        raise DrainError(f"HAProxy refused `set server {backend}/{server} state {state}`: {text}")


def parse_servers_state(text):
    """Rows of ``show servers state`` as dicts keyed by the header's field names (format version 1)."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines or lines[0].strip() != "1":
        raise DrainError(f"unexpected `show servers state` answer (no format version 1): {text.strip()[:200]!r}")
    header = None
    rows = []
    for line in lines[1:]:
        if line.startswith("#"):
            header = header or line.lstrip("#").split()
            continue
        if header is None:
            raise DrainError(f"`show servers state` has no header line: {text.strip()[:200]!r}")
        rows.append(dict(zip(header, line.split(), strict=False)))
    return rows


def parse_stat(text):
    """Rows of ``show stat`` (CSV) as dicts keyed by the header's field names."""
    body = text.lstrip()
    if not body.startswith("#"):
        raise DrainError(f"unexpected `show stat` answer (no CSV header): {text.strip()[:200]!r}")
    reader = csv.DictReader(io.StringIO(body.lstrip("# ")))
    return [row for row in reader if row.get("pxname")]


def admin_state(mask):
    """ready, drain or maint: what the admin mask means for rotation (maintenance wins over drain)."""
    mask = int(mask)
    if mask & MAINT_BITS:
        return "maint"
    if mask & DRAIN_BITS:
        return "drain"
    return "ready"


def server_view(state_rows, stat_rows, backend, server):
    """The server as the decisions see it: admin and operational state, health status, current sessions."""
    row = next((r for r in state_rows if r.get("be_name") == backend and r.get("srv_name") == server), None)
    if row is None:
        names = sorted(r.get("srv_name", "?") for r in state_rows if r.get("be_name") == backend)
        raise DrainError(
            f"HAProxy backend {backend!r} has no server {server!r} (servers: {', '.join(names) or 'none'}); "
            "fix: set gpufleet_haproxy_server to the server's name in the backend (default: the inventory name)"
        )
    stat = next((r for r in stat_rows if r.get("pxname") == backend and r.get("svname") == server), {})
    return {
        "id": int(row["srv_id"]),
        "admin": admin_state(row["srv_admin_state"]),
        "admin_mask": int(row["srv_admin_state"]),
        "op_state": OP_STATES.get(int(row["srv_op_state"]), row["srv_op_state"]),
        "status": stat.get("status", ""),
        "sessions": int(stat.get("scur") or 0),
        "queued": int(stat.get("qcur") or 0),
    }


def plan(want, current, ours, out="drain"):
    """What to send for ``want`` (drained | ready): ``(state or None, reason)``.

    ``current`` is the admin state now; ``ours`` says whether a gpufleet drain record exists for the server (this
    run's, or a killed run's that never undrained it). A server that was out of rotation before any gpufleet drain
    (an operator's drain or maintenance) gets no record, and the way back leaves it as it is. ``out`` is the state
    a drain takes the server to (``drain``, or ``maint`` where clients stick to it: see ``out_state``).
    """
    if current not in ADMIN_STATES:
        raise DrainError(f"unknown admin state {current!r}")
    if want == "drained":
        if current == "ready":
            return out, f"taken out of rotation ({out})"
        if ours and current == "drain" and out == "maint":
            return "maint", "set from drain to maint (its clients stick to it)"
        if ours:
            return None, f"already {current} by an earlier gpufleet drain"
        return None, f"already {current} before this run: left so, now and after the run"
    if want != "ready":
        raise DrainError(f"unknown wanted state {want!r}: drained or ready")
    if not ours:
        if current == "ready":
            return None, "already in rotation"
        return None, f"left {current}: gpufleet did not take it out (an operator's choice)"
    if current == "ready":
        return None, "already in rotation"
    return "ready", f"put back in rotation (was {current})"


def out_of_service(view):
    """Why HAProxy sends the server no traffic now ("" when it does): its admin state, or its failed health check."""
    if view["admin"] != "ready":
        return f"HAProxy {view['admin']}"
    if view["op_state"] != "running":
        return f"HAProxy health check {view['status'] or view['op_state']}"
    return ""


def backend_view(state_rows, stat_rows, backend):
    """``{server: why it is out of service, "" when in rotation}`` for every server of ``backend``: one look."""
    names = [r["srv_name"] for r in state_rows if r.get("be_name") == backend]
    return {name: out_of_service(server_view(state_rows, stat_rows, backend, name)) for name in names}


def sessions_of(show_sess, backend, server):
    """The lines of ``show sess`` that belong to ``backend/server`` (text for a timeout message)."""
    marks = (f" be={backend} ", f" srv={server} ")
    return [line.strip() for line in show_sess.splitlines() if all(m in f" {line} " for m in marks)]


def backend_cookie(stat_rows, backend):
    """The cookie name of ``backend`` (``cookie`` of its BACKEND row in ``show stat``), "" without a cookie."""
    row = next((r for r in stat_rows if r.get("pxname") == backend and r.get("svname") == "BACKEND"), {})
    return row.get("cookie") or ""


def table_names(show_table):
    """The stick tables of ``show table``'s answer."""
    prefix = "# table: "
    return [line[len(prefix) :].split(",")[0].strip() for line in show_table.splitlines() if line.startswith(prefix)]


def table_entries(show_table):
    """The entry lines of ``show table <name> ...`` (the header line and blanks left out)."""
    return [line.strip() for line in show_table.splitlines() if line.startswith("0x")]


def persistence(cookie, table, entries):
    """What keeps clients on the server: ``{cookie, stick_table, stuck}`` (``stuck``: its stick-table entries).

    Only the backend's own stick table (declared in the backend, so named like it) is looked at: an entry of another
    table names a server by an id that belongs to whichever backend stores into it.
    """
    return {"cookie": cookie, "stick_table": table, "stuck": len(entries), "found": bool(cookie or table)}


def describe_persistence(found):
    parts = []
    if found["cookie"]:
        parts.append(f"cookie {found['cookie']}")
    if found["stick_table"]:
        parts.append(f"stick table {found['stick_table']} ({found['stuck']} client(s) stuck to the server)")
    return " and ".join(parts)


def out_state(mode, found):
    """Where a drain takes the server: ``maint`` when clients stick to it and ``mode`` is move, else ``drain``."""
    if mode not in PERSISTENCE_MODES:
        raise DrainError(f"unknown persistence mode {mode!r}: {' or '.join(PERSISTENCE_MODES)}")
    return "maint" if mode == "move" and found["found"] else "drain"


def keep_warning(backend, server, found):
    """The warning of a drain that leaves persistent clients on the server (persistence=keep)."""
    return (
        f"HAProxy backend {backend} keeps clients on their server ({describe_persistence(found)}): in drain state "
        f"{backend}/{server} still takes their requests, so they reach the host until it stops; "
        "gpufleet_haproxy_persistence=move sets it to maint and clears its stick-table entries instead"
    )


def idle(view):
    """Nothing in flight on the server and nothing queued for it."""
    return view["sessions"] == 0 and view["queued"] == 0


def in_rotation(view):
    """Ready, and its health check (if any) says it runs: HAProxy sends it traffic."""
    return view["admin"] == "ready" and view["op_state"] == "running"


def timeout_message(host, backend, server, view, waited_s, sessions, what, found=None):
    """The message of a wait that ran out: the host, what was still running, the fix."""
    if what == "idle":
        shown = "; ".join(line[:160] for line in sessions[:SESSION_LINES])
        more = f" (+{len(sessions) - SESSION_LINES} more)" if len(sessions) > SESSION_LINES else ""
        # In drain state persistent clients keep coming: the wait may never end, and the fix is another one.
        sticky = (
            f"; the backend keeps clients on their server ({describe_persistence(found)}) and drain still takes "
            "their requests: set gpufleet_haproxy_persistence=move"
            if found and found["found"] and view["admin"] == "drain"
            else ""
        )
        return (
            f"{host}: HAProxy server {backend}/{server} still had {view['sessions']} session(s) in flight and "
            f"{view['queued']} queued after {waited_s:.1f}s of {view['admin']}"
            + (f": {shown}{more}" if shown else "")
            + sticky
            + "; fix: raise gpufleet_drain_timeout_s, end those requests, or set gpufleet_haproxy_on_timeout=shutdown "
            "(ends them); nothing on the host was changed yet"
        )
    return (
        f"{host}: HAProxy server {backend}/{server} is {view['admin']} but its health check says "
        f"{view['op_state']} ({view['status'] or 'no status'}) after {waited_s:.1f}s; fix: check that the serving "
        "unit answers on the address HAProxy checks"
    )
