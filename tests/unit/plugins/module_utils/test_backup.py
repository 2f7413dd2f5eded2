# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

import os

import pytest

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _backup as bk

LOCK = "lab-torch==2.9.1+cu128\nlab-sglang==0.5.3\n"


def make_backup(folder, lock=LOCK, archive_from=None):
    os.makedirs(folder)
    (folder / "venv.lock").write_text(lock)
    (folder / "files" / "etc").mkdir(parents=True)
    (folder / "files" / "etc" / "a.env").write_text("CUDA_HOME=/usr/local/cuda-12.8\n")
    archive = None
    if archive_from:
        archive = {"members": bk.archive_venv(str(archive_from), str(folder / "venv.tar.gz"))}
    snapshot = {
        "venv": {"path": "/v", "package_count": len(bk.freeze_lines(lock))},
        "cuda": {},
        "files": [],
        "results": [],
    }
    manifest = bk.build_manifest(
        folder.name, "t", {"name": "node1"}, "lab", "r1", snapshot, bk.checksum_tree(str(folder)), archive
    )
    bk.write_manifest(str(folder), manifest)
    return manifest


class TestLock:
    def test_freeze_lines_sorted_without_comments(self):
        assert bk.freeze_lines("# c\nB==1\n\na==2\nB==1\n") == ["a==2", "B==1"]

    def test_parse_pins_local_tags_and_hashes(self):
        text = "lab-torch==2.9.1+cu128 \\\n    --hash=sha256:abc\nsix==1.17.0  # via x\n"
        packages = bk.parse_lock(text)
        assert [(p["name"], p["version"]) for p in packages] == [("lab-torch", "2.9.1+cu128"), ("six", "1.17.0")]

    @pytest.mark.parametrize("text", ["six>=1\n", "not a req ==\n", "", "six\n"])
    def test_unpinned_or_broken_lock_is_refused(self, text):
        with pytest.raises(bk.BackupError):
            bk.parse_lock(text)

    def test_lock_differences_normalise_names(self):
        want = bk.parse_lock("Lab_Torch==2.9.1+cu128\nsix==1.17.0\n")
        have = bk.parse_lock("lab-torch==2.9.1+cu128\nidna==3.10\n")
        assert bk.lock_differences(want, have) == [
            "idna: expected absent, found 3.10",
            "six: expected 1.17.0, found absent",
        ]
        assert bk.lock_differences(want, want) == []


class TestIdsAndRetention:
    def test_ids_sort_by_time_and_ignore_partials(self, tmp_path):
        for name in (
            "20261202T130000Z-aaaaaaaa",
            "20261201T130000Z-bbbbbbbb",
            ".partial-20261203T130000Z-cccccccc",
            "junk",
        ):
            (tmp_path / name).mkdir()
        assert bk.list_backups(str(tmp_path)) == ["20261201T130000Z-bbbbbbbb", "20261202T130000Z-aaaaaaaa"]
        assert bk.list_partials(str(tmp_path)) == [".partial-20261203T130000Z-cccccccc"]
        assert bk.new_backup_id("20261202T130000Z", "0123456789") == "20261202T130000Z-01234567"

    def test_prune_keeps_newest_and_protected(self):
        ids = ["a1", "a2", "a3", "a4"]
        assert bk.plan_prune(ids, 2) == ["a1", "a2"]
        assert bk.plan_prune(ids, 2, protect=["a1"]) == ["a2"]
        assert bk.plan_prune(ids, 9) == []
        with pytest.raises(bk.BackupError, match="backup_keep >= 1"):
            bk.plan_prune(ids, 0)


