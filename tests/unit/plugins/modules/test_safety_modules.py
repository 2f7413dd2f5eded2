# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Modules of the safety net (backup_manifest, backup_info, upgrade_state, upgrade_lock) on a fake host tree."""

from __future__ import annotations

import json
import os

import pytest
from ansible.module_utils.testing import patch_module_args
from module_harness import Exit, Fail

from ansible_collections.gpufleet.upgrade.plugins.modules import (
    backup_info,
    backup_manifest,
    upgrade_lock,
    upgrade_state,
)


def call(module, args, check=False, diff=False):
    args = dict(args, _ansible_check_mode=check, _ansible_diff=diff)
    with patch_module_args(args), pytest.raises((Exit, Fail)) as info:
        module.main()
    return info.type is Exit, info.value.args[0]


@pytest.fixture
def host(tmp_path):
    """An old-state host: venv behind a current link, a 12.8 toolkit behind /usr/local/cuda, unit + env files."""
    venv = tmp_path / "serving" / "venvs" / "lab-cu128-seed"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text("#!/bin/sh\nprintf 'lab-torch==2.9.1+cu128\\nlab-sglang==0.5.3\\n'\n")
    python.chmod(0o755)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\nversion_info = 3.11.2\n")
    (tmp_path / "serving" / "current").symlink_to("venvs/lab-cu128-seed")
    cuda = tmp_path / "local"
    (cuda / "cuda-12.8" / "bin").mkdir(parents=True)
    (cuda / "cuda-12.8" / "bin" / "nvcc").write_text("nvcc")
    (cuda / "cuda-12.8" / "version.json").write_text(json.dumps({"cuda": {"version": "12.8.1"}}))
    (cuda / "cuda").symlink_to(str(cuda / "cuda-12.8"))
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "gpufleet-serving.service").write_text("[Service]\nExecStart=/x\n")
    (etc / "gpufleet-serving.env").write_text("CUDA_HOME=/usr/local/cuda-12.8\n")
    results = tmp_path / "state" / "results"
    results.mkdir(parents=True)
    (results / "bench.json").write_text('{"tok_s": 54.1}')
    return tmp_path


def backup_args(root, **extra):
    args = {
        "state_dir": str(root / "state"),
        "host": "node1",
        "profile": "lab",
        "run_id": "r1",
        "venv_link": str(root / "serving" / "current"),
        "cuda_root": str(root / "local"),
        "cuda_link": str(root / "local" / "cuda"),
        "alternatives_name": "",
        "files": [
            str(root / "etc" / "gpufleet-serving.service"),
            str(root / "etc" / "gpufleet-serving.env"),
            str(root / "etc" / "dropin.conf"),
        ],
        "results_dir": str(root / "state" / "results"),
    }
    args.update(extra)
    return args


