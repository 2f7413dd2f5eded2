# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The run's fleet cache on the controller: start it once per run (reused by every batch), say where hosts find
it, stop it and count what it served. The server itself is ``_fleet_cache_server.py`` (Python's http.server)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

SERVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_fleet_cache_server.py")
STATE = "fleet-cache.json"
READY = "fleet-cache.ready"
ACCESS_LOG = "fleet-cache.access.jsonl"
SERVER_LOG = "fleet-cache.log"


class FleetCacheError(Exception):
    """The cache cannot be started or read; the message says why and what to do."""


def alive(pid) -> bool:
    try:
        os.kill(int(pid), 0)
    except (ProcessLookupError, ValueError, TypeError):
        return False
    except PermissionError:
        return True
    return True


def read_state(run_dir):
    try:
        with open(os.path.join(run_dir, STATE), encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


def start(run_dir, mounts, bind="0.0.0.0", port=0, watch_pid=None, python=None, timeout=15.0) -> dict:
    """The running cache of this run (started now, or ``reused``): ``{pid, port, bind, mounts, access_log}``."""
    state = read_state(run_dir)
    mounts = {name: os.path.realpath(folder) for name, folder in sorted(mounts.items())}
    if state and alive(state.get("pid")) and state.get("mounts") == mounts and state.get("bind") == bind:
        return dict(state, reused=True)
    for name, folder in mounts.items():
        if not os.path.isdir(folder):
            raise FleetCacheError(f"fleet cache: the folder to serve under /{name}/ ({folder}) does not exist")
    os.makedirs(run_dir, exist_ok=True)
    ready = os.path.join(run_dir, READY)
    if os.path.exists(ready):
        os.unlink(ready)
    access_log = os.path.join(run_dir, ACCESS_LOG)
    argv = [python or sys.executable, SERVER, "--bind", bind, "--port", str(port), "--ready", ready]
    argv += ["--watch-pid", str(watch_pid or os.getpid()), "--access-log", access_log]
    for name, folder in mounts.items():
        argv += ["--mount", f"{name}={folder}"]
    with open(os.path.join(run_dir, SERVER_LOG), "ab") as log:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
    deadline = time.monotonic() + timeout
    while not os.path.exists(ready):
        if proc.poll() is not None or time.monotonic() > deadline:
            if proc.poll() is None:
                proc.kill()
            raise FleetCacheError(
                f"fleet cache: the HTTP server did not start on {bind}:{port} (exit {proc.poll()}): "
                f"{tail(os.path.join(run_dir, SERVER_LOG))}; fix: free the port or set gpufleet_fleet_cache_port,"
                " or give a site cache in gpufleet_fleet_cache_url"
            )
        time.sleep(0.05)
    with open(ready, encoding="utf-8") as handle:
        info = json.load(handle)
    state = {"pid": info["pid"], "port": info["port"], "bind": bind, "mounts": mounts, "access_log": access_log}
    tmp = os.path.join(run_dir, STATE + ".tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(state, handle, indent=1)
    os.replace(tmp, os.path.join(run_dir, STATE))
    return dict(state, reused=False)


def stop(run_dir, timeout=10.0) -> dict:
    """Stop the run's cache (if it runs) and return what it served (``served``)."""
    state = read_state(run_dir)
    if not state:
        return {"stopped": False, "served": served(None)}
    pid = state.get("pid")
    stopped = False
    if alive(pid):
        os.kill(int(pid), signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while alive(pid) and time.monotonic() < deadline:
            _reap(pid)
            time.sleep(0.05)
        stopped = not alive(pid)
    os.unlink(os.path.join(run_dir, STATE))
    return {"stopped": stopped, "served": served(state.get("access_log"))}


def _reap(pid) -> None:
    try:
        os.waitpid(int(pid), os.WNOHANG)
    except ChildProcessError:
        pass


def served(access_log) -> dict:
    """Requests and bytes the cache served, in all and per client address, from its access log."""
    out = {"requests": 0, "bytes": 0, "errors": 0, "clients": {}}
    if not access_log or not os.path.exists(access_log):
        return out
    with open(access_log, encoding="utf-8") as handle:
        for line in handle:
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


def host_url(ssh_client, port, override_host=None) -> str:
    """The cache's URL as a host reaches it: the controller's address that host's SSH session comes from
    (``SSH_CLIENT``), unless the inventory names one."""
    address = override_host or (str(ssh_client or "").split() or [""])[0]
    if not address:
        raise FleetCacheError(
            "fleet cache: the controller's address as this host sees it is unknown (no SSH_CLIENT: not an SSH"
            " connection); fix: set gpufleet_fleet_cache_host to an address of the controller the host can reach,"
            " or gpufleet_distribution=push"
        )
    if ":" in address and not address.startswith("["):
        address = f"[{address}]"
    return f"http://{address}:{port}"


def tail(path, limit=600) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()[-limit:].strip() or "(no output)"
    except OSError:
        return "(no log)"
