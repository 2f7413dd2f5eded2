# Copyright: (c) 2026, gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The default index as recorded (tests/data/index, by scripts/record_index_data.py), served again on loopback.

A source can be shown the way each kind of real index looks: PEP 691 JSON with PEP 700 upload times (the
default index), or PEP 503 HTML with no dates at all (a CUDA index such as a nightly one), its files answering
HEAD with or without Last-Modified, each request after a chosen latency. A listing can be cut at a version
(``newest``), which is how a mirror whose builds stopped looks. METADATA recorded for a file is offered as
its PEP 658 ``.metadata``; wheel bodies were never recorded, so GET of a wheel is 404.

    with RecordedIndex(mode="html", last_modified=False, newest={"flashinfer-python": "0.2.14"}) as idx:
        idx.url  # http://127.0.0.1:PORT/simple
"""

from __future__ import annotations

import email.utils
import html
import json
import threading
import time
from datetime import datetime
from pathlib import Path
from urllib.parse import quote, unquote
from wsgiref.simple_server import make_server

from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

from lab.serve import QuietHandler, ThreadingWSGIServer

DATA = Path(__file__).resolve().parents[1] / "tests" / "data" / "index"
JSON_TYPE = "application/vnd.pypi.simple.v1+json"


class RecordedIndex:
    def __init__(
        self,
        mode: str = "json",
        dated: bool = True,
        last_modified: bool = True,
        latency: float = 0.0,
        newest: dict | None = None,
        projects: tuple | None = None,
        data: Path = DATA,
    ):
        self.mode, self.dated, self.last_modified, self.latency = mode, dated, last_modified, latency
        self.newest = {canonicalize_name(k): Version(v) for k, v in (newest or {}).items()}
        self.data = data
        self.metadata = {p.name[: -len(".metadata")]: p for p in (data / "metadata").glob("*.metadata")}
        self.pages = {}
        for path in sorted(data.glob("*.json")):
            if path.name == "RECORDED.json":
                continue
            page = json.loads(path.read_text())
            if projects is None or canonicalize_name(page["name"]) in {canonicalize_name(p) for p in projects}:
                self.pages[canonicalize_name(page["name"])] = self._cut(page)
        self.files = {f["filename"]: f for page in self.pages.values() for f in page["files"]}
        self.log = []
        self._lock = threading.Lock()
        self._server = None

    def _cut(self, page: dict) -> dict:
        limit = self.newest.get(canonicalize_name(page["name"]))
        if limit is None:
            return page
        files = [f for f in page["files"] if _version(f["filename"]) is None or _version(f["filename"]) <= limit]
        versions = sorted({str(_version(f["filename"])) for f in files if _version(f["filename"])}, key=Version)
        return dict(page, files=files, versions=versions)

    # --- WSGI ---------------------------------------------------------------------------------------------

    def __call__(self, environ, start_response):
        path = unquote(environ.get("PATH_INFO", ""))
        method = environ["REQUEST_METHOD"]
        with self._lock:
            self.log.append((method, path))
        if self.latency:
            time.sleep(self.latency)
        parts = [p for p in path.split("/") if p]
        if len(parts) == 2 and parts[0] == "simple" and canonicalize_name(parts[1]) in self.pages:
            return self._page(self.pages[canonicalize_name(parts[1])], environ, start_response)
        if len(parts) == 2 and parts[0] == "files":
            name = parts[1]
            if name.endswith(".metadata") and name[: -len(".metadata")] in self.metadata:
                body = self.metadata[name[: -len(".metadata")]].read_bytes()
                return _send(start_response, "200 OK", "text/plain", body, method)
            if name in self.files:
                entry = self.files[name]
                headers = [("Content-Length", str(entry.get("size") or 0))]
                if self.last_modified and entry.get("upload-time"):
                    stamp = datetime.fromisoformat(entry["upload-time"].replace("Z", "+00:00"))
                    headers.append(("Last-Modified", email.utils.format_datetime(stamp, usegmt=True)))
                if method == "HEAD":
                    start_response("200 OK", [("Content-Type", "application/octet-stream"), *headers])
                    return [b""]
        return _send(start_response, "404 Not Found", "text/plain", b"not recorded\n", method)

    def _page(self, page, environ, start_response):
        files = []
        for entry in page["files"]:
            out = dict(entry)
            if not self.dated:
                out.pop("upload-time", None)
            if entry["filename"] in self.metadata:
                out["core-metadata"] = True
            files.append(out)
        if self.mode == "json" and JSON_TYPE in environ.get("HTTP_ACCEPT", ""):
            body = json.dumps({**page, "files": files}).encode()
            return _send(start_response, "200 OK", JSON_TYPE, body, environ["REQUEST_METHOD"])
        anchors = []
        for entry in files:
            attrs = f' href="{html.escape(quote(entry["url"]))}#sha256={entry["hashes"]["sha256"]}"'
            if entry.get("requires-python"):
                attrs += f' data-requires-python="{html.escape(entry["requires-python"])}"'
            if entry.get("core-metadata"):
                attrs += ' data-core-metadata="true"'
            if entry.get("yanked"):
                attrs += ' data-yanked=""'
            anchors.append(f"<a{attrs}>{html.escape(entry['filename'])}</a><br/>")
        body = ("<!DOCTYPE html><html><body>\n" + "\n".join(anchors) + "\n</body></html>\n").encode()
        return _send(start_response, "200 OK", "text/html", body, environ["REQUEST_METHOD"])

    # --- server -------------------------------------------------------------------------------------------

    def __enter__(self):
        self._server = make_server("127.0.0.1", 0, self, ThreadingWSGIServer, handler_class=QuietHandler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self._server.shutdown()
        self._server.server_close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_port}/simple"

    def count(self, method: str) -> int:
        with self._lock:
            return sum(1 for m, _p in self.log if m == method)


def _version(filename: str):
    try:
        return parse_wheel_filename(filename)[1]
    except ValueError:
        return None


def _send(start_response, status, ctype, body, method):
    start_response(status, [("Content-Type", ctype), ("Content-Length", str(len(body)))])
    return [b"" if method == "HEAD" else body]
