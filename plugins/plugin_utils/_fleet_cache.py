# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The run's fleet cache on the controller: start it once per run (reused by every batch), say where hosts find
it, stop it and count what it served. The server itself is ``_fleet_cache_server.py`` (Python's http.server).

One server per mount set (the wheels of role venv_rebuild, the redist archives of role cuda_toolkit: each role names
its own folder) and listen address, each with its state, ready file and access log in the run's folder. It listens,
unless told otherwise, on the controller address the hosts reach it at (``controller_address``): the address their
SSH session comes from, or the one the inventory names; hosts that reach the controller at two addresses get a server
on each."""

from __future__ import annotations

import fcntl
import json
import os
import re
import signal
import subprocess
import sys
import time

from ansible_collections.gpufleet.upgrade.plugins.plugin_utils._fleet_cache_server import alive

SERVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_fleet_cache_server.py")
PREFIX = "fleet-cache"


def _files(run_dir, mounts, bind) -> dict:
    """State, ready, access-log and server-log paths of the server for these mount names and this address."""
    base = os.path.join(run_dir, f"{PREFIX}-{'-'.join(sorted(mounts))}-{re.sub(r'[^A-Za-z0-9.-]', '_', bind)}")
    return {
        "state": base + ".json",
        "ready": base + ".ready",
        "access_log": base + ".access.jsonl",
        "log": base + ".log",
        "lock": base + ".lock",
    }


class FleetCacheError(Exception):
    """The cache cannot be started or read; the message says why and what to do."""


def ours(pid) -> bool:
    """Whether ``pid`` is a running fleet cache server, not a process that got a dead server's pid since."""
    if not alive(pid):
        return False
    try:
        with open(f"/proc/{int(pid)}/cmdline", "rb") as handle:
            return os.path.basename(SERVER).encode() in handle.read()
    except OSError:
        return not os.path.exists("/proc/self/cmdline")  # no /proc (not Linux): trust the pid


def read_state(path):
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


def start(run_dir, mounts, bind, port=0, watch_pid=None, python=None, timeout=15.0) -> dict:
    """The running cache of this run (started now, or ``reused``): ``{pid, port, bind, mounts, access_log}``.

    Reused only by the ansible-playbook process that started it (``watch_pid``): a server another run left (it
    ends once that run's process is reaped, maybe in the middle of this run) is replaced, as is one of other
    folders. Every host of a batch asks at once: the first starts it under a lock, the others reuse it."""
    os.makedirs(run_dir, exist_ok=True)
    files = _files(run_dir, mounts, bind)
    with open(files["lock"], "a", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _start(files, mounts, bind, port, watch_pid, python, timeout)


def _start(files, mounts, bind, port, watch_pid, python, timeout) -> dict:
    state = read_state(files["state"]) or {}
    mounts = {name: os.path.realpath(folder) for name, folder in sorted(mounts.items())}
    watch_pid = int(watch_pid or os.getpid())
    mine = {"mounts": mounts, "bind": bind, "watch_pid": watch_pid}
    running = ours(state.get("pid"))
    if running and all(state.get(key) == value for key, value in mine.items()):
        return dict(state, reused=True)
    for name, folder in mounts.items():
        if not os.path.isdir(folder):
            raise FleetCacheError(f"fleet cache: the folder to serve under /{name}/ ({folder}) does not exist")
    if running:
        _end(state["pid"])
    ready, access_log = files["ready"], files["access_log"]
    if os.path.exists(ready):
        os.unlink(ready)
    argv = [python or sys.executable, SERVER, "--bind", bind, "--port", str(port), "--ready", ready]
    argv += ["--watch-pid", str(watch_pid), "--access-log", access_log]
    for name, folder in mounts.items():
        argv += ["--mount", f"{name}={folder}"]
    with open(files["log"], "ab") as log:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
    deadline = time.monotonic() + timeout
    while not os.path.exists(ready):
        if proc.poll() is not None or time.monotonic() > deadline:
            if proc.poll() is None:
                proc.kill()
            raise FleetCacheError(
                f"fleet cache: the HTTP server did not start on {bind}:{port} (exit {proc.poll()}): "
                f"{tail(files['log'])}; fix: free the port or set gpufleet_fleet_cache_port; for an address that is"
                " not the controller's own (NAT, a jump host) set gpufleet_fleet_cache_bind to one that is and"
                " gpufleet_fleet_cache_host to the one the hosts reach; or give a site cache in"
                " gpufleet_fleet_cache_url"
            )
        time.sleep(0.05)
    with open(ready, encoding="utf-8") as handle:
        info = json.load(handle)
    state = dict(mine, pid=info["pid"], port=info["port"], access_log=access_log)
    tmp = files["state"] + ".tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(state, handle, indent=1)
    os.replace(tmp, files["state"])
    return dict(state, reused=False)


def stop(run_dir, timeout=10.0) -> dict:
    """Stop the run's caches (those that run) and return what they served together (``served``)."""
    try:
        names = sorted(n for n in os.listdir(run_dir) if n.startswith(PREFIX + "-") and n.endswith(".json"))
    except FileNotFoundError:
        names = []
    stopped, logs = [], []
    for name in names:
        path = os.path.join(run_dir, name)
        state = read_state(path) or {}
        if ours(state.get("pid")):
            stopped.append(_end(state["pid"], timeout))
        logs.append(state.get("access_log"))
        os.unlink(path)
    return {"stopped": bool(stopped) and all(stopped), "servers": len(names), "served": served(*logs)}


def _end(pid, timeout=10.0) -> bool:
    os.kill(int(pid), signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while alive(pid) and time.monotonic() < deadline:
        _reap(pid)
        time.sleep(0.05)
    return not alive(pid)


def _reap(pid) -> None:
    try:
        os.waitpid(int(pid), os.WNOHANG)
    except ChildProcessError:
        pass


def served(*access_logs) -> dict:
    """Requests and bytes the caches served, in all and per client address, from their access logs."""
    out = {"requests": 0, "bytes": 0, "errors": 0, "clients": {}}
    for line in _lines(access_logs):
        try:
            record = json.loads(line)
        except ValueError:
            continue
        out["requests"] += 1
        out["bytes"] += int(record.get("bytes") or 0)
        status = record.get("status")
        out["errors"] += 1 if isinstance(status, int) and status >= 400 else 0
        client = out["clients"].setdefault(record.get("client", "?"), {"requests": 0, "bytes": 0})
        client["requests"] += 1
        client["bytes"] += int(record.get("bytes") or 0)
    return out


def _lines(paths):
    for path in paths:
        if path and os.path.exists(path):
            with open(path, encoding="utf-8") as handle:
                yield from handle


def controller_address(ssh_client, override_host=None) -> str:
    """The controller's address as a host reaches it: the one that host's SSH session comes from (``SSH_CLIENT``),
    unless the inventory names one. The cache listens there by default, so only the hosts' network reaches it."""
    address = override_host or (str(ssh_client or "").split() or [""])[0]
    if not address:
        raise FleetCacheError(
            "fleet cache: the controller's address as this host sees it is unknown (no SSH_CLIENT: not an SSH"
            " connection); fix: set gpufleet_fleet_cache_host to an address of the controller the host can reach,"
            " or gpufleet_distribution=push"
        )
    # sshd listening on IPv6 names an IPv4 client as ::ffff:a.b.c.d: the controller holds the IPv4 address.
    return address[len("::ffff:") :] if address.lower().startswith("::ffff:") and "." in address else address


def host_url(address, port) -> str:
    """The cache's URL at ``address`` (``controller_address``)."""
    if ":" in address and not address.startswith("["):
        address = f"[{address}]"
    return f"http://{address}:{port}"


def tail(path, limit=600) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()[-limit:].strip() or "(no output)"
    except OSError:
        return "(no log)"