class TestBackupManifest:
    def test_check_mode_writes_nothing(self, host):
        ok, res = call(backup_manifest, backup_args(host), check=True)
        assert ok and res["changed"] and not res["reused"]
        assert not (host / "state" / "backups").exists()

    def test_backup_records_everything_and_verifies(self, host):
        ok, res = call(backup_manifest, backup_args(host, archive=True))
        assert ok and res["changed"], res
        folder = host / "state" / "backups" / res["backup_id"]
        manifest = json.loads((folder / "manifest.json").read_text())
        snap = manifest["snapshot"]
        assert snap["venv"]["path"] == str(host / "serving" / "venvs" / "lab-cu128-seed")
        assert snap["venv"]["python"] == "3.11.2" and snap["venv"]["package_count"] == 2
        assert (folder / "venv.lock").read_text() == "lab-sglang==0.5.3\nlab-torch==2.9.1+cu128\n"
        assert snap["cuda"]["target"] == str(host / "local" / "cuda-12.8")
        assert snap["cuda"]["toolkits"][0]["version"] == "12.8.1"
        assert [f["state"] for f in snap["files"]] == ["file", "file", "absent"]
        assert (
            (folder / "files" / str(host / "etc" / "gpufleet-serving.env").lstrip("/"))
            .read_text()
            .startswith("CUDA_HOME")
        )
        assert "results/bench.json" in manifest["checksums"] and "venv.tar.gz" in manifest["checksums"]
        ok, info = call(backup_info, {"state_dir": str(host / "state"), "host": "node1", "profile": "lab"})
        assert ok and info["found"] and info["backup_id"] == res["backup_id"] and info["lock_checked"]

    def test_unchanged_host_reuses_the_backup(self, host):
        _ok, first = call(backup_manifest, backup_args(host))
        ok, again = call(backup_manifest, backup_args(host))
        assert ok and not again["changed"] and again["reused"] and again["backup_id"] == first["backup_id"]
        (host / "state" / "results" / "bench.json").write_text('{"tok_s": 96.1}')
        ok, results_only = call(backup_manifest, backup_args(host))
        assert ok and results_only["reused"], "new results alone must not make a new backup"
        (host / "etc" / "gpufleet-serving.env").write_text("CUDA_HOME=/usr/local/cuda-13.0\n")
        _ok, check = call(backup_manifest, backup_args(host), check=True)
        assert check["changed"] and check["backup_id"] != first["backup_id"]

    def test_partials_removed_and_retention(self, host):
        backups = host / "state" / "backups"
        for i in range(3):
            (backups / f"2020010{i}T000000Z-0000000{i}").mkdir(parents=True)
        (backups / ".partial-20200109T000000Z-00000009").mkdir()
        ok, res = call(backup_manifest, backup_args(host, keep=2, protect=["20200100T000000Z-00000000"]))
        assert ok
        assert res["partials_removed"] == [".partial-20200109T000000Z-00000009"]
        assert res["pruned"] == ["20200101T000000Z-00000001"]
        assert sorted(os.listdir(backups)) == [
            "20200100T000000Z-00000000",
            "20200102T000000Z-00000002",
            res["backup_id"],
        ]

    def test_no_venv_yet(self, host):
        os.unlink(host / "serving" / "current")
        ok, res = call(backup_manifest, backup_args(host))
        assert ok and res["manifest"]["snapshot"]["venv"]["path"] is None

    def test_failing_freeze_names_host_and_fix(self, host):
        (host / "serving" / "venvs" / "lab-cu128-seed" / "bin" / "python").write_text("#!/bin/sh\nexit 3\n")
        ok, res = call(backup_manifest, backup_args(host))
        assert not ok and res["msg"].startswith("node1: listing the packages") and "fix:" in res["msg"]


class TestBackupInfo:
    def test_never_upgraded_host(self, host):
        ok, res = call(backup_info, {"state_dir": str(host / "state"), "host": "node1"})
        assert ok and res["found"] is False and "never upgraded" in res["msg"]

    def test_refuses_other_host_other_profile_missing_and_corrupt(self, host):
        _ok, made = call(backup_manifest, backup_args(host))
        base = {"state_dir": str(host / "state"), "host": "node1"}
        ok, res = call(backup_info, dict(base, host="node2"))
        assert not ok and "refused" in res["msg"] and "node2" in res["msg"]
        ok, res = call(backup_info, dict(base, profile="cu130"))
        assert not ok and "profile 'lab'" in res["msg"]
        ok, res = call(backup_info, dict(base, backup_id="20200101T000000Z-00000000"))
        assert not ok and "does not exist" in res["msg"] and made["backup_id"] in res["msg"]
        folder = host / "state" / "backups" / made["backup_id"]
        (folder / "venv.lock").write_text("lab-torch==9\n")
        ok, res = call(backup_info, base)
        assert not ok and "venv.lock sha256" in res["msg"] and "nothing was changed" in res["msg"]
        (folder / "manifest.json").write_text("{")
        ok, res = call(backup_info, base)
        assert not ok and "unusable" in res["msg"]

    def test_unlike_digest_skips_backups_of_the_present_state(self, host):
        _ok, old = call(backup_manifest, backup_args(host))
        (host / "etc" / "gpufleet-serving.env").write_text("CUDA_HOME=/usr/local/cuda-13.0\n")
        _ok, new = call(backup_manifest, backup_args(host))
        assert new["backup_id"] != old["backup_id"]
        base = {"state_dir": str(host / "state"), "host": "node1"}
        ok, res = call(backup_info, dict(base, unlike_digest=new["manifest"]["digest"]))
        assert ok and res["backup_id"] == old["backup_id"]
        ok, res = call(backup_info, dict(base, unlike_digest=old["manifest"]["digest"]))
        assert ok and res["backup_id"] == new["backup_id"]
        (host / "state" / "backups" / old["backup_id"] / "venv.lock").unlink()
        os.unlink(host / "state" / "backups" / new["backup_id"] / "manifest.json")
        ok, res = call(backup_info, dict(base, unlike_digest="0" * 64))
        assert not ok and new["backup_id"] in res["msg"] and "unusable" in res["msg"]