class TestVerify:
    def test_good_backup_verifies(self, tmp_path):
        venv = tmp_path / "venv"
        (venv / "bin").mkdir(parents=True)
        (venv / "bin" / "python").write_text("x")
        folder = tmp_path / "20261202T130000Z-aaaaaaaa"
        manifest = make_backup(folder, archive_from=venv)
        loaded = bk.load_manifest(str(folder))
        assert loaded == manifest
        assert bk.verify_backup(str(folder), loaded) == []
        assert manifest["archive"]["members"] == 3

    def test_changed_file_is_named(self, tmp_path):
        folder = tmp_path / "20261202T130000Z-aaaaaaaa"
        manifest = make_backup(folder)
        (folder / "files" / "etc" / "a.env").write_text("CUDA_HOME=/elsewhere\n")
        (folder / "extra").write_text("x")
        problems = bk.verify_backup(str(folder), manifest)
        assert any(p.startswith("files/etc/a.env sha256") for p in problems)
        assert "extra is not in the manifest" in problems

    def test_lock_count_mismatch(self, tmp_path):
        folder = tmp_path / "20261202T130000Z-aaaaaaaa"
        manifest = make_backup(folder)
        manifest["snapshot"]["venv"]["package_count"] = 5
        assert bk.verify_backup(str(folder), manifest) == ["venv.lock lists 2 packages, the manifest 5"]

    def test_corrupt_archive(self, tmp_path):
        venv = tmp_path / "venv"
        venv.mkdir()
        folder = tmp_path / "20261202T130000Z-aaaaaaaa"
        manifest = make_backup(folder, archive_from=venv)
        (folder / "venv.tar.gz").write_bytes(b"not gzip")
        problems = bk.verify_backup(str(folder), manifest)
        assert any("venv.tar.gz does not list" in p for p in problems)

    @pytest.mark.parametrize(
        ("damage", "message"),
        [
            (lambda f: os.unlink(f / "manifest.json"), "is missing"),
            (lambda f: (f / "manifest.json").write_text("{}"), "does not match its sha256"),
            (lambda f: os.unlink(f / "manifest.json.sha256"), "sha256 is missing"),
        ],
    )
    def test_missing_or_corrupt_manifest(self, tmp_path, damage, message):
        folder = tmp_path / "20261202T130000Z-aaaaaaaa"
        make_backup(folder)
        damage(folder)
        with pytest.raises(bk.BackupError, match=message):
            bk.load_manifest(str(folder))

    def test_manifest_moved_to_another_id(self, tmp_path):
        folder = tmp_path / "20261202T130000Z-aaaaaaaa"
        make_backup(folder)
        os.rename(folder, tmp_path / "20261202T130000Z-bbbbbbbb")
        with pytest.raises(bk.BackupError, match="names backup"):
            bk.load_manifest(str(tmp_path / "20261202T130000Z-bbbbbbbb"))

    def test_identity(self):
        manifest = {"id": "b", "host": {"name": "node1"}, "profile": "lab"}
        assert bk.identity_problems(manifest, "node1", "lab") == []
        assert bk.identity_problems(manifest, "node2") == ["backup b belongs to host 'node1', not 'node2'"]
        assert bk.identity_problems(manifest, "node1", "cu130") == ["backup b was taken for profile 'lab', not 'cu130'"]


class TestRecords:
    def test_file_records(self, tmp_path):
        (tmp_path / "f").write_text("x")
        os.chmod(tmp_path / "f", 0o640)
        (tmp_path / "l").symlink_to("f")
        rec = bk.file_record(str(tmp_path / "f"))
        assert rec["state"] == "file" and rec["mode"] == "0640" and rec["backup"] == "files" + str(tmp_path / "f")
        assert rec["sha256"] == bk.sha256_text("x")
        assert bk.file_record(str(tmp_path / "l"))["target"] == "f"
        assert bk.file_record(str(tmp_path / "none"))["state"] == "absent"

    def test_digest_covers_what_a_restore_puts_back_only(self):
        a = {"venv": {"path": "/a"}, "cuda": {"target": "/usr/local/cuda-12.8"}, "files": [], "results": []}
        assert bk.snapshot_digest(a) == bk.snapshot_digest(dict(a, results=[{"sha256": "new"}]))
        assert bk.snapshot_digest(a) != bk.snapshot_digest(dict(a, venv={"path": "/b"}))
        assert bk.snapshot_digest(a) != bk.snapshot_digest(dict(a, cuda={"target": "/usr/local/cuda-13.0"}))
        assert bk.snapshot_digest(a) != bk.snapshot_digest(dict(a, files=[{"path": "/etc/x", "sha256": "1"}]))


def test_rollback_target_is_the_host_before_it_moved_to_its_present_venv():
    from ansible_collections.gpufleet.upgrade.plugins.module_utils import _backup as backup

    def manifest(digest, venv):
        return {"digest": digest, "snapshot": {"venv": {"path": venv}}}

    now_venv = "/opt/s/venvs/lab-ebb7.repair-20261203T1131Z-1"
    before_upgrade = manifest("d1", "/opt/s/venvs/lab-cu128-seed")
    repair_backup = manifest("d2", "/opt/s/venvs/lab-ebb7")  # drifted copy of the present stack
    assert backup.venv_family(now_venv) == "lab-ebb7"
    assert not backup.is_rollback_target(repair_backup, "d3", now_venv)
    assert backup.is_rollback_target(before_upgrade, "d3", now_venv)
    assert not backup.is_rollback_target(before_upgrade, "d1", now_venv)  # the host is already there
    assert backup.is_rollback_target(repair_backup, "d3")  # without the venv: the digest rule alone
