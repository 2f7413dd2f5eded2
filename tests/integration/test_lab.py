# Copyright: (c) 2026, gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The lab itself: two seeded nodes, reachable by Ansible, with the old stack in place, and mirrors that serve."""

from __future__ import annotations

import hashlib
import json
import re
import urllib.request
from pathlib import Path

import pytest
from packaging.utils import parse_wheel_filename

pytestmark = pytest.mark.integration

PLAYBOOKS = Path(__file__).resolve().parent / "playbooks"


def _get(url: str, accept: str | None = None) -> bytes:
    req = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return resp.read()


def _files(index_url: str, project: str) -> list[str]:
    page = _get(f"{index_url}/{project}/").decode()
    return re.findall(r">([^<>]+\.whl)</a>", page)


@pytest.fixture(scope="module")
def fleet(lab_fleet):
    return lab_fleet(2)


def test_nodes_boot_systemd(fleet, node_exec):
    assert len(fleet.nodes) == 2
    for node in fleet.nodes:
        res = node_exec(node, ["systemctl", "is-system-running"])
        assert res.stdout.strip() in ("running", "degraded"), (node, res.stdout)
        assert node_exec(node, ["systemctl", "is-active", "ssh"]).stdout.strip() == "active"


def test_ansible_reaches_nodes_over_ssh(fleet, run_playbook):
    result = run_playbook(PLAYBOOKS / "ping.yml", fleet.inventory)
    assert result.rc == 0, str(result)
    assert set(result.stats) == set(fleet.nodes)
    for node in fleet.nodes:
        assert result.stats[node]["failed"] == 0
        assert result.stats[node]["unreachable"] == 0
        assert result.task("Ping the node", host=node).res["ping"] == "pong"


def test_each_node_has_its_own_pinned_host_key(fleet, node_exec, tmp_path):
    from lab import nodes
    from lab.common import run

    known = nodes.known_hosts_path(fleet.name).read_text().splitlines()
    state = nodes.load_state(fleet.name)
    assert len(known) == len(fleet.nodes), known
    keys = {line.split()[2] for line in known}
    assert len(keys) == len(fleet.nodes), f"nodes share a host key: {known}"
    for node in fleet.nodes:
        served = node_exec(node, ["ssh-keygen", "-y", "-f", "/etc/ssh/lab_host_ed25519_key"]).stdout.split()[1]
        assert f"[127.0.0.1]:{state['nodes'][node]['ssh_port']} ssh-ed25519 {served}" in known
        assert node_exec(node, ["sh", "-c", "ls /etc/ssh/ssh_host_* 2>/dev/null || true"]).stdout.strip() == ""
    # A node answering with another node's key is refused (the pin is checked, not trusted on first use).
    first, second = fleet.nodes[0], fleet.nodes[1]
    port = state["nodes"][first]["ssh_port"]
    other = next(line.split()[2] for line in known if not line.startswith(f"[127.0.0.1]:{port} "))
    wrong = tmp_path / "known_hosts"
    wrong.write_text(f"[127.0.0.1]:{port} ssh-ed25519 {other}\n")
    ssh = ["ssh", "-i", str(fleet.key), "-p", str(port), "-o", "BatchMode=yes", "-o", "ControlPath=none"]
    bad = run(
        [*ssh, "-o", f"UserKnownHostsFile={wrong}", "-o", "StrictHostKeyChecking=yes", "root@127.0.0.1", "true"],
        check=False,
        capture=True,
    )
    assert bad.returncode != 0 and "Host key verification failed" in bad.stderr, (second, bad.stderr)
    good = run([*ssh, *nodes.ssh_pin_args(fleet.name), "root@127.0.0.1", "true"], check=False, capture=True)
    assert good.returncode == 0, good.stderr


def test_ansible_check_mode_is_passed_through(fleet, run_playbook):
    result = run_playbook(PLAYBOOKS / "ping.yml", fleet.inventory, check=True, limit=fleet.nodes[0])
    assert result.rc == 0, str(result)
    assert list(result.stats) == [fleet.nodes[0]]


