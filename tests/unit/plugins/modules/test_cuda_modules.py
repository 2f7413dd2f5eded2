# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""cuda_redist_fetch, cuda_redist, cuda_link, cuda_toolkit_info on a fake mirror (file://) and a fake host root."""

from __future__ import annotations

import hashlib
import io
import json
import os
import socket
import stat
import tarfile

import pytest
from ansible.module_utils import basic
from ansible.module_utils.testing import patch_module_args
from module_harness import Exit, Fail

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _toolkit as tk
from ansible_collections.gpufleet.upgrade.plugins.modules import (
    cuda_apt,
    cuda_link,
    cuda_redist,
    cuda_redist_fetch,
    cuda_runfile,
    cuda_toolkit_info,
)

NVCC = """#!/bin/sh
echo "Cuda compilation tools, release {mm}, V{full}"
"""


def call(module, args, check=False, diff=False):
    args = dict(args, _ansible_check_mode=check, _ansible_diff=diff)
    with patch_module_args(args), pytest.raises((Exit, Fail)) as info:
        module.main()
    return info.type is Exit, info.value.args[0]


def archive_bytes(top, files):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:xz") as tar:
        for name, content in files.items():
            info = tarfile.TarInfo(f"{top}/{name}")
            info.size, info.mode = len(content), 0o755
            tar.addfile(info, io.BytesIO(content))
    return buf.getvalue()


@pytest.fixture
def mirror(tmp_path):
    """A redist tree with release 13.0.2: cuda_nvcc (a stand-in nvcc) and cuda_cudart, linux-x86_64 only."""
    root = tmp_path / "mirror"
    manifest = {"release_date": "2025-10-09", "release_label": "13.0.2", "release_product": "cuda"}
    files = {
        "cuda_nvcc": ("13.0.88", {"bin/nvcc": NVCC.format(mm="13.0", full="13.0.88").encode(), "LICENSE": b"l"}),
        "cuda_cudart": ("13.0.96", {"include/cuda_runtime.h": b"/* rt */", "lib/libcudart.so.13": b"elf"}),
    }
    for comp, (version, content) in files.items():
        top = f"{comp}-linux-x86_64-{version}-archive"
        rel = f"{comp}/linux-x86_64/{top}.tar.xz"
        data = archive_bytes(top, content)
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
        manifest[comp] = {
            "name": comp,
            "license": "CUDA Toolkit",
            "version": version,
            "linux-x86_64": {
                "relative_path": rel,
                "sha256": hashlib.sha256(data).hexdigest(),
                "md5": "0" * 32,
                "size": str(len(data)),
            },
        }
    (root / "redistrib_13.0.2.json").write_text(json.dumps(manifest))
    return root


def fetch_args(mirror, tmp_path, **kw):
    args = {
        "base_url": mirror.as_uri(),
        "release": "13.0.2",
        "components": ["cuda_nvcc", "cuda_cudart"],
        "hosts": {"node1": "x86_64", "node2": "x86_64"},
        "cache_dir": str(tmp_path / "cache"),
    }
    args.update(kw)
    return args


def test_fetch_downloads_once_then_reuses_the_cache(mirror, tmp_path):
    ok, res = call(cuda_redist_fetch, fetch_args(mirror, tmp_path))
    assert ok, res
    assert res["changed"] is True
    assert sorted(res["downloaded"]) == sorted(
        ["redistrib_13.0.2.json"] + [a["relative_path"] for a in res["plan"]["linux-x86_64"]]
    )
    assert res["downloaded_bytes"] > 0
    assert res["platforms"] == {"node1": "linux-x86_64", "node2": "linux-x86_64"}
    ok, again = call(cuda_redist_fetch, fetch_args(mirror, tmp_path))
    assert ok and again["changed"] is False
    assert again["downloaded"] == [] and again["downloaded_bytes"] == 0


def test_fetch_check_mode_writes_nothing(mirror, tmp_path):
    ok, res = call(cuda_redist_fetch, fetch_args(mirror, tmp_path), check=True)
    assert ok and res["changed"] is True
    assert len(res["downloaded"]) == 3
    assert not (tmp_path / "cache").exists()


