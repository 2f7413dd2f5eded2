#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: drain_haproxy
short_description: Take a serving host out of an HAProxy backend's rotation and back, through the runtime API
version_added: 0.2.0
description:
  - Talks to HAProxy's stats socket (the runtime API); runs where the socket is (C(delegate_to) the load balancer).
  - O(state=drained) sends C(set server BACKEND/SERVER state drain) (HAProxy sends the server no new requests; the
    ones in flight finish), then waits until the server's current sessions (C(scur) of C(show stat)) and its queue
    are 0. A wait that runs out fails with the host, the sessions still in flight (C(show sess)) and the fix.
  - O(state=ready) sends C(set server BACKEND/SERVER state ready), then waits until HAProxy's health check says the
    server runs, so the host is really back in rotation when the task ends.
  - With O(record_dir), the drain writes a record (C(haproxy-BACKEND-SERVER.json)) before it sends the drain and
    O(state=ready) removes it once the server is back. O(state=ready) puts back only a server that has a record; one
    that was already draining or in maintenance before the run (an operator's drain) is left so, and reported. A
    record left by a killed run makes the next run put the server back.
  - Reads C(show servers state) first and changes only what differs (a drained server is not drained again).
  - Persistence. HAProxy's C(drain) state still sends a server the requests of clients that stick to it (a
    C(cookie) in the backend, or an entry of the backend's stick table naming the server), so those clients keep
    reaching a host about to restart and the wait until idle may never end. The module looks for both (the
    backend's cookie name in C(show stat), the server's entries in the stick table named like the backend). With
    O(persistence=move) it then sets the server to C(maint) instead (requests for a server in maintenance go to the
    other servers, which hand out their own cookie) and clears the server's stick-table entries
    (C(clear table BACKEND data.server_id eq ID)); streams in flight still end. With O(persistence=keep) it drains
    as HAProxy does and warns.
author:
  - gpufleet maintainers (@gpufleet)
attributes:
  check_mode:
    support: full
    description: >-
      Reads the server's state and the backend's persistence and reports what would change; sends no C(set),
      C(clear) or C(shutdown) command and does not wait.
  diff_mode:
    support: full
    description: Shows the server's admin state before and after.
options:
  socket:
    description: Path of HAProxy's stats socket (C(stats socket PATH level admin) in C(haproxy.cfg)).
    type: path
    required: true
  backend:
    description: The backend holding the host's server.
    type: str
    required: true
  server:
    description: The server's name in the backend; required unless O(state=query).
    type: str
  host:
    description: Inventory name of the host the server stands for, named in messages (default O(server)).
    type: str
  state:
    description:
      - V(drained) takes the server out of rotation and waits until it is idle; V(ready) puts it back.
      - V(query) changes nothing and returns RV(out_of_service) for every server of the backend (two commands).
    type: str
    choices: [drained, ready, query]
    default: drained
  record_dir:
    description: Folder of the drain records on the host the module runs on; unset, O(state=ready) readies any server.
    type: path
  run_id:
    description: Id of the run, kept in the record.
    type: str
    default: ""
  persistence:
    description:
      - What a drain does where the backend keeps clients on their server (cookie or stick table).
      - V(move) takes the server to C(maint) and clears its stick-table entries, so those clients go to the other
        servers; V(keep) leaves them on it while it drains (HAProxy's C(drain)), with a warning.
      - Without persistence in the backend both drain the server (C(state drain)).
    type: str
    choices: [move, keep]
    default: move
  on_timeout:
    description:
      - What a drain does when the wait runs out with sessions still in flight.
      - V(fail) fails the task with the sessions; V(shutdown) ends them (C(shutdown sessions server)) and goes on,
        with a warning naming how many were ended.
    type: str
    choices: [fail, shutdown]
    default: fail
  found_drained:
    description:
      - What O(state=drained) does with a server found out of service before the run, not by gpufleet
        (drain or maintenance without a drain record).
      - V(upgrade) leaves it so and goes on (the host is upgraded and stays out of service); V(refuse) fails, naming
        it, and changes nothing. Role serving passes V(refuse) unless C(gpufleet_upgrade_drained_hosts) is true.
    type: str
    choices: [refuse, upgrade]
    default: upgrade
extends_documentation_fragment:
  - gpufleet.upgrade.drain_wait
"""

EXAMPLES = r"""
- name: Take the host out of HAProxy's rotation and wait until its requests end
  gpufleet.upgrade.drain_haproxy:
    socket: /run/haproxy/admin.sock
    backend: serving
    server: "{{ inventory_hostname }}"
    state: drained
    record_dir: /var/lib/gpufleet/drain
    run_id: "{{ gpufleet_run_id }}"
    timeout_s: 300
  delegate_to: lb1

- name: Drain a server of a backend with cookie persistence, ending what still runs after 2 minutes
  gpufleet.upgrade.drain_haproxy:
    socket: /run/haproxy/admin.sock
    backend: sticky
    server: "{{ inventory_hostname }}"
    persistence: move
    on_timeout: shutdown
    timeout_s: 120
  delegate_to: lb1

- name: Put the host back in rotation, unless it was drained before the run
  gpufleet.upgrade.drain_haproxy:
    socket: /run/haproxy/admin.sock
    backend: serving
    server: "{{ inventory_hostname }}"
    state: ready
    record_dir: /var/lib/gpufleet/drain
  delegate_to: lb1
"""

RETURN = r"""
previous:
  description: Admin state found before this call, V(ready), V(drain) or V(maint).
  returned: always
  type: str
  sample: ready
admin_state:
  description: Admin state after this call (in check mode, the one it would have).
  returned: always
  type: str
  sample: drain
op_state:
  description: HAProxy's operational state of the server at the end (V(running), V(stopped), ...).
  returned: always
  type: str
status:
  description: The server's status in C(show stat) at the end (V(UP), V(DRAIN), V(DOWN), V(MAINT), ...).
  returned: always
  type: str
sessions:
  description: Current sessions (C(scur)) at the end.
  returned: always
  type: int
out_of_service:
  description: With O(state=query), per server of the backend why HAProxy sends it no traffic (C(HAProxy drain),
    C(HAProxy maint), C(HAProxy health check DOWN)), empty when it is in rotation.
  returned: state is query
  type: dict
drained_by:
  description:
    - After O(state=drained), who has the host out of service. C(run) this call took it out, C(gpufleet) an earlier
      run that never put it back (the next undrain does), C(other) it was so before the run (the undrain leaves it
      so), empty in service.
  returned: always
  type: str
waited_s:
  description: Seconds waited.
  returned: always
  type: float
persistence:
  description:
    - What keeps clients on the server, read before any change. C(cookie) is the backend's cookie name (empty
      without), C(stick_table) the backend's own stick table (empty without), C(stuck) the number of its entries that
      named the server, C(found) whether either exists.
    - C(cleared) is the number of stick-table entries this call removed, and C(ended) the number of sessions it ended
      (O(on_timeout=shutdown)).
  returned: always
  type: dict
  sample: {cookie: SRV, stick_table: "", stuck: 0, found: true, cleared: 0, ended: 0}
record:
  description: The drain record after this call (empty when there is none).
  returned: always
  type: dict
msg:
  description: What was done, in words.
  returned: always
  type: str
"""

import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _drain as dr
from ansible_collections.gpufleet.upgrade.plugins.module_utils import _drain_haproxy as hx


def build_module():
    return AnsibleModule(
        argument_spec=dr.argument_spec(
            socket=dict(type="path", required=True),
            backend=dict(type="str", required=True),
            server=dict(type="str"),
            host=dict(type="str"),
            state=dict(type="str", choices=["drained", "ready", "query"], default="drained"),
            record_dir=dict(type="path"),
            run_id=dict(type="str", default=""),
            persistence=dict(type="str", choices=list(hx.PERSISTENCE_MODES), default="move"),
            on_timeout=dict(type="str", choices=["fail", "shutdown"], default="fail"),
            found_drained=dict(type="str", choices=list(dr.FOUND_DRAINED), default="upgrade"),
        ),
        required_if=[("state", "drained", ["server"]), ("state", "ready", ["server"])],
        supports_check_mode=True,
    )


def look(api, backend, server):
    states = hx.parse_servers_state(api.command(f"show servers state {backend}"))
    stats = hx.parse_stat(api.command(f"show stat {backend} 4 -1"))
    return hx.server_view(states, stats, backend, server)


def look_persistence(api, backend, view):
    cookie = hx.backend_cookie(hx.parse_stat(api.command(f"show stat {backend} 2 -1")), backend)
    table = backend if backend in hx.table_names(api.command("show table")) else ""
    entries = hx.table_entries(api.command(f"show table {table} data.server_id eq {view['id']}")) if table else []
    return hx.persistence(cookie, table, entries)


def clear_stuck(api, backend, view, found):
    """Remove the server's stick-table entries; the number removed."""
    if not found["stick_table"]:
        return 0
    where = f"{found['stick_table']} data.server_id eq {view['id']}"
    before = len(hx.table_entries(api.command(f"show table {where}")))
    reply = api.command(f"clear table {where}").strip()
    if reply:
        raise dr.DrainError(f"HAProxy refused `clear table {where}` for {backend}: {reply}")
    return before - len(hx.table_entries(api.command(f"show table {where}")))


def wait_for(module, api, view, host, found):
    """Wait until the server is idle (drained) or back in rotation (ready); ``(view, waited_s, ended)``."""
    p = module.params
    backend, server = p["backend"], p["server"]
    what = "idle" if p["state"] == "drained" else "running"
    done = hx.idle if what == "idle" else hx.in_rotation
    try:
        return (*dr.poll_until(lambda: look(api, backend, server), done, p["timeout_s"], p["interval_s"]), 0)
    except dr.DrainTimeout as exc:
        last = exc.last or view
        if what == "idle" and p["on_timeout"] == "shutdown":
            return shutdown(module, api, last, host, exc.waited_s)
        sessions = hx.sessions_of(api.command("show sess"), backend, server) if what == "idle" else []
        module.fail_json(
            msg=hx.timeout_message(host, backend, server, last, exc.waited_s, sessions, what, found),
            changed=True,
            previous=view["admin"],
            admin_state=last["admin"],
            op_state=last["op_state"],
            status=last["status"],
            sessions=last["sessions"],
            waited_s=exc.waited_s,
            persistence=found,
        )


def shutdown(module, api, last, host, waited_s):
    """End the server's sessions after a wait that ran out (on_timeout=shutdown), and wait until HAProxy counts 0."""
    p = module.params
    backend, server = p["backend"], p["server"]
    reply = api.command(f"shutdown sessions server {backend}/{server}").strip()
    if reply:
        raise dr.DrainError(f"HAProxy refused `shutdown sessions server {backend}/{server}`: {reply}")
    view, more = dr.poll_until(lambda: look(api, backend, server), hx.idle, 10, min(p["interval_s"], 0.5))
    module.warn(
        f"{host}: ended {last['sessions']} session(s) of {backend}/{server} still in flight after {waited_s:.1f}s "
        "(on_timeout=shutdown); their clients saw the requests cut"
    )
    return view, round(waited_s + more, 3), last["sessions"]


def run(module):
    p = module.params
    if p["state"] == "query":
        # Two commands for the whole backend: the rollout's budget reads every server before each batch.
        api, backend = hx.Runtime(p["socket"]), p["backend"]
        states = hx.parse_servers_state(api.command(f"show servers state {backend}"))
        out = hx.backend_view(states, hx.parse_stat(api.command(f"show stat {backend} 4 -1")), backend)
        return {"changed": False, "out_of_service": out, "msg": f"{sum(1 for w in out.values() if w)} out of service"}
    backend, server = p["backend"], p["server"]
    host = p["host"] or server
    api = hx.Runtime(p["socket"])
    path = dr.record_path(p["record_dir"], "haproxy", backend, server) if p["record_dir"] else None
    record = dr.read_record(path) if path else None
    view = look(api, backend, server)
    found = look_persistence(api, backend, view)
    # Without records every drained server counts as gpufleet's own: the way back readies it.
    ours = record is not None or (path is None and p["state"] == "ready")
    action, reason = hx.plan(p["state"], view["admin"], ours, hx.out_state(p["persistence"], found))
    after = view["admin"] if action is None else action
    new_record = record or {}
    if p["state"] == "drained" and action is not None:
        new_record = {"run_id": p["run_id"], "backend": backend, "server": server, "host": host, "at": time.time()}
    result = {"changed": action is not None, "previous": view["admin"], "admin_state": after, "waited_s": 0.0}
    out = view["admin"] != "ready"
    result["drained_by"] = dr.drained_by(action, ours, out) if p["state"] == "drained" else ""
    if result["drained_by"] == "other" and p["found_drained"] == "refuse":
        what = f"HAProxy server {backend}/{server} was in {view['admin']}"
        module.fail_json(msg=dr.found_drained_message(host, what), **result)
    result["record"] = new_record if path and p["state"] == "drained" else {}
    result["persistence"] = dict(found, cleared=0, ended=0)
    if module._diff:
        result["diff"] = {
            "before": f"{backend}/{server}: {view['admin']}\n",
            "after": f"{backend}/{server}: {after}\n",
            "before_header": f"HAProxy {p['socket']}",
            "after_header": f"HAProxy {p['socket']}",
        }
    if found["found"] and p["state"] == "drained" and p["persistence"] == "keep" and view["admin"] != "maint":
        module.warn(f"{host}: {hx.keep_warning(backend, server, found)}")
    if module.check_mode:
        result.update(op_state=view["op_state"], status=view["status"], sessions=view["sessions"])
        result["msg"] = f"{host}: {backend}/{server} would be {reason}" if action else f"{host}: {reason}"
        return result
    # The record is written before the drain is sent: a run killed in between still leaves the server ours.
    if path and new_record and new_record is not record:
        dr.write_record(path, new_record)
    if action is not None:
        hx.check_set_reply(api.command(f"set server {backend}/{server} state {action}"), backend, server, action)
    # Entries stored by the requests still in flight are cleared after the wait too.
    sweep = p["state"] == "drained" and after == "maint" and (action is not None or ours)
    cleared = clear_stuck(api, backend, view, found) if sweep else 0
    # A server left out of rotation on purpose (an operator's drain) is not waited for on the way back.
    if p["wait"] and (p["state"] == "drained" or after == "ready"):
        view, result["waited_s"], result["persistence"]["ended"] = wait_for(module, api, view, host, found)
    else:
        view = look(api, backend, server)
    if sweep:
        cleared += clear_stuck(api, backend, view, found)
    result["persistence"]["cleared"] = cleared
    result["changed"] = result["changed"] or cleared > 0
    if path and p["state"] == "ready" and view["admin"] == "ready":
        dr.remove_record(path)
    result.update(
        admin_state=view["admin"], op_state=view["op_state"], status=view["status"], sessions=view["sessions"]
    )
    sticky = f"; {cleared} stick-table entr{'y' if cleared == 1 else 'ies'} cleared" if cleared else ""
    result["msg"] = f"{host}: {backend}/{server} {reason}; {view['sessions']} session(s), {view['status']}{sticky}"
    return result


def main():
    module = build_module()
    try:
        module.exit_json(**run(module))
    except dr.DrainError as exc:
        module.fail_json(msg=f"{module.params['host'] or module.params['server']}: {exc}")


if __name__ == "__main__":
    main()
