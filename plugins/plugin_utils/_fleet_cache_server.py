# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fleet cache the collection starts for a run: the controller's verified wheelhouse and redist cache, served
read-only over HTTP so that every host pulls its files (each checked against the lock's or the manifest's sha256)
instead of the controller pushing them over SSH.

Python's own ``http.server`` (ThreadingHTTPServer, SimpleHTTPRequestHandler) does the serving; this file only
mounts the folders (``/wheels/`` and ``/redist/``, nothing else of the controller's folder), writes one JSON line per
request (path, status, bytes) for the run's byte accounting, and ends the server when the ansible-playbook process
that started it is gone, so a run that dies leaves no server behind. Standard library only: the action plugin
``fleet_cache`` runs it as a script with the controller's Python.

It serves regular files under a mount's folder and nothing else: a request path with ``.`` or ``..`` segments
(encoded or not) is refused (403), the real path of the file (every link resolved) must lie under the mount's folder
(a link that leads out of it: 403), and it must be a regular file (a folder, device or pipe: 403); no listings.

    python _fleet_cache_server.py --mount wheels=DIR --mount redist=DIR --bind 10.0.0.5 --port 0 \\
        --watch-pid PID --ready FILE --access-log FILE
"""

from __future__ import annotations

import argparse
import functools
import http.server
import json
import os
import socket
import stat
import sys
import threading
import time
import urllib.parse


class MountHandler(http.server.SimpleHTTPRequestHandler):
    """GET and HEAD of regular files under the mounts (``resolve``); no listings; one JSON line per request."""

    server_version = "gpufleet-fleet-cache/1"

    def __init__(self, *args, mounts=None, log_file=None, **kwargs):
        self.mounts = mounts or {}
        self.log_file = log_file
        self.sent = 0
        super().__init__(*args, directory=os.devnull, **kwargs)

    def send_head(self):
        """Serve the file ``resolve`` allows, or answer its refusal; http.server does the rest (headers, HEAD)."""
        code, target = self.resolve(self.path)
        if code != 200:
            self.send_error(code, target)
            return None
        self.target = target
        return super().send_head()

    def translate_path(self, path):
        return self.target  # send_head resolved and checked it

    def resolve(self, path):
        """(200, real path of a regular file under the mount) or (404 / 403, why): /<mount>/<relative path> only."""
        path = urllib.parse.unquote(path.split("?", 1)[0].split("#", 1)[0])
        parts = [p for p in path.split("/") if p]
        if any(p in (".", "..") or "\0" in p for p in parts):
            return 403, "no relative segments"
        if len(parts) < 2 or parts[0] not in self.mounts:
            return 404, "not found"
        root = self.mounts[parts[0]]
        real = os.path.realpath(os.path.join(root, *parts[1:]))
        if os.path.commonpath([root, real]) != root:
            return 403, "outside the served folder"
        try:
            mode = os.stat(real).st_mode
        except OSError:
            return 404, "not found"
        return (200, real) if stat.S_ISREG(mode) else (403, "not a regular file")

    def copyfile(self, source, outputfile):
        while True:
            chunk = source.read(1 << 20)
            if not chunk:
                return
            outputfile.write(chunk)
            self.sent += len(chunk)

    def log_request(self, code="-", size="-"):
        self.status = int(code) if str(code).isdigit() else code  # written once the body is sent (_record)

    def do_GET(self):
        try:
            super().do_GET()
        finally:
            self._record()

    def do_HEAD(self):
        try:
            super().do_HEAD()
        finally:
            self._record()

    def _record(self):
        if not self.log_file:
            return
        record = {"ts": round(time.time(), 3), "client": self.client_address[0], "method": self.command}
        record.update(path=self.path, status=getattr(self, "status", None), bytes=self.sent)
        line = json.dumps(record, sort_keys=True) + "\n"
        with self.server.log_lock, open(self.log_file, "a", encoding="utf-8") as handle:
            handle.write(line)

    def log_message(self, format, *args):
        return  # requests go to the JSON access log, errors to the status code: nothing on stderr


class Server6(http.server.ThreadingHTTPServer):
    address_family = socket.AF_INET6


def alive(pid) -> bool:
    """Whether process ``pid`` runs. A zombie (exited, its parent has not reaped it yet: ansible-runner reaps
    ansible-playbook late) counts as gone, though ``kill(pid, 0)`` still reaches it."""
    try:
        os.kill(int(pid), 0)
    except (ProcessLookupError, ValueError, TypeError):
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{int(pid)}/stat", encoding="ascii", errors="replace") as handle:
            return handle.read().rpartition(")")[2].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return not os.path.exists("/proc/self/stat")  # gone since kill(); or no /proc (not Linux): it runs
    except (OSError, IndexError):
        return True


def watch(server, pid: int, interval: float = 1.0) -> None:
    while alive(pid):
        time.sleep(interval)
    server.shutdown()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mount", action="append", default=[], help="NAME=DIR, served under /NAME/")
    parser.add_argument("--bind", required=True, help="address to listen on (IPv4 or IPv6)")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--watch-pid", type=int, required=True, help="stop when this process is gone")
    parser.add_argument("--ready", required=True, help="file to write {port, pid} to once the server listens")
    parser.add_argument("--access-log")
    args = parser.parse_args(argv)
    mounts = {}
    for spec in args.mount:
        name, sep, folder = spec.partition("=")
        if not sep or not name or "/" in name:
            parser.error(f"--mount {spec!r}: give NAME=DIR")
        mounts[name] = os.path.realpath(folder)
    handler = functools.partial(MountHandler, mounts=mounts, log_file=args.access_log)
    try:
        server = (Server6 if ":" in args.bind else http.server.ThreadingHTTPServer)((args.bind, args.port), handler)
    except OSError as exc:
        print(f"cannot listen on {args.bind}:{args.port}: {exc}", file=sys.stderr)
        return 2
    server.daemon_threads = True
    server.log_lock = threading.Lock()
    threading.Thread(target=watch, args=(server, args.watch_pid), daemon=True).start()
    tmp = args.ready + ".tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump({"port": server.server_address[1], "pid": os.getpid(), "bind": args.bind}, handle)
    os.replace(tmp, args.ready)
    try:
        server.serve_forever(poll_interval=0.5)
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