class TestRecordedState:
    def test_a_backup_records_whether_the_stack_fits_and_rollback_refuses_an_inconsistent_one(self, host):
        env = host / "etc" / "gpufleet-serving.env"
        args = backup_args(host, env_file=str(env))
        env.write_text(f"CUDA_HOME={host}/local/cuda-12.8\n")
        _ok, clean = call(backup_manifest, args)
        assert clean["manifest"]["state"]["consistent"] is True and clean["manifest"]["state"]["cuda_version"] == "12.8"
        # The venv is cu128; a CUDA_HOME of a toolkit that is not installed is an inconsistent stack.
        env.write_text(f"CUDA_HOME={host}/local/cuda-13.0\n")
        _ok, broken = call(backup_manifest, dict(args, model={"profile": "lab", "in_sync": False, "on_profile": False}))
        state = broken["manifest"]["state"]
        assert state["consistent"] is False and state["model"]["profile"] == "lab"
        assert state["problems"] == [
            f"serving environment: CUDA_HOME is {host}/local/cuda-13.0, which is no installed toolkit (installed:"
            f" {host}/local/cuda-12.8)"
        ]
        stored = json.loads((host / "state" / "backups" / broken["backup_id"] / "manifest.json").read_text())
        assert stored["state"] == state
        base = {"state_dir": str(host / "state"), "host": "node1"}
        ok, res = call(backup_info, dict(base, unlike_digest="0" * 64))
        assert not ok and res["msg"].startswith(f"node1: refused: backup {broken['backup_id']}, the one to roll back")
        assert f"-e rollback_backup_id={broken['backup_id']}" in res["msg"]
        assert f"an older backup whose record is clean ({clean['backup_id']})" in res["msg"]
        ok, res = call(backup_info, dict(base, backup_id=broken["backup_id"]))
        assert ok and res["recorded_state_problems"] == state["problems"]


class TestUpgradeState:
    def test_write_query_and_idempotence(self, tmp_path):
        path = str(tmp_path / "state.json")
        args = {"path": path, "run_id": "r1", "phase": "backup", "status": "completed", "backup_id": "b1"}
        ok, res = call(upgrade_state, args, check=True, diff=True)
        assert ok and res["changed"] and not os.path.exists(path) and "b1" in res["diff"]["after"]
        ok, res = call(upgrade_state, args)
        assert ok and res["changed"] and json.loads(open(path).read())["backup_id"] == "b1"
        ok, res = call(upgrade_state, args)
        assert ok and not res["changed"]
        ok, res = call(upgrade_state, {"path": path, "run_id": "r2", "state": "query"})
        assert ok and res["recovery"]["action"] == "rollback" and res["recovery"]["backup_id"] == "b1"

    def test_query_names_the_record_and_the_way_back(self, tmp_path):
        path = str(tmp_path / "state.json")
        ok, res = call(upgrade_state, {"path": path, "run_id": "rb", "state": "query"})
        assert ok and res["record"] == f"the host's run record {path} is missing"
        assert res["recorded_backup_id"] is None and res["rollback"]["backup_id"] is None
        for changes in (
            {"phase": "backup", "status": "completed", "backup_id": "b1"},
            {"phase": "drain", "status": "started"},
        ):
            call(upgrade_state, dict({"path": path, "run_id": "r1"}, **changes))
        ok, res = call(upgrade_state, {"path": path, "run_id": "rb", "state": "query"})
        assert res["record"] == "run r1 in_progress at phase drain (started), backup b1"
        assert res["recorded_backup_id"] == "b1"
        assert res["rollback"]["backup_id"] == "b1" and "interrupted at phase drain" in res["rollback"]["why"]
        assert not res["changed"]

    def test_corrupt_state_file_names_the_fix(self, tmp_path):
        (tmp_path / "state.json").write_text("{oops")
        ok, res = call(upgrade_state, {"path": str(tmp_path / "state.json"), "run_id": "r1", "state": "query"})
        assert not ok and "fix:" in res["msg"]


