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

    python _fleet_cache_server.py --mount wheels=DIR --mount redist=DIR --bind 0.0.0.0 --port 0 \\
        --watch-pid PID --ready FILE --access-log FILE
"""

from __future__ import annotations

import argparse
import functools
import http.server
import json
import os
import posixpath
import sys
import threading
import time
import urllib.parse


class MountHandler(http.server.SimpleHTTPRequestHandler):
    """GET and HEAD of files under the mounts; no directory listings; one JSON line per request."""

    server_version = "gpufleet-fleet-cache/1"

    def __init__(self, *args, mounts=None, log_file=None, **kwargs):
        self.mounts = mounts or {}
        self.log_file = log_file
        self.sent = 0
        super().__init__(*args, directory=os.devnull, **kwargs)

    def translate_path(self, path):
        """/<mount>/<relative path> -> the file under that mount's folder; anything else -> a path that is absent."""
        clean = posixpath.normpath(urllib.parse.unquote(urllib.parse.urlsplit(path).path))
        parts = [p for p in clean.split("/") if p]
        if len(parts) < 2 or parts[0] not in self.mounts or any(p in ("..", ".") for p in parts):
            return os.path.join(os.devnull, "absent")
        return os.path.join(self.mounts[parts[0]], *parts[1:])

    def list_directory(self, path):
        self.send_error(404, "no listings")
        return None

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
    parser.add_argument("--bind", default="0.0.0.0")
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
        server = http.server.ThreadingHTTPServer((args.bind, args.port), handler)
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
