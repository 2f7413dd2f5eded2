# Copyright: (c) 2026, gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Unit tests of the lab's pure parts (no podman, no network): `.venv/bin/pytest lab/tests`."""

from __future__ import annotations

import json
import os
import time
import urllib.request
import zipfile
from email.utils import formatdate
from pathlib import Path
from wsgiref.util import setup_testing_defaults

import pytest

from lab import redist, serve
from lab.common import replace_dir


def call(app, path: str, **headers) -> tuple[str, dict, bytes]:
    environ = {"PATH_INFO": path, "REQUEST_METHOD": headers.pop("method", "GET")}
    environ.update({f"HTTP_{k.upper()}": v for k, v in headers.items()})
    setup_testing_defaults(environ)
    environ["PATH_INFO"] = path
    seen = {}

    def start_response(status, hdrs, exc_info=None):
        seen["status"], seen["headers"] = status, dict(hdrs)

    body = b"".join(app(environ, start_response))
    return seen["status"], seen["headers"], body


PIP_ACCEPT = "application/vnd.pypi.simple.v1+json, application/vnd.pypi.simple.v1+html; q=0.1, text/html; q=0.01"


@pytest.mark.parametrize(
    ("accept", "expected"),
    [
        (PIP_ACCEPT, True),
        ("application/vnd.pypi.simple.v1+json", True),
        ("text/html", False),
        ("*/*", False),
        ("", False),
        ("application/vnd.pypi.simple.v1+json; q=0.2, text/html", False),
        ("application/vnd.pypi.simple.v1+json; q=0", False),
    ],
)
def test_wants_json_follows_q_values(accept, expected):
    assert serve._wants_json(accept) is expected


def _wheel(root: Path, name: str, age_days: float = 0) -> Path:
    path = root / name
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("x/__init__.py", name)
    stamp = time.time() - age_days * 86400
    os.utime(path, (stamp, stamp))
    return path


