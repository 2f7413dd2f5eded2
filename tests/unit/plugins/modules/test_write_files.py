# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""write_files: several files in one call, each replaced only when its content or mode differs; check mode and diff."""

from __future__ import annotations

import os
import stat

import pytest
from ansible.module_utils.testing import patch_module_args
from module_harness import Exit, Fail

from ansible_collections.gpufleet.upgrade.plugins.modules import write_files


def call(args, check=False, diff=False):
    args = dict(args, _ansible_check_mode=check, _ansible_diff=diff)
    with patch_module_args(args), pytest.raises((Exit, Fail)) as info:
        write_files.main()
    return info.type is Exit, info.value.args[0]


def mode_of(path):
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture
def files(tmp_path):
    """The serving role's two files as it passes them (with the host model's kind, which the module ignores)."""
    return [
        {
            "label": "svc.env",
            "path": str(tmp_path / "svc.env"),
            "content": 'CUDA_HOME="/usr/local/cuda-13.0"\n',
            "kind": "env",
            "mode": "0640",
        },
        {
            "label": "svc.service",
            "path": str(tmp_path / "svc.service"),
            "content": "[Service]\nExecStart=/bin/true\n",
            "kind": "text",
            "mode": "0644",
        },
    ]


def test_check_mode_shows_each_new_file_and_writes_nothing(files, tmp_path):
    ok, res = call({"files": files}, check=True, diff=True)
    assert ok and res["changed"], res
    assert res["written"] == [f["path"] for f in files]
    assert [d["after"] for d in res["diff"]] == [f["content"] for f in files]
    assert list(tmp_path.iterdir()) == []


def test_writes_both_then_is_silent_and_replaces_only_what_differs(files, tmp_path):
    ok, res = call({"files": files})
    assert ok and res["written"] == [f["path"] for f in files], res
    assert [open(f["path"]).read() for f in files] == [f["content"] for f in files]
    assert [mode_of(f["path"]) for f in files] == [0o640, 0o644]
    ok, res = call({"files": files}, check=True)
    assert ok and not res["changed"] and res["written"] == [], res
    ok, res = call({"files": files})
    assert ok and not res["changed"], res
    # An edited environment file is replaced (a new inode: readers see the old file or the new one); the unit is not.
    unit_inode = os.stat(files[1]["path"]).st_ino
    with open(files[0]["path"], "a") as handle:
        handle.write("EXTRA=1\n")
    ok, res = call({"files": files}, diff=True)
    assert ok and res["written"] == [files[0]["path"]], res
    assert res["diff"][0]["before"].endswith("EXTRA=1\n") and res["diff"][0]["after"] == files[0]["content"]
    assert open(files[0]["path"]).read() == files[0]["content"]
    assert os.stat(files[1]["path"]).st_ino == unit_inode
    assert sorted(os.listdir(tmp_path)) == ["svc.env", "svc.service"]


def test_a_changed_mode_alone_is_a_change(files):
    assert call({"files": files})[0]
    os.chmod(files[0]["path"], 0o644)
    ok, res = call({"files": files}, check=True)
    assert ok and res["written"] == [files[0]["path"]] and mode_of(files[0]["path"]) == 0o644, res
    ok, res = call({"files": files})
    assert ok and res["written"] == [files[0]["path"]] and mode_of(files[0]["path"]) == 0o640, res


def test_a_missing_folder_or_a_file_without_content_fails_naming_it(tmp_path):
    ok, res = call({"files": [{"label": "svc.env", "path": str(tmp_path / "nope" / "svc.env"), "content": "A=1\n"}]})
    assert (
        not ok
        and res["msg"] == f"write_files: the folder {tmp_path / 'nope'} of svc.env does not exist; create it first"
    )
    ok, res = call({"files": [{"path": str(tmp_path / "a")}]})
    assert not ok and res["msg"] == "write_files: files[0] needs path and content; it has ['path']"


def test_make_folders_creates_a_missing_folder_and_check_mode_only_reports_it(tmp_path):
    target = tmp_path / "node-exporter" / "textfile" / "gpufleet.prom"
    spec = {"files": [{"path": str(target), "content": "gpufleet_up 1\n", "mode": "0644"}]}
    ok, res = call(spec)
    assert not ok and "does not exist" in res["msg"], res
    ok, res = call(dict(spec, make_folders=True), check=True, diff=True)
    assert ok and res["written"] == [str(target)] and not target.parent.exists(), res
    ok, res = call(dict(spec, make_folders=True))
    assert ok and res["changed"] and target.read_text() == "gpufleet_up 1\n", res
    assert mode_of(target.parent) & 0o777 == 0o755 and mode_of(target) == 0o644
    ok, res = call(dict(spec, make_folders=True))
    assert ok and not res["changed"], res


def test_make_folders_names_the_folder_it_could_not_create(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    spec = {"files": [{"path": str(blocker / "sub" / "x.prom"), "content": "x\n"}], "make_folders": True}
    ok, res = call(spec)
    assert not ok and str(blocker / "sub") in res["msg"] and "could not create" in res["msg"], res
