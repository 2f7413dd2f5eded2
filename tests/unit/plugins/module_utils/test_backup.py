# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

import os
import re

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

    def test_copy_scope_checks_every_file_but_the_archive(self, tmp_path):
        venv = tmp_path / "venv"
        venv.mkdir()
        folder = tmp_path / "20261202T130000Z-aaaaaaaa"
        manifest = make_backup(folder, archive_from=venv)
        os.unlink(folder / "venv.tar.gz")
        assert bk.verify_backup(str(folder), manifest, scope="copy") == []
        assert "venv.tar.gz is missing" in bk.verify_backup(str(folder), manifest, scope="full")
        os.unlink(folder / "files" / "etc" / "a.env")
        assert bk.verify_backup(str(folder), manifest, scope="copy") == ["files/etc/a.env is missing"]
        assert bk.verify_backup(str(folder), manifest, scope="lock") == []

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


# --- which backup "roll back" restores --------------------------------------------------------------------


def manifest(backup_id, digest, venv, consistent=True, problems=(), model=None):
    state = {"consistent": consistent, "problems": list(problems), "model": model}
    return {"id": backup_id, "digest": digest, "snapshot": {"venv": {"path": venv}}, "state": state}


def test_rollback_choice_takes_the_newest_backup_before_the_present_venv():
    backups = [
        manifest("20260101T0000", "d-old", "/srv/venvs/lab-cu128"),
        manifest("20260201T0000", "d-now", "/srv/venvs/lab-aaaa"),
    ]
    choice = bk.rollback_choice(backups, "d-now", "/srv/venvs/lab-aaaa")
    assert choice["id"] == "20260101T0000" and choice["refused"] is None
    assert [p["id"] for p in choice["passed_over"]] == ["20260201T0000"]


def test_rollback_choice_refuses_a_backup_whose_recorded_state_was_inconsistent_and_names_clean_older_ones():
    bad = "serving venv: lab-torch 2.11.0+cu130 is built for CUDA 13.0, CUDA_HOME /usr/local/cuda-12.8 is CUDA 12.8"
    backups = [
        manifest("20260101T0000", "d-0", "/srv/venvs/lab-cu128"),
        manifest("20260115T0000", "d-1", "/srv/venvs/lab-cu128", consistent=False, problems=[bad]),
        manifest("20260201T0000", "d-now", "/srv/venvs/lab-aaaa"),
    ]
    choice = bk.rollback_choice(backups, "d-now", "/srv/venvs/lab-aaaa")
    assert choice["id"] is None
    assert choice["refused"] == {"id": "20260115T0000", "problems": [bad]}
    assert choice["alternatives"] == ["20260101T0000"]


def test_a_backup_taken_on_the_profile_with_drift_is_refused_and_one_without_a_record_is_not():
    drifted = {"profile": "lab", "in_sync": False, "on_profile": True, "drift": ["serving venv: six 1.17.0 missing"]}
    backups = [manifest("20260101T0000", "d-0", "/srv/venvs/lab-old", model=drifted)]
    choice = bk.rollback_choice(backups, "d-now", "/srv/venvs/lab-aaaa")
    assert choice["refused"]["problems"] == [
        "taken while the host ran profile lab with drift (serving venv: six 1.17.0 missing)"
    ]
    # Not on the profile (the host before its upgrade) is no drift: the model judged it against the target.
    before = {"profile": "lab", "in_sync": False, "on_profile": False, "drift": ["serving venv link: ..."]}
    assert bk.rollback_choice([manifest("1", "d-0", "/v/old", model=before)], "d-now", "/v/new")["id"] == "1"
    legacy = {"id": "2", "digest": "d-0", "snapshot": {"venv": {"path": "/v/old"}}}
    assert bk.rollback_choice([legacy], "d-now", "/v/new")["id"] == "2"


def test_pinned_versions_reads_lock_and_freeze_lines():
    text = "# tool: uv\nlab-torch==2.11.0+cu130 --hash=sha256:ab\nsix==1.17.0 ; python_version > '3'\npkg @ file:///x.whl\n"
    assert bk.pinned_versions(text) == [
        {"name": "lab-torch", "version": "2.11.0+cu130"},
        {"name": "six", "version": "1.17.0"},
    ]