def test_old_toolkit_nvcc_reports_12_8(fleet, node_exec):
    node = fleet.nodes[0]
    out = node_exec(node, ["/usr/local/cuda-12.8/bin/nvcc", "--version"]).stdout
    assert "release 12.8, V12.8.93" in out
    ptxas = node_exec(node, ["/usr/local/cuda-12.8/bin/ptxas", "--version"]).stdout
    assert "release 12.8" in ptxas
    assert node_exec(node, ["readlink", "/usr/local/cuda"]).stdout.strip() == "/usr/local/cuda-12.8"
    version = json.loads(node_exec(node, ["cat", "/usr/local/cuda-12.8/version.json"]).stdout)
    assert version["cuda"]["version"] == "12.8.1"
    assert version["cuda_nvcc"]["version"] == "12.8.93"


def test_serving_unit_runs_the_seed_venv(fleet, node_exec):
    for node in fleet.nodes:
        port = fleet.serving_port(node)
        assert node_exec(node, ["systemctl", "is-active", "gpufleet-serving"]).stdout.strip() == "active"
        info = json.loads(_get(f"http://127.0.0.1:{port}/get_server_info"))["gpufleet_lab"]
        assert info["cuda_home"] == "/usr/local/cuda-12.8"
        real_prefix = node_exec(node, ["readlink", "-f", info["sys_prefix"]]).stdout.strip()
        assert real_prefix == "/opt/gpufleet/serving/venvs/lab-cu128-seed"
        dists = info["distributions"]
        assert dists["lab-torch"] == "2.9.1+cu128"
        assert dists["lab-flashinfer-jit-cache"] == "0.2.14+cu128"
        assert dists["lab-sglang"] == "0.5.3"
        assert dists["six"] == "1.16.0"


def test_indexes_serve_expected_projects(lab_mirrors):
    main = lab_mirrors.urls["lab-main"]
    stale = lab_mirrors.urls["lab-stale"]
    main_projects = set(re.findall(r'href="([^"/]+)/"', _get(f"{main}/").decode()))
    assert {
        "lab-torch",
        "lab-flashinfer-python",
        "lab-flashinfer-cubin",
        "lab-flashinfer-jit-cache",
        "lab-sgl-kernel",
        "lab-sglang",
        "six",
        "idna",
        "uv",
    } <= main_projects
    stale_projects = set(re.findall(r'href="([^"/]+)/"', _get(f"{stale}/").decode()))
    assert stale_projects == {"lab-flashinfer-python", "lab-flashinfer-cubin", "lab-flashinfer-jit-cache"}
    versions = {str(parse_wheel_filename(f)[1]) for f in _files(main, "lab-flashinfer-jit-cache")}
    assert versions == {"0.2.14+cu128", "0.6.4+cu130"}
    stale_versions = {str(parse_wheel_filename(f)[1]) for f in _files(stale, "lab-flashinfer-jit-cache")}
    assert stale_versions == {"0.2.14+cu130"}


def test_main_index_answers_pep691_json_stale_index_html_only(lab_mirrors):
    accept = "application/vnd.pypi.simple.v1+json, application/vnd.pypi.simple.v1+html; q=0.1, text/html; q=0.01"
    main = json.loads(_get(f"{lab_mirrors.urls['lab-main']}/lab-sgl-kernel/", accept))
    assert main["meta"]["api-version"] == "1.1"
    assert set(main["versions"]) == {"0.3.16+cu128", "0.3.21+cu130"}
    for f in main["files"]:
        assert f["upload-time"].endswith("Z") and f["size"] > 0 and len(f["hashes"]["sha256"]) == 64
    stale = _get(f"{lab_mirrors.urls['lab-stale']}/lab-flashinfer-python/", accept).decode()
    assert stale.lstrip().startswith("<!DOCTYPE html>")


def test_stale_index_files_are_months_old(lab_mirrors):
    import email.utils
    import time

    stale = lab_mirrors.urls["lab-stale"]
    page = _get(f"{stale}/lab-flashinfer-python/").decode()
    href = re.search(r'href="([^"#]+)', page).group(1)
    base = stale.rsplit("/simple", 1)[0]
    req = urllib.request.Request(base + href, method="HEAD")
    with urllib.request.urlopen(req, timeout=30) as resp:
        modified = email.utils.parsedate_to_datetime(resp.headers["Last-Modified"]).timestamp()
    assert (time.time() - modified) / 86400 > 200