def _inner(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/html")])
    return [b"<html>pypiserver</html>"]


def test_pep691_lists_files_with_size_hash_and_upload_time(tmp_path):
    _wheel(tmp_path, "lab_torch-2.9.1+cu128-py3-none-any.whl", age_days=300)
    _wheel(tmp_path, "lab_torch-2.11.0+cu130-py3-none-any.whl")
    _wheel(tmp_path, "six-1.16.0-py2.py3-none-any.whl")
    app = serve.Pep691(_inner, tmp_path)
    status, headers, body = call(app, "/simple/lab-torch/", accept=PIP_ACCEPT)
    assert status.startswith("200") and headers["Content-Type"] == serve.JSON_V1
    data = json.loads(body)
    assert data["versions"] == ["2.9.1+cu128", "2.11.0+cu130"]
    old = next(f for f in data["files"] if f["filename"].startswith("lab_torch-2.9.1"))
    assert old["size"] == (tmp_path / old["filename"]).stat().st_size
    assert old["upload-time"].startswith(time.strftime("%Y-%m-%d", time.gmtime(time.time() - 300 * 86400)))
    assert old["url"] == "/packages/lab_torch-2.9.1%2Bcu128-py3-none-any.whl"
    projects = json.loads(call(app, "/simple/", accept=PIP_ACCEPT)[2])["projects"]
    assert [p["name"] for p in projects] == ["lab-torch", "six"]


def test_pep691_redirects_404s_and_passes_html_through(tmp_path):
    _wheel(tmp_path, "lab_torch-2.9.1+cu128-py3-none-any.whl")
    app = serve.Pep691(_inner, tmp_path)
    status, headers, _ = call(app, "/simple/Lab_Torch/", accept=PIP_ACCEPT)
    assert status.startswith("301") and headers["Location"] == "/simple/lab-torch/"
    assert call(app, "/simple/nope/", accept=PIP_ACCEPT)[0].startswith("404")
    assert call(app, "/simple/lab-torch/", accept="text/html")[2] == b"<html>pypiserver</html>"


def test_static_app_serves_last_modified_and_304(tmp_path):
    f = tmp_path / "redistrib_13.0.2.json"
    f.write_text("{}")
    stamp = time.time() - 86400
    os.utime(f, (stamp, stamp))
    app = serve.static_app(tmp_path, "/redist")
    status, headers, body = call(app, "/redist/redistrib_13.0.2.json")
    assert status.startswith("200") and body == b"{}"
    assert headers["Last-Modified"] == formatdate(stamp, usegmt=True)
    assert call(app, "/redist/redistrib_13.0.2.json", if_modified_since=headers["Last-Modified"])[0].startswith("304")
    assert call(app, "/redist/../etc/passwd")[0].startswith(("403", "404"))
    assert call(app, "/other/redistrib_13.0.2.json")[0].startswith("404")
    (tmp_path / ".recipe").write_text("x")
    assert call(app, "/redist/.recipe")[0].startswith("404")


def test_access_log_counts_bytes(tmp_path):
    log = tmp_path / "access.jsonl"
    app = serve.AccessLog(serve.static_app(tmp_path, "/redist"), log, "redist")
    (tmp_path / "a.bin").write_bytes(b"x" * 5000)
    call(app, "/redist/a.bin")
    rec = json.loads(log.read_text().splitlines()[-1])
    assert (rec["path"], rec["status"], rec["bytes"]) == ("/redist/a.bin", 200, 5000)


def test_unpack_maps_wheel_layout_to_toolkit_layout(tmp_path):
    wheel = tmp_path / "nvidia_nvvm-13.0.88-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for name in (
            "nvidia/cu13/lib/libnvvm.so.4",
            "nvidia/cu13/include/nvvm.h",
            "nvidia/cu13/nvvm/bin/cicc",
            "nvidia/cu13/__init__.py",
            "nvidia/cu13/.metadata/provenance.txt",
        ):
            info = zipfile.ZipInfo(name)
            info.external_attr = (0o755 if name.endswith("cicc") else 0o644) << 16
            zf.writestr(info, name)
        zf.writestr("nvidia_nvvm-13.0.88.dist-info/licenses/License.txt", "license text")
    spec = redist.RELEASES["13.0.2"]["components"]["libnvvm"]
    top = tmp_path / "libnvvm-linux-x86_64-13.0.88-archive"
    redist._unpack(wheel, spec, top)
    files = sorted(str(p.relative_to(top)) for p in top.rglob("*") if not p.is_dir())
    assert files == [
        "LICENSE",
        "nvvm/bin/cicc",
        "nvvm/include/nvvm.h",
        "nvvm/lib64/libnvvm.so",
        "nvvm/lib64/libnvvm.so.4",
    ]
    assert os.readlink(top / "nvvm/lib64/libnvvm.so") == "libnvvm.so.4"
    assert os.access(top / "nvvm/bin/cicc", os.X_OK)


def test_replace_dir_swaps_trees(tmp_path):
    final, tmp = tmp_path / "tree", tmp_path / ".tmp-tree"
    final.mkdir()
    (final / "old").write_text("1")
    tmp.mkdir()
    (tmp / "new").write_text("2")
    replace_dir(tmp, final)
    assert sorted(p.name for p in final.iterdir()) == ["new"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tree"]


def test_nvcc_128_standin_answers_version_and_refuses_to_compile(tmp_path):
    import subprocess

    nvcc = tmp_path / "nvcc"
    nvcc.write_text(redist.NVCC_128_STANDIN)
    nvcc.chmod(0o755)
    out = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True, check=False)
    assert out.returncode == 0
    assert out.stdout.splitlines()[3] == "Cuda compilation tools, release 12.8, V12.8.93"
    compile_ = subprocess.run([str(nvcc), "-c", "k.cu"], capture_output=True, text=True, check=False)
    assert compile_.returncode == 1 and "stand-in" in compile_.stderr


