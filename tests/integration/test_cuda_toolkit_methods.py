# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Role cuda_toolkit, apt and runfile methods, against local sources the test builds from the lab's real
NVIDIA 13.0 binaries: a .deb named like NVIDIA's whose postinst moves /usr/local/cuda through
update-alternatives, served by a loopback apt repository; and a self-extracting runfile that honours
--silent --toolkit --toolkitpath=DIR (and, like NVIDIA's, repoints /usr/local/cuda)."""

from __future__ import annotations

import hashlib
import http.server
import json
import subprocess
import threading
from functools import partial
from pathlib import Path

import pytest

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _redist as rd

pytestmark = pytest.mark.integration

PLAY = Path(__file__).resolve().parent / "playbooks" / "cuda_toolkit.yml"
TARGET = "/usr/local/cuda-13.0"
OLD = "/usr/local/cuda-12.8"
TREE_SUM = (
    "cd {path} && {{ find . -printf '%p %y %m %l\\n' | LC_ALL=C sort;"
    " find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum; }} | sha256sum"
)

POSTINST = """#!/bin/sh
set -e
# As NVIDIA's cuda-toolkit-X-Y packages do.
update-alternatives --install /usr/local/cuda cuda /usr/local/cuda-13.0 130
"""
PRERM = """#!/bin/sh
set -e
update-alternatives --remove cuda /usr/local/cuda-13.0 || true
"""
RUNFILE_HEAD = r"""#!/bin/sh
# Lab stand-in for NVIDIA's cuda_13.0.2_<driver>_linux.run: a shell header and a tar.gz payload.
set -e
SILENT= TOOLKIT= TKPATH=/usr/local/cuda-13.0
for arg in "$@"; do
  case "$arg" in
    --silent) SILENT=1 ;;
    --toolkit) TOOLKIT=1 ;;
    --toolkitpath=*) TKPATH="${arg#--toolkitpath=}" ;;
    *) echo "unknown option $arg" >&2; exit 2 ;;
  esac
done
[ -n "$SILENT" ] && [ -n "$TOOLKIT" ] || { echo "only --silent --toolkit is supported" >&2; exit 2; }
LINE=$(awk '/^__PAYLOAD__$/ { print NR + 1; exit 0 }' "$0")
mkdir -p "$TKPATH/pkgconfig"
tail -n +"$LINE" "$0" | tar -xz -C "$TKPATH"
printf 'cudaroot=%s\nlibdir=${cudaroot}/lib\nName: cudart\n' "$TKPATH" > "$TKPATH/pkgconfig/cudart-13.0.pc"
ln -sfn "$TKPATH" /usr/local/cuda
echo "toolkit installed to $TKPATH" >> /var/log/cuda-installer.log
exit 0
__PAYLOAD__
"""


def sh(node_exec, node, cmd):
    return node_exec(node, cmd, check=False).stdout.strip()


@pytest.fixture(scope="module")
def fleet(lab_fleet):
    return lab_fleet(2, name="cuda-methods")


@pytest.fixture(scope="module")
def payload(tmp_path_factory, lab_mirrors):
    """The lab's CUDA 13.0.2 toolkit (real nvcc) as a tree, built from the redist mirror's archives."""
    from lab.common import MIRRORS

    redist = MIRRORS / "redist"
    manifest = json.loads((redist / "redistrib_13.0.2.json").read_text())
    archives = rd.select(manifest, ["cuda_nvcc", "cuda_crt", "libnvvm", "cuda_cudart", "cuda_cccl"], "linux-x86_64")
    tree = tmp_path_factory.mktemp("payload") / "cuda-13.0"
    tree.mkdir()
    for archive in archives:
        rd.verify_file(str(redist / archive["relative_path"]), archive["sha256"], archive["size"])
        rd.extract_archive(str(redist / archive["relative_path"]), archive["top_dir"], str(tree))
    (tree / "version.json").write_text(json.dumps(rd.version_json(archives, "13.0.2"), indent=3))
    return tree


def serve(directory):
    handler = partial(http.server.SimpleHTTPRequestHandler, directory=str(directory))
    handler.log_message = lambda *a: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture(scope="module")
def apt_repo(tmp_path_factory, payload):
    """A flat apt repository on loopback holding cuda-toolkit-13-0 13.0.2-1; yields its sources line."""
    base = tmp_path_factory.mktemp("apt")
    pkg, repo = base / "pkg", base / "repo"
    (pkg / "DEBIAN").mkdir(parents=True)
    (pkg / "usr" / "local").mkdir(parents=True)
    subprocess.run(["cp", "-a", str(payload), str(pkg / "usr" / "local" / "cuda-13.0")], check=True)
    (pkg / "DEBIAN" / "control").write_text(
        "Package: cuda-toolkit-13-0\nVersion: 13.0.2-1\nArchitecture: amd64\nMaintainer: gpufleet lab <lab@localhost>\n"
        "Description: CUDA Toolkit 13.0 (lab build from NVIDIA's redist archives)\n"
    )
    for name, text in (("postinst", POSTINST), ("prerm", PRERM)):
        (pkg / "DEBIAN" / name).write_text(text)
        (pkg / "DEBIAN" / name).chmod(0o755)
    repo.mkdir()
    deb = repo / "cuda-toolkit-13-0_13.0.2-1_amd64.deb"
    subprocess.run(["dpkg-deb", "--root-owner-group", "-Zgzip", "-z1", "--build", str(pkg), str(deb)], check=True)
    packages = subprocess.run(["dpkg-scanpackages", "--multiversion", "."], cwd=repo, check=True, capture_output=True)
    (repo / "Packages").write_bytes(packages.stdout)
    server = serve(repo)
    yield f"deb [trusted=yes] http://127.0.0.1:{server.server_address[1]}/ ./"
    server.shutdown()


@pytest.fixture(scope="module")
def runfile(tmp_path_factory, payload):
    """A self-extracting runfile; returns (file:// URL on the controller, sha256)."""
    base = tmp_path_factory.mktemp("runfile")
    tgz = base / "payload.tar.gz"
    subprocess.run(f"tar -C {payload} -cf - . | gzip -1 > {tgz}", shell=True, check=True)
    run = base / "cuda_13.0.2_580.95.05_linux.run"
    run.write_bytes(RUNFILE_HEAD.encode() + tgz.read_bytes())
    run.chmod(0o755)
    return run.as_uri(), hashlib.sha256(run.read_bytes()).hexdigest()


def four_step(run_playbook, fleet, node, extra, install_task):
    results = []
    for check in (True, False, True, False):
        res = run_playbook(PLAY, fleet.inventory, extravars=extra, limit=node, check=check, diff=True)
        assert res.rc == 0, str(res)
        results.append(res)
    first, applied, again_check, again = results
    assert first.task(install_task, host=node).changed
    assert applied.task(install_task, host=node).changed
    for res in (again_check, again):
        assert res.stats[node]["changed"] == 0, [r.task for r in res.changed_tasks(node)]
    return first, applied


def test_apt_method_records_and_reasserts_the_link(fleet, run_playbook, node_exec, apt_repo, tmp_path):
    node = fleet.nodes[0]
    old_sum = sh(node_exec, node, TREE_SUM.format(path=OLD))
    assert sh(node_exec, node, "readlink /usr/local/cuda") == OLD
    extra = {
        "cuda_toolkit_install_method": "apt",
        "cuda_toolkit_apt_repo": apt_repo,
        "cuda_toolkit_apt_version": "13.0.2-1",
        "cuda_toolkit_cache_dir": str(tmp_path / "cache"),
    }
    first, applied = four_step(run_playbook, fleet, node, extra, "Install the pinned toolkit package")
    assert (
        "cuda-toolkit-13-0=13.0.2-1" in first.task("Install the pinned toolkit package", host=node).res["diff"]["after"]
    )
    # The package's postinst took the link over; the role put it back where it was and pinned the choice.
    assert applied.task("Hold the global link to the link policy", host=node).changed
    assert sh(node_exec, node, "dpkg-query -W -f='${Version}' cuda-toolkit-13-0") == "13.0.2-1"
    assert "release 13.0, V13.0.88" in sh(node_exec, node, f"{TARGET}/bin/nvcc --version")
    assert "release 12.8" in sh(node_exec, node, f"{OLD}/bin/nvcc --version")
    assert sh(node_exec, node, "readlink /usr/local/cuda") == "/etc/alternatives/cuda"
    assert sh(node_exec, node, "readlink -f /usr/local/cuda") == OLD
    query = sh(node_exec, node, "update-alternatives --query cuda")
    assert "Status: manual" in query and f"Value: {OLD}" in query, query
    # A later package upgrade re-runs the postinst: the manual choice holds.
    sh(node_exec, node, "DEBIAN_FRONTEND=noninteractive apt-get install -y --reinstall cuda-toolkit-13-0=13.0.2-1")
    assert sh(node_exec, node, "readlink -f /usr/local/cuda") == OLD
    assert sh(node_exec, node, TREE_SUM.format(path=OLD)) == old_sum


def test_apt_method_target_policy_chooses_the_new_toolkit(fleet, run_playbook, node_exec, apt_repo):
    node = fleet.nodes[0]
    extra = {
        "cuda_toolkit_install_method": "apt",
        "cuda_toolkit_apt_repo": apt_repo,
        "cuda_toolkit_apt_version": "13.0.2-1",
        "cuda_toolkit_link_policy": "target",
    }
    res = run_playbook(PLAY, fleet.inventory, extravars=extra, limit=node)
    assert res.rc == 0, str(res)
    assert [r.task for r in res.changed_tasks(node)] == [res.task("Hold the global link", host=node).task]
    assert sh(node_exec, node, "readlink -f /usr/local/cuda") == TARGET
    assert f"Value: {TARGET}" in sh(node_exec, node, "update-alternatives --query cuda")
    res = run_playbook(PLAY, fleet.inventory, extravars=extra, limit=node)
    assert res.stats[node]["changed"] == 0


def test_apt_method_missing_version_fails_clearly(fleet, run_playbook, node_exec, apt_repo):
    node = fleet.nodes[0]
    extra = {
        "cuda_toolkit_install_method": "apt",
        "cuda_toolkit_apt_repo": apt_repo,
        "cuda_toolkit_apt_version": "13.0.9-1",
    }
    res = run_playbook(PLAY, fleet.inventory, extravars=extra, limit=node)
    assert res.rc != 0
    failed = next(r for r in res.results[node] if r.failed)
    assert "cuda-toolkit-13-0=13.0.9-1" in failed.msg and "cuda_toolkit_apt_version" in failed.msg, failed.msg
    assert sh(node_exec, node, "dpkg-query -W -f='${Version}' cuda-toolkit-13-0") == "13.0.2-1"


def test_runfile_method(fleet, run_playbook, node_exec, runfile, tmp_path):
    node = fleet.nodes[1]
    url, sha = runfile
    old_sum = sh(node_exec, node, TREE_SUM.format(path=OLD))
    extra = {
        "cuda_toolkit_install_method": "runfile",
        "cuda_toolkit_runfile_url": url,
        "cuda_toolkit_runfile_sha256": sha,
        "cuda_toolkit_runfile_cache_dir": str(tmp_path / "runfile-cache"),
        "cuda_toolkit_runfile_required_bytes": 1 << 20,
    }
    # A wrong sha256 stops before anything reaches the host.
    res = run_playbook(PLAY, fleet.inventory, extravars=dict(extra, cuda_toolkit_runfile_sha256="0" * 64), limit=node)
    assert res.rc != 0
    failed = [r for r in res.results[node] if r.failed][-1]
    assert node in failed.msg and "cuda_toolkit_runfile_sha256" in failed.msg, failed.msg
    assert sh(node_exec, node, "ls -A /usr/local | grep -c -e gpufleet -e cuda-13.0") == "0"

    four_step(run_playbook, fleet, node, extra, "Run the installer into a staging folder and move it into place")
    assert "release 13.0, V13.0.88" in sh(node_exec, node, f"{TARGET}/bin/nvcc --version")
    assert sh(node_exec, node, f"grep cudaroot= {TARGET}/pkgconfig/cudart-13.0.pc") == f"cudaroot={TARGET}"
    assert sh(node_exec, node, "readlink -f /usr/local/cuda") == OLD
    assert sh(node_exec, node, "ls -A /usr/local | grep -c gpufleet") == "0"
    assert json.loads(sh(node_exec, node, f"cat {TARGET}/.gpufleet-install.json"))["runfile_sha256"] == sha
    assert sh(node_exec, node, TREE_SUM.format(path=OLD)) == old_sum
