# Copyright: (c) 2026, gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One lab mirror server process: a pypiserver index or a static tree, both logging every request.

Each request becomes one JSON line in the access log (time, method, path, status, bytes sent,
duration, Accept header), so tests and benchmarks can count what the mirrors served.

    python -m lab.serve --kind pypi --root DIR --port 38100 --access-log FILE [--pep691]
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
    # Several nodes installing at once open many connections; the default backlog of 5 would refuse some.
    request_queue_size = 128


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


JSON_V1 = "application/vnd.pypi.simple.v1+json"
HTML_V1 = "application/vnd.pypi.simple.v1+html"


def _wants_json(accept: str) -> bool:
    """PEP 691 content negotiation: the highest q among the types we serve wins, JSON on a tie."""
    best = {JSON_V1: -1.0, HTML_V1: -1.0, "text/html": -1.0}
    for part in accept.split(","):
        fields = [f.strip() for f in part.split(";")]
        q = 1.0
        for f in fields[1:]:
            if f.startswith("q="):
                try:
                    q = float(f[2:])
                except ValueError:
                    q = 0.0
        if fields[0] in best:
            best[fields[0]] = max(best[fields[0]], q)
        elif fields[0] == "*/*":
            best["text/html"] = max(best["text/html"], q)
    return best[JSON_V1] > 0 and best[JSON_V1] >= max(best[HTML_V1], best["text/html"])


class Pep691:
    """PEP 691 JSON (with PEP 700 ``versions``, ``size``, ``upload-time`` from the file's mtime) in front of
    pypiserver, which only speaks HTML. Requests that do not ask for JSON go to pypiserver unchanged."""

    def __init__(self, app, root: Path):
        self.app, self.root = app, root
        self._hashes: dict[tuple[str, int, int], str] = {}
        self.lock = threading.Lock()

    def _sha256(self, path: Path, st) -> str:
        key = (path.name, st.st_size, int(st.st_mtime))
        with self.lock:
            if key not in self._hashes:
                import hashlib

                self._hashes[key] = hashlib.sha256(path.read_bytes()).hexdigest()
            return self._hashes[key]

    def _files(self):
        from packaging.utils import canonicalize_name, parse_sdist_filename, parse_wheel_filename

        for path in sorted(self.root.iterdir()):
            try:
                if path.name.endswith(".whl"):
                    name, version, _, _ = parse_wheel_filename(path.name)
                elif path.name.endswith((".tar.gz", ".zip")):
                    name, version = parse_sdist_filename(path.name)
                else:
                    continue
            except ValueError:
                continue
            yield canonicalize_name(name), version, path

    def __call__(self, environ, start_response):
        path = environ.get("PATH_INFO", "")
        if not _wants_json(environ.get("HTTP_ACCEPT", "")) or not path.startswith("/simple/"):
            return self.app(environ, start_response)
        from packaging.utils import canonicalize_name

        project = path[len("/simple/") :].strip("/")
        if not project:
            names = sorted({n for n, _, _ in self._files()})
            body = {"meta": {"api-version": "1.1"}, "projects": [{"name": n} for n in names]}
            return self._json(start_response, body)
        if "/" in project:
            return self.app(environ, start_response)
        if canonicalize_name(project) != project or not path.endswith("/"):
            start_response("301 Moved Permanently", [("Location", f"/simple/{canonicalize_name(project)}/")])
            return [b""]
        files, versions = [], set()
        for name, version, fpath in self._files():
            if name != project:
                continue
            st = fpath.stat()
            versions.add(version)
            upload = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(st.st_mtime)) + ".000000Z"
            files.append(
                {
                    "filename": fpath.name,
                    "url": f"/packages/{quote(fpath.name)}",
                    "hashes": {"sha256": self._sha256(fpath, st)},
                    "requires-python": None,
                    "size": st.st_size,
                    "upload-time": upload,
                    "yanked": False,
                }
            )
        if not files:
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [f"Not Found ({project} does not exist)\n".encode()]
        body = {
            "meta": {"api-version": "1.1"},
            "name": project,
            "versions": [str(v) for v in sorted(versions)],
            "files": files,
        }
        return self._json(start_response, body)

    @staticmethod
    def _json(start_response, body: dict):
        data = json.dumps(body).encode()
        start_response("200 OK", [("Content-Type", JSON_V1), ("Content-Length", str(len(data))), ("Vary", "Accept")])
        return [data]


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
    ap.add_argument("--pep691", action="store_true", help="also answer PEP 691/700 JSON (pypi kind)")
    args = ap.parse_args(argv)
    app = pypi_app(args.root) if args.kind == "pypi" else static_app(args.root, args.prefix)
    if args.kind == "pypi" and args.pep691:
        app = Pep691(app, args.root)
    logged = AccessLog(app, args.access_log, args.name or args.kind)
    httpd = make_server(args.host, args.port, logged, server_class=ThreadingWSGIServer, handler_class=QuietHandler)
    print(f"serving {args.kind} {args.root} on http://{args.host}:{args.port} (pid {os.getpid()})", flush=True)
    httpd.serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
