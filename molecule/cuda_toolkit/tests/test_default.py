# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""After converge: both toolkits' nvcc work, the link policy (keep) held, the old tree is byte-identical."""

from __future__ import annotations

import json

NEW, OLD = "/usr/local/cuda-13.0", "/usr/local/cuda-12.8"
TREE_SUM = (
    "cd {path} && {{ find . -printf '%p %y %m %l\\n' | LC_ALL=C sort;"
    " find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum; }} | sha256sum"
)


def test_new_nvcc_reports_13_0(host):
    out = host.check_output(f"{NEW}/bin/nvcc --version")
    assert "release 13.0, V13.0.88" in out


def test_old_nvcc_still_reports_12_8(host):
    out = host.check_output(f"{OLD}/bin/nvcc --version")
    assert "release 12.8, V12.8.93" in out


def test_version_json_names_release_and_components(host):
    data = json.loads(host.file(f"{NEW}/version.json").content_string)
    assert data["cuda"]["version"] == "13.0.2"
    assert set(data) == {"cuda", "cuda_nvcc", "cuda_crt", "libnvvm", "cuda_cudart", "cuda_cccl"}


def test_link_policy_keep_left_the_link_on_12_8(host):
    link = host.file("/usr/local/cuda")
    assert link.is_symlink
    assert host.check_output("readlink -f /usr/local/cuda") == OLD


def test_old_tree_unchanged(host):
    recorded = host.file("/root/cuda-12.8.sum").content_string.strip()
    assert host.check_output(TREE_SUM.format(path=OLD)) == recorded


def test_nothing_left_behind(host):
    assert host.check_output("ls -A /usr/local").split() == sorted(
        ["bin", "cuda", "cuda-12.8", "cuda-13.0", "etc", "games", "include", "lib", "man", "sbin", "share", "src"]
    )


def test_check_mode_reports_no_change(check_run):
    assert all(s["changed"] == 0 for s in check_run.stats.values()), [t.task for t in check_run.changed_tasks()]