def test_redist_manifests_match_archives(lab_mirrors):
    redist = lab_mirrors.urls["redist"]
    for release, comps in (
        ("12.8.1", {"cuda_nvcc", "cuda_cudart", "cuda_cccl"}),
        ("13.0.2", {"cuda_nvcc", "cuda_crt", "libnvvm", "cuda_cudart", "cuda_cccl"}),
    ):
        manifest = json.loads(_get(f"{redist}/redistrib_{release}.json"))
        assert manifest["release_label"] == release
        assert {k for k, v in manifest.items() if isinstance(v, dict)} == comps
        for comp in comps:
            entry = manifest[comp]["linux-x86_64"]
            data = _get(f"{redist}/{entry['relative_path']}")
            assert hashlib.sha256(data).hexdigest() == entry["sha256"], comp
            assert str(len(data)) == entry["size"]
            assert entry["relative_path"] == (
                f"{comp}/linux-x86_64/{comp}-linux-x86_64-{manifest[comp]['version']}-archive.tar.xz"
            )
    served = lab_mirrors.requests("redist")
    assert any(r["path"].endswith("-archive.tar.xz") and r["bytes"] > 0 for r in served)


def test_wheel_metadata_matches_file_names(lab_mirrors):
    import zipfile

    from lab.common import MIRRORS

    wheels = sorted((MIRRORS / "lab-main").glob("lab_*.whl")) + sorted((MIRRORS / "lab-stale").glob("*.whl"))
    assert len(wheels) >= 15
    for wheel in wheels:
        name, version, _build, _tags = parse_wheel_filename(wheel.name)
        with zipfile.ZipFile(wheel) as zf:
            meta = zf.read(f"{wheel.name.split('-')[0]}-{version}.dist-info/METADATA").decode()
        assert f"\nName: {name}\n" in meta, wheel.name
        assert f"\nVersion: {version}\n" in meta, wheel.name


def _import_with(tmp_path, wheel_names: list[str], module: str):
    """Import ``module`` in a fresh interpreter that sees only the given lab wheels (pure Python, unzipped)."""
    import subprocess
    import sys
    import zipfile

    from lab.common import MIRRORS

    site = tmp_path / "site"
    site.mkdir(parents=True)
    for wn in wheel_names:
        zipfile.ZipFile(MIRRORS / "lab-main" / wn).extractall(site)
    env = {"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"}
    return subprocess.run(
        [sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(site)!r}); import {module}"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )


def test_flashinfer_trio_is_enforced_at_import(lab_mirrors, tmp_path):
    ok = _import_with(
        tmp_path / "ok",
        [
            "lab_flashinfer_python-0.6.4-py3-none-any.whl",
            "lab_flashinfer_cubin-0.6.4-py3-none-any.whl",
            "lab_flashinfer_jit_cache-0.6.4+cu130-py3-none-any.whl",
        ],
        "lab_flashinfer",
    )
    assert ok.returncode == 0, ok.stderr
    bad = _import_with(
        tmp_path / "bad",
        [
            "lab_flashinfer_python-0.6.4-py3-none-any.whl",
            "lab_flashinfer_cubin-0.6.4-py3-none-any.whl",
            "lab_flashinfer_jit_cache-0.2.14+cu128-py3-none-any.whl",
        ],
        "lab_flashinfer",
    )
    assert bad.returncode != 0
    assert "RuntimeError: lab-flashinfer-jit-cache version (0.2.14+cu128) does not match" in bad.stderr


def test_sgl_kernel_refuses_another_torch(lab_mirrors, tmp_path):
    good = _import_with(
        tmp_path / "good",
        ["lab_sgl_kernel-0.3.21+cu130-py3-none-any.whl", "lab_torch-2.11.0+cu130-py3-none-any.whl"],
        "lab_sgl_kernel",
    )
    assert good.returncode == 0, good.stderr
    bad = _import_with(
        tmp_path / "bad",
        ["lab_sgl_kernel-0.3.21+cu130-py3-none-any.whl", "lab_torch-2.9.1+cu128-py3-none-any.whl"],
        "lab_sgl_kernel",
    )
    assert "ImportError: lab_sgl_kernel 0.3.21+cu130 was built against lab-torch 2.11.0" in bad.stderr
