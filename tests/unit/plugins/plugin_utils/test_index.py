# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Index access (plugins/plugin_utils/_index.py) against a small HTTP server on loopback."""

from __future__ import annotations

import hashlib
import io
import json
import os
import socket
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _hash_record as hr
from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _index as ix
from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _wheels as w

LAST_MODIFIED = "Tue, 14 Oct 2025 08:00:00 GMT"


def wheel_bytes(name="lab-torch", version="2.11.0+cu130", meta_version=None, padding=0):
    buf = io.BytesIO()
    dist = name.replace("-", "_")
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as zf:
        zf.writestr(f"{dist}/__init__.py", "")
        zf.writestr(f"{dist}/blob.bin", os.urandom(padding))
        zf.writestr(
            f"{dist}-{version}.dist-info/METADATA",
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {meta_version or version}\nRequires-Dist: six\n",
        )
    return buf.getvalue()


class Server:
    """Routes: path -> (content type, body). Honours Accept (JSON only if the route has a JSON variant), Range, HEAD."""

    def __init__(self, ranges=True):
        self.routes, self.json_routes, self.ranges, self.log = {}, {}, ranges, []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_HEAD(self):
                self.do_GET(head=True)

            def do_GET(self, head=False):
                server.log.append((self.command, self.path, self.headers.get("Range")))
                wants_json = ix.JSON_TYPE in (self.headers.get("Accept") or "")
                if wants_json and self.path in server.json_routes:
                    ctype, body = ix.JSON_TYPE, server.json_routes[self.path]
                elif self.path in server.routes:
                    ctype, body = server.routes[self.path]
                else:
                    self.send_error(404)
                    return
                status, rng = 200, self.headers.get("Range")
                if rng and server.ranges:
                    start, end = rng.split("=")[1].split("-")
                    body, status = body[int(start) : int(end) + 1], 206
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Last-Modified", LAST_MODIFIED)
                if server.ranges:
                    self.send_header("Accept-Ranges", "bytes")
                self.end_headers()
                if not head:
                    self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_port}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    srv = Server()
    yield srv
    srv.close()


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_listing_prefers_pep691_json(server):
    body = wheel_bytes()
    sha = hashlib.sha256(body).hexdigest()
    server.json_routes["/simple/lab-torch/"] = json.dumps(
        {
            "meta": {"api-version": "1.1"},
            "files": [
                {
                    "filename": "lab_torch-2.11.0+cu130-py3-none-any.whl",
                    "url": "/files/lab_torch-2.11.0+cu130-py3-none-any.whl",
                    "hashes": {"sha256": sha},
                    "upload-time": "2026-01-02T03:04:05Z",
                }
            ],
        }
    ).encode()
    server.routes["/simple/lab-torch/"] = ("text/html", b"<a href='/x/other-1.0-py3-none-any.whl'>x</a>")
    (c,) = ix.Fetcher().listing("main", server.url + "/simple", "Lab_Torch")
    assert c.sha256 == sha and c.date_source == "upload-time"
    assert c.url == server.url + "/files/lab_torch-2.11.0+cu130-py3-none-any.whl"


def test_listing_falls_back_to_pep503_html(server):
    server.routes["/simple/six/"] = ("text/html", b'<a href="/p/six-1.17.0-py3-none-any.whl#sha256=abcd">six</a>')
    (c,) = ix.Fetcher().listing("main", server.url + "/simple/", "six")
    assert c.sha256 == "abcd" and c.url == server.url + "/p/six-1.17.0-py3-none-any.whl"


def test_listing_of_unknown_project_is_empty(server):
    assert ix.Fetcher().listing("main", server.url + "/simple", "nothing-here") == []


def test_unreachable_index_names_index_and_url():
    url = f"http://127.0.0.1:{free_port()}/simple"
    with pytest.raises(ix.IndexUnreachable) as err:
        ix.Fetcher(timeout=5).listing("lab-main", url, "six")
    assert f"index 'lab-main' ({url}) is unreachable" in str(err.value)
    assert "gpufleet_index_urls" in str(err.value)


def test_date_undated_reads_last_modified(server):
    server.routes["/p/six-1.17.0-py3-none-any.whl"] = ("application/octet-stream", b"x")
    c = w.make_candidate("main", "six-1.17.0-py3-none-any.whl", server.url + "/p/six-1.17.0-py3-none-any.whl")
    ix.Fetcher().date_undated([c])
    assert c.date.isoformat() == "2025-10-14" and c.date_source == "last-modified"


def test_metadata_from_pep658_file_does_not_touch_the_wheel(server):
    server.routes["/p/lab_torch-2.11.0+cu130-py3-none-any.whl.metadata"] = (
        "text/plain",
        b"Metadata-Version: 2.1\nName: lab-torch\nVersion: 2.11.0+cu130\nRequires-Dist: six\n",
    )
    url = server.url + "/p/lab_torch-2.11.0+cu130-py3-none-any.whl"
    c = w.make_candidate("main", "lab_torch-2.11.0+cu130-py3-none-any.whl", url, metadata_url=url + ".metadata")
    meta = ix.Fetcher().metadata(c)
    assert str(meta.version) == "2.11.0+cu130"
    assert [p for _method, p, _range in server.log] == ["/p/lab_torch-2.11.0+cu130-py3-none-any.whl.metadata"]


def test_metadata_by_range_reads_only_a_small_part_of_a_big_wheel(server):
    body = wheel_bytes(padding=2_000_000)
    server.routes["/p/lab_torch-2.11.0+cu130-py3-none-any.whl"] = ("application/octet-stream", body)
    url = server.url + "/p/lab_torch-2.11.0+cu130-py3-none-any.whl"
    c = w.make_candidate("main", "lab_torch-2.11.0+cu130-py3-none-any.whl", url)
    fetcher = ix.Fetcher()
    meta = fetcher.metadata(c)
    assert str(meta.version) == "2.11.0+cu130" and [str(r) for r in meta.requires_dist] == ["six"]
    assert fetcher.bytes_in < 20_000 < len(body)
    assert all(rng for method, _path, rng in server.log if method == "GET")


