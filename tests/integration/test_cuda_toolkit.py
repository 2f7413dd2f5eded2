# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Role cuda_toolkit, redist method, on two lab nodes that start from CUDA 12.8: the four-step check
(check, apply, check, apply), the link policy, download economy, and the bad inputs of issue 3."""

from __future__ import annotations

import http.server
import json
import shutil
import socket
import threading
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

PLAY = Path(__file__).resolve().parent / "playbooks" / "cuda_toolkit.yml"
TARGET = "/usr/local/cuda-13.0"
OLD = "/usr/local/cuda-12.8"
AGENT = "gpufleet-it-cuda-toolkit"
# Fingerprint of a tree: every entry's type, mode and link target, then every file's sha256.
TREE_SUM = (
    "cd {path} && {{ find . -printf '%p %y %m %l\\n' | LC_ALL=C sort;"
    " find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum; }} | sha256sum"
)


@pytest.fixture(scope="module")
def fleet(lab_fleet):
    return lab_fleet(2, name="cuda-it")


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("cuda-cache")


def sh(node_exec, node, cmd):
    return node_exec(node, cmd, check=False).stdout.strip()


def tree_sum(node_exec, node, path):
    return sh(node_exec, node, TREE_SUM.format(path=path))


def changed(result, host=None):
    return [f"{r.task}" for r in result.changed_tasks(host)]


def redist_requests(lab_mirrors, since):
    return [r for r in lab_mirrors.requests("redist", since) if r.get("user_agent") == AGENT]


def test_four_step_install_beside_12_8(fleet, run_playbook, node_exec, lab_mirrors, cache_dir):
    before = {n: tree_sum(node_exec, n, OLD) for n in fleet.nodes}
    assert all(len(s) > 60 for s in before.values()), before
    extra = {"cuda_toolkit_cache_dir": str(cache_dir), "cuda_toolkit_http_agent": AGENT}

    # 1. check mode: changed, the diff names the components, nothing written.
    t0 = time.time()
    res = run_playbook(PLAY, fleet.inventory, extravars=extra, check=True, diff=True)
    assert res.rc == 0, str(res)
    for node in fleet.nodes:
        install = res.task("Build the toolkit in a staging folder and move it into place", host=node)
        assert install.changed
        for comp in ("cuda_nvcc 13.0.88", "cuda_crt 13.0.88", "libnvvm 13.0.88", "cuda_cudart 13.0.96"):
            assert comp in install.res["diff"]["after"], install.res["diff"]
        assert changed(res, node) == [install.task], changed(res, node)
        assert sh(node_exec, node, f"test -e {TARGET} && echo yes || echo no") == "no"
    assert [r["path"] for r in redist_requests(lab_mirrors, t0)] == ["/redist/redistrib_13.0.2.json"]
    assert not list(cache_dir.rglob("*.tar.xz"))

    # 2. apply: both hosts get 13.0, archives cross from the mirror once for the whole fleet.
    t1 = time.time()
    res = run_playbook(PLAY, fleet.inventory, extravars=extra, diff=True)
    assert res.rc == 0, str(res)
    fetched = redist_requests(lab_mirrors, t1)
    paths = [r["path"] for r in fetched]
    assert len(paths) == len(set(paths)) == 6, paths  # manifest + 5 archives, once
    manifest = json.loads((cache_dir / "redistrib_13.0.2.json").read_text())
    archive_bytes = sum(int(manifest[c]["linux-x86_64"]["size"]) for c in manifest if isinstance(manifest[c], dict))
    assert sum(r["bytes"] for r in fetched) == archive_bytes + (cache_dir / "redistrib_13.0.2.json").stat().st_size
    for node in fleet.nodes:
        assert res.task("Build the toolkit in a staging folder and move it into place", host=node).changed
        assert res.task("Report the toolkit path", host=node).res["cuda_toolkit_home"] == TARGET
        assert "release 13.0, V13.0.88" in sh(node_exec, node, f"{TARGET}/bin/nvcc --version")
        assert "release 12.8, V12.8.93" in sh(node_exec, node, f"{OLD}/bin/nvcc --version")
        assert sh(node_exec, node, "readlink /usr/local/cuda") == OLD
        version = json.loads(sh(node_exec, node, f"cat {TARGET}/version.json"))
        assert version["cuda"]["version"] == "13.0.2"
        assert {k: v["version"] for k, v in version.items() if k != "cuda"} == {
            c: manifest[c]["version"] for c in ("cuda_nvcc", "cuda_crt", "libnvvm", "cuda_cudart", "cuda_cccl")
        }
        assert sh(node_exec, node, "ls -A /usr/local | grep -c gpufleet") == "0"

    # 3. check again: unchanged, no download.  4. apply again: unchanged, no download.
    t2 = time.time()
    for check in (True, False):
        res = run_playbook(PLAY, fleet.inventory, extravars=extra, check=check, diff=True)
        assert res.rc == 0, str(res)
        for node in fleet.nodes:
            assert res.stats[node]["changed"] == 0, changed(res, node)
    assert redist_requests(lab_mirrors, t2) == []
    assert {n: tree_sum(node_exec, n, OLD) for n in fleet.nodes} == before


def test_link_policy_target_moves_the_link_once(fleet, run_playbook, node_exec, cache_dir):
    node = fleet.nodes[0]
    extra = {"cuda_toolkit_cache_dir": str(cache_dir), "cuda_toolkit_link_policy": "target"}
    res = run_playbook(PLAY, fleet.inventory, extravars=extra, limit=node, check=True, diff=True)
    assert res.rc == 0, str(res)
    assert changed(res, node) == [res.task("Hold the global link to the link policy", host=node).task]
    assert sh(node_exec, node, "readlink -f /usr/local/cuda") == OLD
    res = run_playbook(PLAY, fleet.inventory, extravars=extra, limit=node)
    assert res.rc == 0, str(res)
    assert sh(node_exec, node, "readlink -f /usr/local/cuda") == TARGET
    res = run_playbook(PLAY, fleet.inventory, extravars=extra, limit=node)
    assert res.stats[node]["changed"] == 0, changed(res, node)
    # keep holds the link where it was before this toolkit came (the install marker's record): back to 12.8, once;
    # the old tree is still intact and working.
    keep = {"cuda_toolkit_cache_dir": str(cache_dir)}
    res = run_playbook(PLAY, fleet.inventory, extravars=keep, limit=node)
    assert changed(res, node) == [res.task("Hold the global link to the link policy", host=node).task]
    assert sh(node_exec, node, "readlink -f /usr/local/cuda") == OLD
    res = run_playbook(PLAY, fleet.inventory, extravars=keep, limit=node)
    assert res.stats[node]["changed"] == 0, changed(res, node)
    assert "release 12.8" in sh(node_exec, node, f"{OLD}/bin/nvcc --version")


# ---------------------------------------------------------------- bad input


class _Mirror(http.server.SimpleHTTPRequestHandler):
    """A doctored redist mirror on loopback: serves a directory; `cut` paths stop half way; `html` answers HTML."""

    cut: tuple[str, ...] = ()
    html = False

    def log_message(self, *args):
        pass

    def do_GET(self):
        if self.html:
            body = b"<!DOCTYPE html><html><body>Sign in to continue</body></html>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        if any(self.path.endswith(c) for c in self.cut):
            data = Path(self.translate_path(self.path)).read_bytes()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data[: len(data) // 2])
            self.close_connection = True
            return
        super().do_GET()


@pytest.fixture
def doctored(tmp_path):
    """Factory: a copy of the lab redist tree, changed by `edit`, served on a free loopback port."""
    servers = []

    def make(edit=None, cut=(), html=False):
        from lab.common import MIRRORS

        root = tmp_path / "mirror"
        shutil.copytree(MIRRORS / "redist", root / "redist", ignore=shutil.ignore_patterns("*12.8*"))
        if edit:
            edit(root / "redist")
        handler = type("H", (_Mirror,), {"cut": tuple(cut), "html": html})
        server = http.server.ThreadingHTTPServer(
            ("127.0.0.1", 0), lambda *a, **kw: handler(*a, directory=str(root), **kw)
        )
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}/redist"

    yield make
    for server in servers:
        server.shutdown()


def _rename_platform(redist):
    path = redist / "redistrib_13.0.2.json"
    data = json.loads(path.read_text())
    for comp in ("cuda_nvcc", "cuda_cudart"):
        data[comp]["linux-sbsa"] = data[comp].pop("linux-x86_64")
    path.write_text(json.dumps(data))


def _tamper(redist):
    archive = next(redist.glob("cuda_cudart/linux-x86_64/*.tar.xz"))
    data = bytearray(archive.read_bytes())
    data[len(data) // 2] ^= 0xFF
    archive.write_bytes(bytes(data))


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


BAD_ROOT = "/srv/cuda-bad"

BAD = {
    "unknown_version": (
        lambda d: {"cuda_toolkit_release": "13.0.9"},
        ["13.0.9", "unknown to the redist mirror", "13.0.2", "cuda.release"],
    ),
    "version_release_disagree": (
        lambda d: {"cuda_toolkit_version": "13.1"},
        ["cuda_toolkit_version 13.1", "13.0.2", "do not agree"],
    ),
    "unknown_component": (
        lambda d: {"cuda_toolkit_components": ["cuda_nvcc", "cuda_nvfoo"]},
        ["cuda_nvfoo", "cuda_toolkit_components", "cuda_cccl"],
    ),
    "platform_missing": (
        lambda d: {"gpufleet_redist_url": d(edit=_rename_platform)},
        ["linux-x86_64", "cuda_nvcc, cuda_cudart", "linux-sbsa", "{host}"],
    ),
    "sha256_mismatch": (
        lambda d: {"gpufleet_redist_url": d(edit=_tamper)},
        ["sha256", "cuda_cudart-linux-x86_64-13.0.96-archive.tar.xz", "Refresh the mirror"],
    ),
    "truncated_download": (
        lambda d: {"gpufleet_redist_url": d(cut=("-archive.tar.xz",))},
        ["cut short", "run again"],
    ),
    "mirror_unreachable": (
        lambda d: {"gpufleet_redist_url": f"http://127.0.0.1:{_free_port()}/redist"},
        ["cannot reach the redist mirror", "gpufleet_redist_url"],
    ),
    "mirror_html": (
        lambda d: {"gpufleet_redist_url": d(html=True)},
        ["HTML page", "redistrib_<release>.json"],
    ),
    "no_disk": (
        lambda d: {"cuda_toolkit_extract_factor": 100000.0},
        ["{host}", BAD_ROOT, "MiB free", "needs about", "Nothing was downloaded"],
    ),
    "not_a_toolkit": (
        lambda d: {"__prepare": f"mkdir -p {BAD_ROOT}/cuda-13.0 && echo keep > {BAD_ROOT}/cuda-13.0/notes.txt"},
        ["{host}", f"{BAD_ROOT}/cuda-13.0", "not a CUDA toolkit", "move it away"],
    ),
    "not_root": (
        lambda d: {
            "__prepare": "id cudauser >/dev/null 2>&1 || useradd -m -s /bin/bash cudauser",
            "ansible_become": True,
            "ansible_become_method": "su",
            "ansible_become_user": "cudauser",
        },
        ["{host}", "cudauser", f"cannot write {BAD_ROOT}", "become: true"],
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_fails_clearly_and_installs_nothing(case, fleet, run_playbook, node_exec, doctored, tmp_path):
    node = fleet.nodes[1]
    make_vars, words = BAD[case]
    extra = {"cuda_toolkit_root": BAD_ROOT, "cuda_toolkit_cache_dir": str(tmp_path / "cache")}
    extra.update(make_vars(doctored))
    prepare = extra.pop("__prepare", "")
    sh(node_exec, node, f"rm -rf {BAD_ROOT} && mkdir -p {BAD_ROOT} {prepare and '&& ' + prepare}")
    before = sh(node_exec, node, f"find {BAD_ROOT} | sort")
    res = run_playbook(PLAY, fleet.inventory, extravars=extra, limit=node)
    assert res.rc != 0, str(res)
    failed = [r for r in res.results.get(node, []) if r.failed]
    assert failed, str(res)
    msg = failed[0].msg
    for word in words:
        assert word.format(host=node) in msg, (case, msg)
    assert sh(node_exec, node, f"find {BAD_ROOT} | sort") == before
    assert not list((tmp_path / "cache").rglob("cuda_cudart-*.tar.xz"))
    assert not list((tmp_path / "cache").rglob(".part-*"))