def test_fetch_refetches_a_damaged_cache_entry(mirror, tmp_path):
    call(cuda_redist_fetch, fetch_args(mirror, tmp_path))
    cached = tmp_path / "cache" / next(iter((mirror / "cuda_cudart").rglob("*.tar.xz"))).relative_to(mirror)
    cached.write_bytes(b"garbage")
    ok, res = call(cuda_redist_fetch, fetch_args(mirror, tmp_path))
    assert ok and res["downloaded"] == [str(cached.relative_to(tmp_path / "cache"))]
    assert cached.read_bytes() == (mirror / cached.relative_to(tmp_path / "cache")).read_bytes()


@pytest.mark.parametrize(
    ("change", "kind", "words"),
    [
        ({"release": "13.0.9"}, "unknown_version", ["13.0.9", "cuda.release"]),
        ({"components": ["cuda_nvcc", "cuda_nvfoo"]}, "unknown_component", ["cuda_nvfoo", "cuda_cudart"]),
        ({"hosts": {"node1": "x86_64", "arm1": "aarch64"}}, "platform", ["arm1", "linux-sbsa"]),
        ({"hosts": {"odd1": "riscv64"}}, "platform", ["odd1", "riscv64"]),
    ],
)
def test_fetch_bad_input(mirror, tmp_path, change, kind, words):
    ok, res = call(cuda_redist_fetch, fetch_args(mirror, tmp_path, **change))
    assert not ok
    assert res["kind"] == kind
    for word in words:
        assert word in res["msg"]