def test_metadata_without_range_support_downloads_the_wheel():
    srv = Server(ranges=False)
    try:
        body = wheel_bytes(meta_version="2.11.0")
        srv.routes["/p/lab_torch-2.11.0+cu130-py3-none-any.whl"] = ("application/octet-stream", body)
        url = srv.url + "/p/lab_torch-2.11.0+cu130-py3-none-any.whl"
        c = w.make_candidate("main", "lab_torch-2.11.0+cu130-py3-none-any.whl", url)
        meta = ix.Fetcher().metadata(c)
        assert w.metadata_problem(c, meta) == "METADATA version 2.11.0 disagrees with the file name's 2.11.0+cu130"
    finally:
        srv.close()


def test_download_verifies_sha256_and_reuses_a_good_copy(server, tmp_path):
    body = wheel_bytes()
    server.routes["/p/a.whl"] = ("application/octet-stream", body)
    dest = tmp_path / "wh" / "a.whl"
    fetcher = ix.Fetcher()
    assert fetcher.download(server.url + "/p/a.whl", str(dest), hashlib.sha256(body).hexdigest()) is True
    assert dest.read_bytes() == body
    assert fetcher.download(server.url + "/p/a.whl", str(dest), hashlib.sha256(body).hexdigest()) is False
    assert fetcher.downloads == [server.url + "/p/a.whl"]


def test_a_recorded_wheel_is_not_read_again_and_a_changed_one_is(server, tmp_path, monkeypatch):
    body = wheel_bytes()
    sha = hashlib.sha256(body).hexdigest()
    server.routes["/p/a.whl"] = ("application/octet-stream", body)
    folder = tmp_path / "wh"
    fetcher = ix.Fetcher()
    record = hr.HashRecord(str(folder))
    assert fetcher.download(server.url + "/p/a.whl", str(folder / "a.whl"), sha, record) is True
    record.save()
    hashed = []
    real = hr.file_sha256
    monkeypatch.setattr(hr, "file_sha256", lambda path: hashed.append(path) or real(path))
    # A later run: the record says the file is the one hashed, and it kept its size and mtime.
    assert fetcher.download(server.url + "/p/a.whl", str(folder / "a.whl"), sha, hr.HashRecord(str(folder))) is False
    assert hashed == []
    # Someone rewrites the file (same size, new mtime): it is hashed, found wrong and fetched again.
    (folder / "a.whl").write_bytes(bytes(len(body)))
    again = hr.HashRecord(str(folder))
    assert fetcher.download(server.url + "/p/a.whl", str(folder / "a.whl"), sha, again) is True
    assert hashed == [str(folder / "a.whl")]
    assert (folder / "a.whl").read_bytes() == body
    again.save()
    assert json.loads((folder / hr.HashRecord.NAME).read_text())["a.whl"][-1] == sha


def test_the_wheelhouse_check_reads_only_changed_files(tmp_path, monkeypatch):
    from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _wheel_plan as wp

    wh = tmp_path / "wh"
    wh.mkdir()
    lock = {"packages": [], "tools": []}
    for name in ("a.whl", "b.whl"):
        (wh / name).write_bytes(name.encode() * 1000)
        lock["packages"].append({"filename": name, "sha256": hashlib.sha256(name.encode() * 1000).hexdigest()})
    lock["tools"].append({"filename": "missing.whl", "sha256": "0" * 64})
    assert wp.verify_wheelhouse(lock, str(wh)) == ["missing.whl"]
    hashed = []
    real = hr.file_sha256
    monkeypatch.setattr(hr, "file_sha256", lambda path: hashed.append(os.path.basename(path)) or real(path))
    assert wp.verify_wheelhouse(lock, str(wh)) == ["missing.whl"]
    assert hashed == []
    (wh / "b.whl").write_bytes(b"x" * 3000)
    assert wp.verify_wheelhouse(lock, str(wh)) == ["b.whl", "missing.whl"]
    assert hashed == ["b.whl"]


def test_download_with_hash_mismatch_leaves_nothing(server, tmp_path):
    server.routes["/p/a.whl"] = ("application/octet-stream", b"re-uploaded content")
    dest = tmp_path / "a.whl"
    with pytest.raises(ix.HashMismatch) as err:
        ix.Fetcher().download(server.url + "/p/a.whl", str(dest), "0" * 64)
    assert "says sha256 " + "0" * 64 in str(err.value)
    assert hashlib.sha256(b"re-uploaded content").hexdigest() in str(err.value)
    assert list(tmp_path.iterdir()) == []


def test_a_pip_style_file_index_directory_is_read_through_its_index_html(tmp_path):
    """A local PEP 503 tree (simple/<project>/index.html), as pip reads it from a file:// URL."""
    project = tmp_path / "simple" / "lab-torch"
    project.mkdir(parents=True)
    name = "lab_torch-2.11.0+cu130-py3-none-any.whl"
    (project / "index.html").write_text(f'<a href="../../files/{name}#sha256={"AB" * 32}">{name}</a>')
    cands = ix.Fetcher().listing("local", (tmp_path / "simple").as_uri(), "lab-torch")
    assert [(c.filename, c.sha256) for c in cands] == [(name, "ab" * 32)]
    assert cands[0].url == f"file://{tmp_path}/files/{name}"
    assert ix.directory_index("http://127.0.0.1:1/simple/x/") == "http://127.0.0.1:1/simple/x/"