def snap(venv="/v/old", lock="l1", target="/usr/local/cuda-12.8", env_sha="e1", link_target=None):
    files = [{"path": "/etc/gpufleet/gpufleet-serving.env", "state": "file", "sha256": env_sha}]
    if link_target:
        files.append({"path": "/etc/systemd/system/gpufleet-serving.service", "state": "link", "target": link_target})
    return {
        "venv": {"path": venv, "lock_sha256": lock},
        "cuda": {"link": "/usr/local/cuda", "target": target, "alternatives": None, "toolkits": [{"path": target}]},
        "files": files,
    }


def test_restore_differences_is_empty_for_the_restored_host_and_names_each_thing_that_differs():
    before = snap(link_target="/srv/config/unit")
    after = dict(snap(link_target="/srv/config/unit"))
    after["cuda"] = dict(after["cuda"], toolkits=[{"path": "/usr/local/cuda-12.8"}, {"path": "/usr/local/cuda-13.0"}])
    assert bk.restore_differences(before, after) == []  # a new toolkit beside the old one is no difference
    wrong = snap(venv="/v/new", target="/usr/local/cuda-13.0", env_sha="e2", link_target="/elsewhere")
    assert bk.restore_differences(before, wrong) == [
        "serving venv: current is /v/new, the backup had /v/old",
        "/usr/local/cuda: points at /usr/local/cuda-13.0, the backup had /usr/local/cuda-12.8",
        "/etc/gpufleet/gpufleet-serving.env: content differs from the backup",
        "/etc/systemd/system/gpufleet-serving.service: links to /elsewhere, the backup had /srv/config/unit",
    ]
    assert bk.restore_differences(before, snap(lock="l2", link_target="/srv/config/unit")) == [
        "serving venv /v/old: its packages differ from the backup's lock"
    ]


def test_the_package_list_can_be_left_to_the_caller():
    before, rebuilt = snap(), snap(lock="l-with-pip")
    assert bk.restore_differences(before, rebuilt, compare_lock=False) == []
    assert bk.restore_differences(before, rebuilt) == [
        "serving venv /v/old: its packages differ from the backup's lock"
    ]
    assert bk.restore_differences(before, snap(venv="/v/new"), compare_lock=False) == [
        "serving venv: current is /v/new, the backup had /v/old"
    ]


class TestManifestValidation:
    """A manifest of a format this collection does not know is refused naming the file and the value (issue 42)."""

    def rewrite(self, folder, **changes):
        path = folder / "manifest.json"
        manifest = dict(bk.load_manifest(str(folder)), **changes)
        bk.write_manifest(str(folder), manifest)
        return path

    def test_the_manifest_names_its_format_and_the_version_that_wrote_it(self, tmp_path):
        manifest = make_backup(tmp_path / "20261202T130000Z-aaaaaaaa")
        assert manifest["format"] == bk.FORMAT_VERSION and manifest["collection_version"] == bk.COLLECTION_VERSION
        assert bk.validate_manifest(manifest) is manifest

    def test_a_future_format_is_refused_naming_the_file_the_value_and_the_writer(self, tmp_path):
        folder = tmp_path / "20261202T130000Z-aaaaaaaa"
        make_backup(folder)
        path = self.rewrite(folder, format=2, collection_version="9.0.0")
        with pytest.raises(bk.BackupError) as err:
            bk.load_manifest(str(folder))
        assert str(err.value) == (
            f"{path} records format 2 (key format), gpufleet.upgrade {bk.COLLECTION_VERSION} reads format 1: "
            "written by gpufleet.upgrade 9.0.0, restore it with that version"
        )

    @pytest.mark.parametrize(
        ("changes", "words"),
        [
            (
                {"format": None},
                f"records format None (key format), gpufleet.upgrade {bk.COLLECTION_VERSION} reads format 1: edited",
            ),
            ({"format": "1"}, "records format '1' (key format)"),
            ({"snapshot": []}, "records snapshot [], expected a JSON object"),
            ({"checksums": None}, "records checksums None, expected a JSON object"),
        ],
    )
    def test_other_unknown_values_are_refused(self, tmp_path, changes, words):
        folder = tmp_path / "20261202T130000Z-aaaaaaaa"
        make_backup(folder)
        self.rewrite(folder, **changes)
        with pytest.raises(bk.BackupError, match=re.escape(words)):
            bk.load_manifest(str(folder))
