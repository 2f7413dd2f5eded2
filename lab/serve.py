# Copyright: (c) 2026, gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One lab mirror server process: a pypiserver index or a static tree, both logging every request.

Each request becomes one JSON line in the access log (time, method, path, status, bytes sent,
duration, Accept header), so tests and benchmarks can count what the mirrors served.

    python -m lab.serve --kind pypi --root DIR --port 38100 --access-log FILE
    python -m lab.serve --kind static --root DIR --prefix /redist --port 38102 --access-log FILE
"""

from __future__ import annotations

import argparse
import html
import json
import mimetypes
import os
import threading
import time
from email.utils import formatdate, parsedate_to_datetime
from pathlib import Path
from socketserver import ThreadingMixIn
from urllib.parse import quote, unquote
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

CHUNK = 1 << 20


class ThreadingWSGIServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True


class QuietHandler(WSGIRequestHandler):
    def log_message(self, format, *args):
        pass


class AccessLog:
    """WSGI middleware writing one JSON line per finished request."""

    def __init__(self, app, path: Path, name: str):
        self.app, self.name = app, name
        self.fh = path.open("a", buffering=1)
        self.lock = threading.Lock()

    def __call__(self, environ, start_response):
        t0 = time.monotonic()
        seen = {}

        def _start(status, headers, exc_info=None):
            seen["status"] = int(status.split()[0])
            return start_response(status, headers, exc_info)

        body = self.app(environ, _start)
        sent = 0
        try:
            for chunk in body:
                sent += len(chunk)
                yield chunk
        finally:
            if hasattr(body, "close"):
                body.close()
            rec = {
                "ts": round(time.time(), 3),
                "server": self.name,
                "method": environ.get("REQUEST_METHOD"),
                "path": environ.get("PATH_INFO"),
                "query": environ.get("QUERY_STRING", ""),
                "status": seen.get("status"),
                "bytes": sent,
                "ms": round((time.monotonic() - t0) * 1000, 1),
                "accept": environ.get("HTTP_ACCEPT", ""),
                "user_agent": environ.get("HTTP_USER_AGENT", "")[:120],
            }
            with self.lock:
                self.fh.write(json.dumps(rec) + "\n")


def static_app(root: Path, prefix: str):
    """Files under ``root`` at ``prefix``, with Last-Modified and If-Modified-Since, like a plain web server."""
    root = root.resolve()
    prefix = "/" + prefix.strip("/")

    def app(environ, start_response):
        path = unquote(environ.get("PATH_INFO", "/"))
        if path != prefix and not path.startswith(prefix + "/"):
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"not found\n"]
        target = (root / path[len(prefix) :].lstrip("/")).resolve()
        if target != root and root not in target.parents:
            start_response("403 Forbidden", [("Content-Type", "text/plain")])
            return [b"forbidden\n"]
        if target.is_dir():
            if not path.endswith("/"):
                start_response("301 Moved Permanently", [("Location", path + "/")])
                return [b""]
            rows = "".join(
                f'<a href="{quote(p.name)}{"/" if p.is_dir() else ""}">{html.escape(p.name)}</a><br>\n'
                for p in sorted(target.iterdir())
                if not p.name.startswith(".")
            )
            body = f"<!DOCTYPE html><html><body>\n{rows}</body></html>\n".encode()
            start_response("200 OK", [("Content-Type", "text/html"), ("Content-Length", str(len(body)))])
            return [body]
        if not target.is_file() or target.name.startswith("."):
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"not found\n"]
        st = target.stat()
        headers = [
            ("Last-Modified", formatdate(st.st_mtime, usegmt=True)),
            ("Content-Type", mimetypes.guess_type(target.name)[0] or "application/octet-stream"),
            ("Accept-Ranges", "none"),
        ]
        ims = environ.get("HTTP_IF_MODIFIED_SINCE")
        if ims:
            try:
                if int(st.st_mtime) <= parsedate_to_datetime(ims).timestamp():
                    start_response("304 Not Modified", headers)
                    return [b""]
            except (TypeError, ValueError):
                pass
        headers.append(("Content-Length", str(st.st_size)))
        start_response("200 OK", headers)
        if environ["REQUEST_METHOD"] == "HEAD":
            return [b""]
        return _file_chunks(target)

    return app


def _file_chunks(path: Path):
    with path.open("rb") as fh:
        while chunk := fh.read(CHUNK):
            yield chunk


def pypi_app(root: Path):
    import pypiserver
    from pypiserver.config import Config

    # No fallback: a missing project must 404 here, never redirect to a public index.
    config = Config.from_args(
        ["run", "--disable-fallback", "--hash-algo", "sha256", "--backend", "simple-dir", str(root)]
    )
    return pypiserver.setup_routes_from_config(pypiserver.app_from_config(config), config)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--kind", choices=["pypi", "static"], required=True)
    ap.add_argument("--root", type=Path, required=True)
    ap.add_argument("--prefix", default="/redist")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--name", default="")
    ap.add_argument("--access-log", type=Path, required=True)
    args = ap.parse_args(argv)
    app = pypi_app(args.root) if args.kind == "pypi" else static_app(args.root, args.prefix)
    logged = AccessLog(app, args.access_log, args.name or args.kind)
    httpd = make_server(args.host, args.port, logged, server_class=ThreadingWSGIServer, handler_class=QuietHandler)
    print(f"serving {args.kind} {args.root} on http://{args.host}:{args.port} (pid {os.getpid()})", flush=True)
    httpd.serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