class TestUpgradeLock:
    def holder(self, alive=None, controller="ctl"):
        return {"pid": 11, "pid_start": "5", "controller": controller, "started": "t", "alive": alive}

    def test_take_keep_release(self, tmp_path):
        path = str(tmp_path / "upgrade.lock")
        ok, res = call(upgrade_lock, {"path": path, "run_id": "r1", "holder": self.holder()}, check=True)
        assert ok and not res["changed"] and res["verdict"] == "free" and not os.path.exists(path)
        ok, res = call(upgrade_lock, {"path": path, "run_id": "r1", "holder": self.holder()})
        assert ok and res["verdict"] == "free" and json.loads(open(path).read())["run_id"] == "r1"
        ok, res = call(upgrade_lock, {"path": path, "run_id": "r1", "holder": self.holder()})
        assert ok and not res["changed"] and res["verdict"] == "ours"
        ok, res = call(upgrade_lock, {"path": path, "run_id": "r2", "state": "absent"})
        assert ok and not res["changed"] and os.path.exists(path)
        ok, res = call(upgrade_lock, {"path": path, "run_id": "r1", "state": "absent"})
        assert ok and res["changed"] and not os.path.exists(path)

    def test_live_holder_refused_dead_holder_taken_over(self, tmp_path):
        path = str(tmp_path / "upgrade.lock")
        call(upgrade_lock, {"path": path, "run_id": "r1", "holder": self.holder()})
        ok, res = call(upgrade_lock, {"path": path, "run_id": "r2", "holder": self.holder(alive=True)})
        assert not ok and "locked by running run r1" in res["msg"]
        before = open(path).read()
        args = {"path": path, "run_id": "r2", "holder": self.holder(alive=False)}
        ok, res = call(upgrade_lock, args, check=True, diff=True)
        assert ok and res["verdict"] == "takeover" and open(path).read() == before
        assert res["changed"], "check mode hid that the run would remove the dead run's lock"
        assert '"run_id": "r1"' in res["diff"]["before"] and res["diff"]["after"] == ""
        ok, res = call(upgrade_lock, args, diff=True)
        assert ok and res["verdict"] == "takeover" and json.loads(open(path).read())["run_id"] == "r2"
        assert '"run_id": "r2"' in res["diff"]["after"]

    def test_unreadable_lock(self, tmp_path):
        (tmp_path / "upgrade.lock").write_text("garbage")
        ok, res = call(upgrade_lock, {"path": str(tmp_path / "upgrade.lock"), "run_id": "r2", "holder": self.holder()})
        assert not ok and "remove the file" in res["msg"]


class TestLostRunRecord:
    def test_host_state_names_a_run_record_lost_beside_backups(self, tmp_path):
        from ansible_collections.gpufleet.upgrade.plugins.modules import host_state

        state = tmp_path / "state.json"
        ok, res = call(host_state, {"state_path": str(state)})
        assert ok and res["in_sync"], res
        (tmp_path / "backups" / "20261206T220000Z-1a2b3c4d").mkdir(parents=True)
        ok, res = call(host_state, {"state_path": str(state)})
        assert ok and not res["in_sync"] and res["drifted"] == ["run record"], res
        assert f"the host's run record {state} is missing" in res["drift"][0]
        state.write_text(json.dumps({"run_id": "r1", "result": "upgraded", "version": 1}))
        ok, res = call(host_state, {"state_path": str(state)})
        assert ok and res["in_sync"] and res["last_run"]["run_id"] == "r1", res
