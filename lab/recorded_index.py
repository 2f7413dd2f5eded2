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

``RecordedPages`` serves one static page recorded from a public repository (tests/data/index/pages, described under
``pages`` in RECORDED.json: the sgl-kernel and flashinfer-jit-cache cu130 pages, a page in PyTorch's index format)
the way its index serves it: the page's own text and order, a project it does not carry answered with the status
that index gives (PyTorch's: 403), links without a sha256 left without one. Only two things are rewritten, so
that the lab can serve the files: link origins (an absolute URL keeps its path on this server) and hashes.

The real wheels cannot be served (hundreds of MB each, and a republished file's earlier bodies are gone), so each
entry of the page gets a small lab wheel of the same file name (name, version and tags as the name says) and the
page lists that wheel's sha256 where it listed the real one. A file name listed N times gets N lab wheels that
differ only by which entry they stand for, so N distinct hashes stand where the N real ones stood, and the file's
URL serves the body of the LAST entry: as on the real index, where each republish replaced the release asset and
only the newest can be downloaded. Entries are thus told apart exactly as the real ones are: by position and
hash, and only the last one's hash matches what is served. METADATA hashes (data-core-metadata) are rewritten the
same way.

    with RecordedPages("sgl-whl-cu130") as idx:
        idx.url  # http://127.0.0.1:PORT/simple
        idx.entries("sgl_kernel-0.3.21+cu130-cp310-abi3-manylinux2014_x86_64.whl")  # recorded and lab hashes
"""

from __future__ import annotations

import base64
import contextlib
import email.utils
import hashlib
import html
import io
import json
import re
import threading
import time
import zipfile
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import quote, unquote, urlsplit
from wsgiref.simple_server import make_server

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import Version

from lab.serve import QuietHandler, ThreadingWSGIServer

DATA = Path(__file__).resolve().parents[1] / "tests" / "data" / "index"
JSON_TYPE = "application/vnd.pypi.simple.v1+json"


class _Loopback:
    """A WSGI app served on a free loopback port, with its requests logged (method, path)."""

    path = "simple"  # where the index's project pages are, below the server's root
    latency = 0.0

    def _start_log(self):
        self.log = []
        self._lock = threading.Lock()
        self._server = None

    def _note(self, environ) -> tuple:
        path = unquote(environ.get("PATH_INFO", ""))
        method = environ["REQUEST_METHOD"]
        with self._lock:
            self.log.append((method, path))
        if self.latency:
            time.sleep(self.latency)
        return method, path

    def __enter__(self):
        self._server = make_server("127.0.0.1", 0, self, ThreadingWSGIServer, handler_class=QuietHandler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self._server.shutdown()
        self._server.server_close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_port}/{self.path}"

    def count(self, method: str, suffix: str = "") -> int:
        """Requests of ``method`` (to paths ending in ``suffix``) served so far."""
        with self._lock:
            return sum(1 for m, p in self.log if m == method and p.endswith(suffix))


class RecordedIndex(_Loopback):
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
        self._start_log()

    def _cut(self, page: dict) -> dict:
        limit = self.newest.get(canonicalize_name(page["name"]))
        if limit is None:
            return page
        files = [f for f in page["files"] if _version(f["filename"]) is None or _version(f["filename"]) <= limit]
        versions = sorted({str(_version(f["filename"])) for f in files if _version(f["filename"])}, key=Version)
        return dict(page, files=files, versions=versions)

    # --- WSGI ---------------------------------------------------------------------------------------------

    def __call__(self, environ, start_response):
        method, path = self._note(environ)
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


def _version(filename: str):
    try:
        return parse_wheel_filename(filename)[1]
    except ValueError:
        return None


def _send(start_response, status, ctype, body, method):
    start_response(status, [("Content-Type", ctype), ("Content-Length", str(len(body)))])
    return [b"" if method == "HEAD" else body]


# --- static pages recorded from public repositories ----------------------------------------------------------

ANCHOR = re.compile(
    r'(<a href=")(?P<href>[^"#]*)(?:#sha256=(?P<sha>[0-9a-fA-F]+))?(")(?P<attrs>[^>]*)>(?P<name>[^<]*)</a>'
)
META_ATTR = re.compile(r'(data-(?:core|dist-info)-metadata="sha256=)[0-9a-fA-F]+(")')
ZIP_TIME = (2026, 1, 1, 0, 0, 0)  # fixed, so a lab wheel's bytes (and its hash) are the same on every run


def lab_wheel(filename: str, entry: int, listed: int, recorded_sha256: str | None) -> bytes:
    """A small real wheel for ``filename`` (name, version and tags from it) standing for entry ``entry`` of the
    ``listed`` entries a page gives that name; entries differ by one line, so their hashes differ."""
    name, version, _build, tags = parse_wheel_filename(filename)
    dist = f"{name.replace('-', '_')}-{version}"
    info = f"{dist}.dist-info"
    module = name.replace("-", "_")
    files = {
        f"{module}/__init__.py": f"__version__ = {str(version)!r}\n",
        f"{info}/METADATA": wheel_metadata(filename).decode(),
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: gpufleet-lab\nRoot-Is-Purelib: false\n"
        + "".join(f"Tag: {t}\n" for t in sorted(str(t) for t in tags)),
        f"{info}/recorded_entry.txt": f"entry {entry} of {listed}; recorded sha256 {recorded_sha256 or 'none'}\n",
    }
    record = []
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for member, text in files.items():
            zf.writestr(zipfile.ZipInfo(member, ZIP_TIME), text)
            digest = hashlib.sha256(text.encode()).digest()
            b64 = base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
            record.append(f"{member},sha256={b64},{len(text.encode())}")
        zf.writestr(zipfile.ZipInfo(f"{info}/RECORD", ZIP_TIME), "\n".join([*record, f"{info}/RECORD,,"]) + "\n")
    return buf.getvalue()


def wheel_metadata(filename: str) -> bytes:
    name, version, _build, _tags = parse_wheel_filename(filename)
    return f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode()


class RecordedPages(_Loopback):
    """One recorded static index (``source``: a key of RECORDED.json ``pages``) served on loopback."""

    def __init__(self, source: str, data: Path = DATA, latency: float = 0.0):
        self.doc = json.loads((data / "RECORDED.json").read_text())["pages"][source]
        self.source, self.latency = source, latency
        self.path = self.doc.get("prefix", "simple").strip("/")
        self.project = canonicalize_name(self.doc["project"])
        recorded = (data / self.doc["page"]).read_text()
        self._entries = {}  # file name -> [{recorded, lab, body}] in page order
        for match in ANCHOR.finditer(recorded):
            self._entries.setdefault(_basename(match["href"]), []).append(match["sha"])
        self.bodies, self.metadata, self.stamps = {}, {}, {}
        listed = self.doc.get("first_listed", {})
        for filename, hashes in self._entries.items():
            rows = []
            for pos, sha in enumerate(hashes, 1):
                body = lab_wheel(filename, pos, len(hashes), sha)
                rows.append({"recorded": sha.lower() if sha else None, "lab": hashlib.sha256(body).hexdigest()})
            self._entries[filename] = rows
            self.bodies[filename] = lab_wheel(filename, len(hashes), len(hashes), hashes[-1])
            self.metadata[filename] = wheel_metadata(filename)
            # A release host dates a file by its upload: the commit that first listed the served entry's hash.
            first = listed.get((hashes[-1] or "").lower())
            if first:
                self.stamps[filename] = datetime.fromisoformat(first["date"])
        self.page = self._rewrite(recorded)
        self._start_log()

    def _rewrite(self, text: str) -> str:
        seen = {}

        def anchor(match):
            filename = _basename(match["href"])
            pos = seen[filename] = seen.get(filename, -1) + 1
            href = urlsplit(match["href"])._replace(scheme="", netloc="").geturl()
            sha = self._entries[filename][pos]["lab"] if match["sha"] else None
            meta_sha = hashlib.sha256(self.metadata[filename]).hexdigest()
            attrs = META_ATTR.sub(lambda m: f"{m[1]}{meta_sha}{m[2]}", match["attrs"])
            fragment = f"#sha256={sha}" if sha else ""
            return f"{match[1]}{href}{fragment}{match[4]}{attrs}>{match['name']}</a>"

        return ANCHOR.sub(anchor, text)

    def entries(self, filename: str) -> list:
        """The page's entries for a file name, in page order: ``recorded`` (the real sha256, None for a link
        without one) and ``lab`` (the sha256 of the lab wheel standing for it)."""
        return [dict(row) for row in self._entries[filename]]

    def served_sha256(self, filename: str) -> str:
        return hashlib.sha256(self.bodies[filename]).hexdigest()

    # --- WSGI ---------------------------------------------------------------------------------------------

    def __call__(self, environ, start_response):
        method, path = self._note(environ)
        parts = [p for p in path.split("/") if p]
        depth = len(self.path.split("/"))
        under = parts[:depth] == self.path.split("/")
        rest = parts[depth:] if under else []
        name = parts[-1] if parts else ""
        if name.endswith(".metadata") and name[: -len(".metadata")] in self.metadata:
            return _send(start_response, "200 OK", "text/plain", self.metadata[name[: -len(".metadata")]], method)
        if name in self.bodies:
            return _send_file(environ, start_response, self.bodies[name], self.stamps.get(name))
        if under and len(rest) == 1:
            if canonicalize_name(rest[0]) == self.project:
                return _send(start_response, "200 OK", "text/html", self.page.encode(), method)
            status = self.doc.get("missing_project_status", 404)
            return _send(start_response, _STATUS[status], "text/plain", f"{status} not carried\n".encode(), method)
        return _send(start_response, "404 Not Found", "text/plain", b"not recorded\n", method)


_STATUS = {403: "403 Forbidden", 404: "404 Not Found"}


def _basename(href: str) -> str:
    name = unquote(urlsplit(href).path.rsplit("/", 1)[-1])
    try:
        parse_wheel_filename(name)
    except InvalidWheelFilename as exc:
        raise ValueError(f"recorded page links {href!r}, which is not a wheel") from exc
    return name


def _send_file(environ, start_response, body: bytes, stamp=None):
    """A wheel with HEAD and single Range requests answered, as the release hosts answer them."""
    headers = [("Content-Type", "application/octet-stream"), ("Accept-Ranges", "bytes")]
    if stamp:
        headers.append(("Last-Modified", email.utils.format_datetime(stamp.astimezone(timezone.utc), usegmt=True)))
    match = re.fullmatch(r"bytes=(\d*)-(\d*)", environ.get("HTTP_RANGE", ""))
    if match and environ["REQUEST_METHOD"] == "GET":
        first, last = match.groups()
        start = int(first) if first else max(0, len(body) - int(last))
        end = min(len(body) - 1, int(last)) if first and last else len(body) - 1
        part = body[start : end + 1]
        headers += [("Content-Range", f"bytes {start}-{end}/{len(body)}"), ("Content-Length", str(len(part)))]
        start_response("206 Partial Content", headers)
        return [part]
    start_response("200 OK", [*headers, ("Content-Length", str(len(body)))])
    return [b"" if environ["REQUEST_METHOD"] == "HEAD" else body]


def recorded_profile(servers: dict) -> dict:
    """A cu130 stack profile over the recorded static pages (``servers``: pytorch, sgl and flashinfer RecordedPages,
    started): torch from PyTorch's nightly index, the kernels from their own indexes with PyTorch's index named
    first for them, as a profile may name it (it carries neither: 403). flashinfer's page gives no dates at all."""
    return {
        "name": "recorded",
        "python": {"version": "3.11"},
        "cuda": {"version": "13.0"},
        "wheels": {
            "indexes": [{"name": n, "url": s.url} for n, s in servers.items()],
            "packages": [
                {"name": "torch", "spec": ">=2.11.0.dev0,<2.12", "indexes": ["pytorch"], "local_tag": "cu130"},
                {"name": "sgl-kernel", "spec": "==0.3.21", "indexes": ["pytorch", "sgl"], "local_tag": "cu130"},
                {
                    "name": "flashinfer-jit-cache",
                    "spec": "==0.6.4",
                    "indexes": ["pytorch", "flashinfer"],
                    "local_tag": "cu130",
                    "undatable": "allow",
                },
            ],
        },
    }


@contextlib.contextmanager
def recorded_indexes():
    """The three recorded static indexes started, by the names ``recorded_profile`` gives them."""
    with (
        RecordedPages("pytorch-nightly-cu130") as torch,
        RecordedPages("sgl-whl-cu130") as sgl,
        RecordedPages("flashinfer-whl-cu130") as fi,
    ):
        yield {"pytorch": torch, "sgl": sgl, "flashinfer": fi}