def test_fetch_tampered_and_truncated_archives_are_not_kept(mirror, tmp_path):
    rel = next(iter((mirror / "cuda_nvcc").rglob("*.tar.xz")))
    good = rel.read_bytes()
    rel.write_bytes(good[:-10] + b"0123456789")
    ok, res = call(cuda_redist_fetch, fetch_args(mirror, tmp_path))
    assert not ok and res["kind"] == "sha256"
    rel.write_bytes(good[: len(good) // 2])
    ok, res = call(cuda_redist_fetch, fetch_args(mirror, tmp_path))
    assert not ok and res["kind"] == "truncated"
    left = [p for p in (tmp_path / "cache").rglob("*") if p.is_file() and p.suffix == ".xz"]
    assert all("cuda_nvcc" not in str(p) for p in left)
    assert not list((tmp_path / "cache").rglob(".part-*"))


def test_fetch_html_answer(mirror, tmp_path):
    (mirror / "redistrib_13.0.2.json").write_text("<!DOCTYPE html><html><body>Login</body></html>")
    ok, res = call(cuda_redist_fetch, fetch_args(mirror, tmp_path))
    assert not ok and res["kind"] == "html"


def test_fetch_unreachable_mirror(tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ok, res = call(cuda_redist_fetch, fetch_args(tmp_path, tmp_path, base_url=f"http://127.0.0.1:{port}/redist"))
    assert not ok and res["kind"] == "unreachable"
    assert f"127.0.0.1:{port}" in res["msg"] and "gpufleet_redist_url" in res["msg"]


def test_a_cached_archive_is_read_again_only_when_it_changed(mirror, tmp_path, monkeypatch):
    from ansible_collections.gpufleet.upgrade.plugins.module_utils import _hash_record as hr

    ok, res = call(cuda_redist_fetch, fetch_args(mirror, tmp_path))
    assert ok and res["changed"], res
    hashed = []
    real = hr.file_sha256
    monkeypatch.setattr(hr, "file_sha256", lambda path, *a: hashed.append(path) or real(path, *a))
    ok, again = call(cuda_redist_fetch, fetch_args(mirror, tmp_path))
    assert ok and again["downloaded"] == [] and hashed == [], (again, hashed)
    # An archive damaged in the cache (same size, new bytes): read, found wrong, fetched again.
    first = res["plan"]["linux-x86_64"][0]
    cached = tmp_path / "cache" / first["relative_path"]
    cached.write_bytes(bytes(cached.stat().st_size))
    ok, fixed = call(cuda_redist_fetch, fetch_args(mirror, tmp_path))
    assert ok and fixed["downloaded"] == [first["relative_path"]], fixed
    assert hashed == [str(cached)]
    assert cached.read_bytes() == (mirror / first["relative_path"]).read_bytes()


@pytest.fixture
def pushed(mirror, tmp_path):
    """Archives fetched and pushed flat into an archive dir, as the role does; returns (plan, archive_dir)."""
    ok, res = call(cuda_redist_fetch, fetch_args(mirror, tmp_path))
    assert ok, res
    archive_dir = tmp_path / "pushed"
    archive_dir.mkdir()
    for a in res["plan"]["linux-x86_64"]:
        (archive_dir / os.path.basename(a["relative_path"])).write_bytes((mirror / a["relative_path"]).read_bytes())
    return res["plan"]["linux-x86_64"], archive_dir


def redist_args(root, plan, archive_dir):
    return {"dest": str(root / "cuda-13.0"), "release": "13.0.2", "archives": plan, "archive_dir": str(archive_dir)}


def test_redist_check_install_and_idempotence(pushed, tmp_path):
    plan, archive_dir = pushed
    root = tmp_path / "root"
    root.mkdir()
    ok, res = call(cuda_redist, redist_args(root, plan, archive_dir), check=True, diff=True)
    assert ok and res["changed"] is True
    assert "cuda_nvcc 13.0.88" in res["diff"]["after"] and "cuda_cudart 13.0.96" in res["diff"]["after"]
    assert os.listdir(root) == []
    ok, res = call(cuda_redist, redist_args(root, plan, archive_dir))
    assert ok and res["changed"] is True, res
    assert res["nvcc_version"] == "13.0.88"
    home = root / "cuda-13.0"
    assert json.loads((home / "version.json").read_text())["cuda_cudart"]["version"] == "13.0.96"
    assert (home / "include" / "cuda_runtime.h").exists() and (home / tk.MARKER).exists()
    assert sorted(os.listdir(root)) == ["cuda-13.0"]
    ok, res = call(cuda_redist, redist_args(root, plan, archive_dir), check=True)
    assert ok and res["changed"] is False
    ok, res = call(cuda_redist, redist_args(root, plan, archive_dir))
    assert ok and res["changed"] is False and res["status_before"] == "present"


def test_redist_tampered_archive_on_host_leaves_nothing(pushed, tmp_path):
    plan, archive_dir = pushed
    root = tmp_path / "root"
    root.mkdir()
    victim = archive_dir / os.path.basename(plan[1]["relative_path"])
    victim.write_bytes(victim.read_bytes()[:-1] + b"\0")
    ok, res = call(cuda_redist, redist_args(root, plan, archive_dir))
    assert not ok and res["kind"] == "sha256"
    assert "Nothing was installed" in res["msg"]
    assert os.listdir(root) == []


def test_redist_clears_a_staging_folder_left_by_an_interrupted_run(pushed, tmp_path):
    plan, archive_dir = pushed
    root = tmp_path / "root"
    stale = root / ".cuda-13.0.gpufleet-staging"
    (stale / "bin").mkdir(parents=True)
    (stale / "bin" / "half-written").write_bytes(b"\0" * 10)
    ok, res = call(cuda_redist, redist_args(root, plan, archive_dir), check=True)
    assert ok and res["changed"] and res["status_before"] == "absent"
    ok, res = call(cuda_redist, redist_args(root, plan, archive_dir))
    assert ok and res["changed"]
    assert sorted(os.listdir(root)) == ["cuda-13.0"]
    assert not (root / "cuda-13.0" / "bin" / "half-written").exists()


def test_redist_refuses_a_folder_that_is_not_a_toolkit(pushed, tmp_path):
    plan, archive_dir = pushed
    root = tmp_path / "root"
    (root / "cuda-13.0").mkdir(parents=True)
    (root / "cuda-13.0" / "data.bin").write_bytes(b"precious")
    ok, res = call(cuda_redist, redist_args(root, plan, archive_dir))
    assert not ok and res["kind"] == "not_a_toolkit"
    assert (root / "cuda-13.0" / "data.bin").read_bytes() == b"precious"


def test_redist_adds_a_component_by_rebuilding(pushed, tmp_path):
    plan, archive_dir = pushed
    root = tmp_path / "root"
    root.mkdir()
    ok, _result = call(cuda_redist, redist_args(root, plan[:1], archive_dir))
    assert ok
    ok, res = call(cuda_redist, redist_args(root, plan, archive_dir))
    assert ok and res["changed"] and res["status_before"] == "incomplete"
    assert (root / "cuda-13.0" / "include" / "cuda_runtime.h").exists()
    assert sorted(os.listdir(root)) == ["cuda-13.0"]


def test_redist_wrong_nvcc_fails_verification(pushed, tmp_path):
    plan, archive_dir = pushed
    root = tmp_path / "root"
    root.mkdir()
    args = redist_args(root, plan, archive_dir)
    args["release"] = "13.1.0"
    ok, res = call(cuda_redist, args)
    assert not ok and res["kind"] == "verify" and "13.1" in res["msg"]
    assert os.listdir(root) == []


@pytest.fixture
def host_root(tmp_path):
    root = tmp_path / "local"
    for mm, full in (("12.8", "12.8.93"), ("13.0", "13.0.88")):
        home = root / f"cuda-{mm}"
        (home / "bin").mkdir(parents=True)
        nvcc = home / "bin" / "nvcc"
        nvcc.write_text(NVCC.format(mm=mm, full=full))
        nvcc.chmod(0o755)
        (home / "version.json").write_text(
            json.dumps({"cuda": {"name": "CUDA SDK", "version": full[:-3] + ".1"}, "cuda_nvcc": {"version": full}})
        )
    (root / "cuda").symlink_to("cuda-12.8")
    return root


def test_toolkit_info_reports_toolkits_link_and_home(host_root):
    ok, res = call(
        cuda_toolkit_info,
        {"root": str(host_root), "cuda_home": str(host_root / "cuda"), "version": "13.0", "release": "13.0.1"},
        check=True,
    )
    assert ok and res["changed"] is False
    assert [t["path"] for t in res["toolkits"]] == [str(host_root / "cuda-12.8"), str(host_root / "cuda-13.0")]
    assert res["toolkits"][0]["nvcc"] == {"ok": True, "missing": False, "release": "12.8", "version": "12.8.93"}
    assert res["link"]["target"] == "cuda-12.8"
    assert res["cuda_home"]["toolkit"] == str(host_root / "cuda-12.8")
    assert res["target"]["status"] == "present"
    assert res["writable"] is True and res["free_bytes"] > 0


def test_link_keep_restores_a_moved_link(host_root):
    link = host_root / "cuda"
    recorded = tk.link_state(str(link))
    link.unlink()
    link.symlink_to(str(host_root / "cuda-13.0"))
    args = {"link": str(link), "policy": "keep", "recorded": recorded, "home": str(host_root / "cuda-13.0")}
    ok, res = call(cuda_link, args, check=True, diff=True)
    assert ok and res["changed"] and os.readlink(link) == str(host_root / "cuda-13.0")
    assert res["diff"]["after"].endswith(f"{host_root / 'cuda-12.8'}\n")
    ok, res = call(cuda_link, args)
    assert ok and res["changed"] and os.readlink(link) == "cuda-12.8"
    ok, res = call(cuda_link, args)
    assert ok and not res["changed"]


def test_link_target_moves_it_atomically(host_root):
    link = host_root / "cuda"
    args = {"link": str(link), "policy": "target", "home": str(host_root / "cuda-13.0")}
    ok, res = call(cuda_link, args)
    assert ok and res["changed"] and os.path.realpath(link) == str(host_root / "cuda-13.0")
    assert not os.path.lexists(f"{link}.gpufleet-new")
    ok, res = call(cuda_link, args, check=True)
    assert ok and not res["changed"]


def test_link_refuses_a_real_directory(host_root):
    link = host_root / "cuda"
    link.unlink()
    link.mkdir()
    ok, res = call(cuda_link, {"link": str(link), "policy": "target", "home": str(host_root / "cuda-13.0")})
    assert not ok and "not a link" in res["msg"]


def test_alternatives_plan():
    query = {"mode": "auto", "value": "/usr/local/cuda-13.0", "choices": [{"path": "/usr/local/cuda-13.0"}]}
    assert cuda_link.plan_alternatives("cuda", "/usr/local/cuda", "/usr/local/cuda-12.8", query) == [
        ["--install", "/usr/local/cuda", "cuda", "/usr/local/cuda-12.8", "128"],
        ["--set", "cuda", "/usr/local/cuda-12.8"],
    ]
    pinned = {"mode": "manual", "value": "/usr/local/cuda-12.8", "choices": [{"path": "/usr/local/cuda-12.8"}]}
    assert cuda_link.plan_alternatives("cuda", "/usr/local/cuda", "/usr/local/cuda-12.8", pinned) == []
    assert cuda_link.plan_alternatives("cuda", "/usr/local/cuda", None, pinned) == [["--remove-all", "cuda"]]


RUNFILE = """#!/bin/sh
set -e
for arg in "$@"; do case "$arg" in --toolkitpath=*) TK="${arg#--toolkitpath=}" ;; esac; done
mkdir -p "$TK/bin" "$TK/pkgconfig"
printf '#!/bin/sh\\necho "Cuda compilation tools, release 13.0, V13.0.88"\\n' > "$TK/bin/nvcc"
chmod 755 "$TK/bin/nvcc"
printf '{"cuda": {"name": "CUDA SDK", "version": "%s"}}' "${RELEASE:-13.0.2}" > "$TK/version.json"
printf 'cudaroot=%s\\n' "$TK" > "$TK/pkgconfig/cudart.pc"
"""


@pytest.fixture
def runfile(tmp_path):
    path = tmp_path / "cuda_13.0.2_lab.run"
    path.write_text(RUNFILE)
    return str(path), hashlib.sha256(path.read_bytes()).hexdigest()


def runfile_args(root, runfile, **kw):
    path, sha = runfile
    return dict({"runfile": path, "sha256": sha, "dest": str(root / "cuda-13.0"), "release": "13.0.2"}, **kw)


def test_runfile_installs_through_staging_and_relocates(tmp_path, runfile):
    root = tmp_path / "root"
    root.mkdir()
    ok, res = call(cuda_runfile, runfile_args(root, runfile), check=True, diff=True)
    assert ok and res["changed"] and os.listdir(root) == []
    ok, res = call(cuda_runfile, runfile_args(root, runfile))
    assert ok and res["changed"] and res["nvcc_version"] == "13.0.88", res
    assert sorted(os.listdir(root)) == ["cuda-13.0"]
    assert (root / "cuda-13.0" / "pkgconfig" / "cudart.pc").read_text() == f"cudaroot={root / 'cuda-13.0'}\n"
    ok, res = call(cuda_runfile, runfile_args(root, runfile))
    assert ok and not res["changed"]


def test_runfile_wrong_sha_or_release_leaves_nothing(tmp_path, runfile, monkeypatch):
    root = tmp_path / "root"
    root.mkdir()
    ok, res = call(cuda_runfile, runfile_args(root, runfile, sha256="0" * 64))
    assert not ok and res["kind"] == "sha256" and "cuda_toolkit_runfile_sha256" in res["msg"]
    monkeypatch.setenv("RELEASE", "13.0.1")
    ok, res = call(cuda_runfile, runfile_args(root, runfile))
    assert not ok and res["kind"] == "version" and "13.0.1" in res["msg"]
    assert os.listdir(root) == []


def test_apt_check_mode_reports_the_pinned_package(monkeypatch, tmp_path):
    calls = []

    def run_command(self, args, **kw):
        calls.append(args)
        return (0, "ii |13.0.1-1", "") if args[0] == "dpkg-query" else (0, "", "")

    monkeypatch.setattr(basic.AnsibleModule, "run_command", run_command)
    args = {"package": "cuda-toolkit-13-0", "version": "13.0.2-1", "repo": "deb [trusted=yes] file:/srv/repo ./"}
    args["repo_file"] = str(tmp_path / "gpufleet-cuda.list")
    ok, res = call(cuda_apt, args, check=True, diff=True)
    assert ok and res["changed"] and res["version_before"] == "13.0.1-1"
    assert "cuda-toolkit-13-0=13.0.2-1" in res["diff"]["after"]
    assert [c[0] for c in calls] == ["dpkg-query"]
    assert not (tmp_path / "gpufleet-cuda.list").exists()
    (tmp_path / "gpufleet-cuda.list").write_text(args["repo"] + "\n")
    ok, res = call(cuda_apt, dict(args, version="13.0.1-1"), check=True)
    assert ok and not res["changed"]


def test_the_install_marker_keeps_where_the_link_was_first_and_the_host_model_judges_keep_by_it(pushed, tmp_path):
    from ansible_collections.gpufleet.upgrade.plugins.modules import host_state

    plan, archive_dir = pushed
    root = tmp_path / "root"
    (root / "cuda-12.8" / "bin").mkdir(parents=True)
    (root / "cuda").symlink_to("cuda-12.8")
    before = tk.link_state(str(root / "cuda"))
    ok, res = call(cuda_redist, dict(redist_args(root, plan, archive_dir), link_before=before))
    assert ok and res["changed"], res
    home = root / "cuda-13.0"
    assert tk.read_marker(str(home))["link_before"]["resolved"] == str(root / "cuda-12.8")
    # Someone moves the link; a reinstall (the host model found edited files) keeps the first install's record.
    (root / "cuda").unlink()
    (root / "cuda").symlink_to("cuda-13.0")
    moved = tk.link_state(str(root / "cuda"))
    ok, res = call(cuda_redist, dict(redist_args(root, plan, archive_dir), link_before=moved, reinstall=True))
    assert ok and res["changed"], res
    assert tk.read_marker(str(home))["link_before"]["resolved"] == str(root / "cuda-12.8")
    args = {"root": str(root), "version": "13.0", "release": "13.0.2", "run_nvcc": False}
    ok, info = call(cuda_toolkit_info, args)
    assert ok and info["target"]["link_before"]["resolved"] == str(root / "cuda-12.8")
    spec = {"home": str(home), "release": "13.0.2", "components": [], "link": str(root / "cuda"), "link_policy": "keep"}
    ok, judged = call(host_state, {"toolkit": spec})
    assert ok and not judged["in_sync"], judged
    assert judged["drift"] == [
        f"cuda link: {root}/cuda resolves to {root}/cuda-13.0, the profile wants {root}/cuda-12.8"
    ], judged["drift"]


@pytest.mark.parametrize("points_at_the_lock_s_venv", [True, False])
def test_host_state_publishes_its_verdict_as_the_fact_it_is_told_and_says_whether_current_is_on_the_profile(
    tmp_path, points_at_the_lock_s_venv
):
    from ansible_collections.gpufleet.upgrade.plugins.modules import host_state

    root = tmp_path / "serving"
    (root / "venvs" / "stack-a").mkdir(parents=True)
    (root / "venvs" / "stack-old").mkdir(parents=True)
    (root / "current").symlink_to(root / "venvs" / ("stack-a" if points_at_the_lock_s_venv else "stack-old"))
    venv = {
        "link": str(root / "current"),
        "expected_path": str(root / "venvs" / "stack-a"),
        "venv_name": "stack-a",
        "packages": [{"name": "six", "version": "1.17.0"}],
        "verify": "stat",
    }
    ok, res = call(host_state, {"venv": venv, "fact": "assess_result", "state_path": str(tmp_path / "state.json")})
    assert ok, res
    fact = res["ansible_facts"]["assess_result"]
    assert fact == {k: res[k] for k in ("in_sync", "drift", "drifted", "items", "on_profile", "last_run", "repair")}
    assert fact["on_profile"] is points_at_the_lock_s_venv
    # The venv itself is empty: it drifts either way, so the host is repaired (on the profile) or upgraded.
    assert not fact["in_sync"] and "serving venv" in fact["drifted"], fact
    ok, res = call(host_state, {"venv": venv})
    assert ok and "ansible_facts" not in res, res


def pull_args(root, plan, archive_dir, pull_url):
    return dict(redist_args(root, plan, archive_dir), pull_url=pull_url, pull_timeout=5)


def test_redist_pulls_what_the_archive_folder_lacks_then_builds(mirror, tmp_path):
    ok, res = call(cuda_redist_fetch, fetch_args(mirror, tmp_path))
    plan = res["plan"]["linux-x86_64"]
    root, archive_dir = tmp_path / "root", tmp_path / "host" / ".gpufleet-redist"
    root.mkdir()
    # One archive is there already, as a run that stopped after the pull left it; the other one is damaged.
    archive_dir.mkdir(parents=True)
    (archive_dir / os.path.basename(plan[0]["relative_path"])).write_bytes(
        (mirror / plan[0]["relative_path"]).read_bytes()
    )
    (archive_dir / os.path.basename(plan[1]["relative_path"])).write_bytes(b"half an archive")
    ok, res = call(cuda_redist, pull_args(root, plan, archive_dir, mirror.as_uri()), check=True)
    assert ok and res["changed"] and "pulled" not in res and os.listdir(root) == []
    ok, res = call(cuda_redist, pull_args(root, plan, archive_dir, mirror.as_uri()))
    assert ok and res["changed"] and res["nvcc_version"] == "13.0.88", res
    assert res["pulled"] == [plan[1]["relative_path"]]
    assert (root / "cuda-13.0" / "include" / "cuda_runtime.h").exists()
    assert sorted(p.name for p in archive_dir.iterdir()) == sorted(os.path.basename(a["relative_path"]) for a in plan)


def test_redist_pull_reads_each_archive_once(mirror, tmp_path, monkeypatch):
    """An archive kept from an interrupted run is hashed once (to keep it), one pulled now is hashed as it is written:
    neither is read again before extraction. A real cu130 toolkit is several GB of archives per host."""
    ok, res = call(cuda_redist_fetch, fetch_args(mirror, tmp_path))
    plan = res["plan"]["linux-x86_64"]
    root, archive_dir = tmp_path / "root", tmp_path / "archives"
    root.mkdir()
    archive_dir.mkdir()
    kept = archive_dir / os.path.basename(plan[0]["relative_path"])
    kept.write_bytes((mirror / plan[0]["relative_path"]).read_bytes())
    hashed = []
    real = cuda_redist.rd.file_sha256
    monkeypatch.setattr(cuda_redist.rd, "file_sha256", lambda path: hashed.append(str(path)) or real(path))
    ok, res = call(cuda_redist, pull_args(root, plan, archive_dir, mirror.as_uri()))
    assert ok and res["pulled"] == [plan[1]["relative_path"]], res
    assert [h for h in hashed if h.startswith(str(archive_dir))] == [str(kept)]


def test_redist_pull_of_another_file_is_named_by_the_manifest_check(mirror, tmp_path):
    """A cache that serves other bytes under an archive's name: the pull hashes them, and the full check before
    extraction names what is wrong (size and sha256 against the manifest); nothing is installed."""
    ok, res = call(cuda_redist_fetch, fetch_args(mirror, tmp_path))
    plan = res["plan"]["linux-x86_64"]
    root, archive_dir = tmp_path / "root", tmp_path / "archives"
    root.mkdir()
    served = mirror / plan[1]["relative_path"]
    served.write_bytes(served.read_bytes() + b"appended by the cache")
    ok, res = call(cuda_redist, pull_args(root, plan, archive_dir, mirror.as_uri()))
    assert not ok and res["kind"] == "size" and "the mirror serves another file" in res["msg"], res
    assert plan[1]["component"] in res["msg"] and os.listdir(root) == []


def test_redist_pull_into_a_new_folder_and_a_cache_that_does_not_answer(mirror, tmp_path):
    ok, res = call(cuda_redist_fetch, fetch_args(mirror, tmp_path))
    plan = res["plan"]["linux-x86_64"]
    root, archive_dir = tmp_path / "root", tmp_path / "new" / "archives"
    root.mkdir()
    ok, res = call(cuda_redist, pull_args(root, plan, archive_dir, "http://127.0.0.1:9/redist"))
    assert not ok and res["kind"] == "pull" and "Nothing was installed" in res["msg"], res
    assert "http://127.0.0.1:9/redist/" + plan[0]["relative_path"] in res["msg"] and "fix:" in res["msg"]
    assert os.listdir(root) == [] and os.listdir(archive_dir) == []
    assert stat.S_IMODE(os.stat(archive_dir).st_mode) == 0o700
    ok, res = call(cuda_redist, pull_args(root, plan, archive_dir, mirror.as_uri()))
    assert ok and sorted(res["pulled"]) == sorted(a["relative_path"] for a in plan), res
