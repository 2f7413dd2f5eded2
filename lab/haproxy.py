# Copyright: (c) 2026, gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A real HAProxy (Debian's package) on loopback in front of a lab fleet's serving units.

``start(name)`` renders ``.lab/<name>/haproxy/haproxy.cfg`` from the lab's nodes (each node's serving port on
127.0.0.1, the node's name as server name), checks it with ``haproxy -c`` and runs HAProxy in the background with an
admin stats socket; ``stop(name)`` ends exactly the process it started (its pid file). The upgrade drains a host
through that socket (``gpufleet_drain=haproxy``, module ``gpufleet.upgrade.drain_haproxy``), delegated to the
controller.

    python -m lab.haproxy start --name drain      # prints port, socket, config
    python -m lab.haproxy stop --name drain

HAProxy retries nothing here (``retries 0``, no ``option redispatch``): a request sent to a host that stopped
serving fails and the test sees it, so zero failed requests proves the drain, not the balancer's retries.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import sys
import time
from pathlib import Path

from lab import nodes
from lab.common import free_port, log, port_open, run, write_atomic

BACKEND = "serving"
FRONTEND = "serving_in"
RING = "errors"
# Health checks every 500 ms, 2 to go down or up again: a restarted unit is back in rotation about a second after
# it answers /health.
CHECK = "check inter 500ms fall 2 rise 2"


def haproxy_dir(name: str) -> Path:
    return nodes.lab_dir(name) / "haproxy"


def render(servers: dict[str, int], port: int, socket_path: Path, backend: str = BACKEND) -> str:
    """haproxy.cfg for ``servers`` ({server name: serving port on 127.0.0.1}), listening on 127.0.0.1:port."""
    lines = [
        "# Rendered by lab/haproxy.py for a lab fleet; rewritten on every start.",
        "global",
        f"    stats socket {socket_path} mode 600 level admin",
        "    stats timeout 30s",
        f"    log ring@{RING} local0",
        "",
        # Failed and abnormal requests only (dontlog-normal), kept in memory: `show events <ring>` reads them.
        f"ring {RING}",
        "    format rfc3164",
        "    maxlen 1200",
        "    size 1048576",
        "",
        "defaults",
        "    mode http",
        # A stopped server refuses at once whatever this is; 5 s keeps a starved machine's slow accept from failing.
        "    timeout connect 5s",
        "    timeout client 60s",
        "    timeout server 60s",
        "    retries 0",
        "    log global",
        "    option httplog",
        "    option dontlog-normal",
        "",
        f"frontend {FRONTEND}",
        f"    bind 127.0.0.1:{port}",
        f"    default_backend {backend}",
        "",
        f"backend {backend}",
        "    balance roundrobin",
        "    option httpchk GET /health",
        "    http-check expect status 200",
    ]
    lines += [f"    server {srv} 127.0.0.1:{srv_port} {CHECK}" for srv, srv_port in sorted(servers.items())]
    return "\n".join(lines) + "\n"


def error_log(socket_path: str) -> list[str]:
    """The failed or abnormal requests HAProxy logged (its ring buffer), oldest first."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(socket_path)
        sock.sendall(f"show events {RING}\n".encode())
        answer = b"".join(iter(lambda: sock.recv(65536), b""))
    return [line for line in answer.decode(errors="replace").splitlines() if line.strip()]


def fleet_servers(name: str) -> dict[str, int]:
    state = nodes.load_state(name)
    if not state["nodes"]:
        raise RuntimeError(f"lab {name} has no nodes; run `python -m lab up N --name {name}` first")
    return {node: nd["serving_port"] for node, nd in state["nodes"].items()}


def running_pid(pid_file: Path) -> int | None:
    """The pid in ``pid_file`` while that process runs (a daemon this lab started), else None."""
    try:
        pid = int(pid_file.read_text().split()[0])
        # An ended daemon nobody reaped is a zombie: it no longer runs.
        if "\nState:\tZ" in Path(f"/proc/{pid}/status").read_text():
            return None
        return pid
    except (OSError, ValueError, IndexError):
        return None


def end_daemon(pid_file: Path, timeout: float = 10.0) -> bool:
    """SIGTERM the daemon of ``pid_file`` and wait until it ended; True when one was running."""
    pid = running_pid(pid_file)
    if pid is None:
        return False
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while running_pid(pid_file) is not None and time.monotonic() < deadline:
        time.sleep(0.1)
    return True


def start(name: str, port: int | None = None) -> dict:
    """Render the config for lab ``name`` and run HAProxy; an HAProxy this lab already runs is replaced."""
    binary = shutil.which("haproxy")
    if binary is None:
        raise RuntimeError("haproxy is not installed; run scripts/setup.sh (apt-get install haproxy)")
    stop(name)
    folder = haproxy_dir(name)
    folder.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    socket_path = folder / "admin.sock"
    config = folder / "haproxy.cfg"
    write_atomic(config, render(fleet_servers(name), port, socket_path), mode=0o644)
    run([binary, "-c", "-q", "-f", str(config)], capture=True)
    run([binary, "-D", "-f", str(config), "-p", str(folder / "haproxy.pid")], capture=True)
    deadline = time.monotonic() + 10
    while not (socket_path.exists() and port_open(port)):
        if time.monotonic() > deadline:
            raise RuntimeError(f"haproxy did not listen on 127.0.0.1:{port} with socket {socket_path} in 10 s")
        time.sleep(0.1)
    info = {
        "port": port,
        "socket": str(socket_path),
        "config": str(config),
        "backend": BACKEND,
        "pid": running_pid(folder / "haproxy.pid"),
    }
    write_atomic(folder / "haproxy.json", json.dumps(info, indent=2) + "\n")
    log(f"lab {name}: haproxy on 127.0.0.1:{port}, socket {socket_path}")
    return info


def stop(name: str) -> bool:
    """End the HAProxy this lab started (by its pid file); True when one was running."""
    ended = end_daemon(haproxy_dir(name) / "haproxy.pid")
    (haproxy_dir(name) / "admin.sock").unlink(missing_ok=True)
    return ended


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab.haproxy", description="HAProxy in front of a lab fleet")
    ap.add_argument("action", choices=["start", "stop"])
    ap.add_argument("--name", default="lab")
    ap.add_argument("--port", type=int)
    args = ap.parse_args(argv)
    try:
        out = start(args.name, args.port) if args.action == "start" else {"stopped": stop(args.name)}
    except RuntimeError as exc:
        log(f"error: {exc}")
        return 1
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