def test_wheel_builder_injects_version_deps_and_keeps_scripts(tmp_path, monkeypatch):
    from lab import wheels

    src = tmp_path / "src-trees"
    pkg = src / "lab-demo" / "src" / "lab_demo"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("from lab_demo._build_info import VERSION as __version__\n")
    (src / "lab-demo" / "pyproject.toml").write_text(
        '[project]\nname = "lab-demo"\nversion = "0.0.0"\n[project.scripts]\nlab-demo = "lab_demo:main"\n'
    )
    monkeypatch.setattr(wheels, "WHEELS_SRC", src)
    spec = {"module": "lab_demo", "summary": "demo"}
    build = {"version": "1.2.3+cu130", "requires": ["six>=1.17"], "info": {"cuda": "13.0"}}
    wheel = wheels._build_one("lab-demo", spec, build, tmp_path / "out", tmp_path / "work")
    assert wheel.name == "lab_demo-1.2.3+cu130-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as zf:
        meta = zf.read("lab_demo-1.2.3+cu130.dist-info/METADATA").decode()
        info = zf.read("lab_demo/_build_info.py").decode()
        scripts = zf.read("lab_demo-1.2.3+cu130.dist-info/entry_points.txt").decode()
    assert "Version: 1.2.3+cu130" in meta and "Requires-Dist: six>=1.17" in meta
    assert "VERSION = '1.2.3+cu130'" in info and "'cuda': '13.0'" in info
    assert "lab-demo = lab_demo:main" in scripts
    assert wheels._build_one("lab-absent", {"module": "lab_absent"}, build, tmp_path / "out", tmp_path / "work") is None


def test_private_server_serves_on_its_own_port_and_log_and_stops(tmp_path):
    from lab.common import mirror_ports
    from lab.mirrors import PrivateServer

    (tmp_path / "tree" / "a").mkdir(parents=True)
    (tmp_path / "tree" / "a" / "f.bin").write_bytes(b"x" * 123)
    log = tmp_path / "access.jsonl"
    args = ["--kind", "static", "--root", str(tmp_path / "tree"), "--prefix", "/files"]
    with PrivateServer("unit-private", args, "/files", log) as server:
        assert server.port not in mirror_ports().values()
        with urllib.request.urlopen(server.url + "/a/f.bin", timeout=5) as resp:
            assert resp.read() == b"x" * 123
        time.sleep(0.2)
        rows = [json.loads(line) for line in log.read_text().splitlines()]
        assert [r["bytes"] for r in rows if r["path"] == "/files/a/f.bin"] == [123]
    assert server.proc.poll() is not None


def test_private_server_that_cannot_start_says_which_and_where(tmp_path):
    from lab.mirrors import PrivateServer

    with pytest.raises(RuntimeError, match=r"unit-broken: lab.serve on http://127.0.0.1:\d+/simple did not start"):
        PrivateServer("unit-broken", ["--kind", "nonsense", "--root", str(tmp_path)], "/simple", tmp_path / "log")


def test_a_mirror_port_held_by_another_checkouts_server_is_refused_naming_it(tmp_path, monkeypatch):
    import socket
    import subprocess
    import sys
    import time
    from pathlib import Path

    from lab import mirrors

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # A lab.serve of another checkout: its command line names lab.serve and the port, its cwd is that checkout.
    other = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; time.sleep(60)", "lab.serve", "--port", str(port)], cwd=tmp_path
    )
    try:
        # Right after the fork its command line can still be empty: wait until the kernel shows the new one.
        deadline = time.monotonic() + 10
        while not (Path("/proc") / str(other.pid) / "cmdline").read_bytes() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert mirrors._other_server(port) == f"pid {other.pid} in {tmp_path}"
        monkeypatch.setattr(mirrors, "is_built", lambda: True)
        monkeypatch.setattr(mirrors, "RUN", tmp_path / "run")
        monkeypatch.setattr(mirrors, "LOGS", tmp_path / "logs")
        monkeypatch.setattr(mirrors, "port_open", lambda p: p == port)
        ports = {"lab-main": port, "lab-stale": port, "redist": port}
        with pytest.raises(RuntimeError, match=rf"127.0.0.1:{port} is in use by another checkout's lab mirror "):
            mirrors._start(ports)
    finally:
        other.kill()
        other.wait()
