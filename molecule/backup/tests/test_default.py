# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""After converge and idempotence: one backup of the seeded old stack whose manifest's checksums are the files' own,
holding the unit, its environment and the venv archive, with a verified copy of the manifest on the controller."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

BACKUPS = "/var/lib/gpufleet/backups"
SEED_VENV = "/opt/gpufleet/serving/venvs/lab-cu128-seed"


@pytest.fixture(scope="module")
def backup(host):
    ids = host.check_output(f"ls -1 {BACKUPS}").split()
    # The second converge (idempotence) found the host unchanged and reused the backup: still one.
    assert len(ids) == 1, ids
    path = f"{BACKUPS}/{ids[0]}"
    return ids[0], path, json.loads(host.file(f"{path}/manifest.json").content_string)


def test_manifest_sum_is_the_manifest_s_own(host, backup):
    _bid, path, _manifest = backup
    recorded = host.file(f"{path}/manifest.json.sha256").content_string.split()[0]
    assert host.file(f"{path}/manifest.json").sha256sum == recorded


def test_every_file_of_the_backup_has_the_manifest_s_checksum(host, backup):
    _bid, path, manifest = backup
    listed = host.check_output(f"cd {path} && find . -type f ! -name 'manifest.json*' -printf '%P\\n'").split()
    assert sorted(listed) == sorted(manifest["checksums"])
    for rel, digest in manifest["checksums"].items():
        assert host.file(f"{path}/{rel}").sha256sum == digest, rel


def test_unit_and_environment_are_copies_of_the_host_s(host, backup):
    _bid, path, manifest = backup
    files = {f["path"]: f for f in manifest["snapshot"]["files"]}
    for live in ("/etc/systemd/system/gpufleet-serving.service", "/etc/gpufleet/gpufleet-serving.env"):
        record = files[live]
        assert record["state"] == "file"
        assert record["sha256"] == host.file(live).sha256sum
        assert host.file(f"{path}/{record['backup']}").sha256sum == record["sha256"]


def test_manifest_describes_the_seeded_old_stack(host, backup):
    bid, _path, manifest = backup
    assert manifest["id"] == bid and manifest["host"]["name"] == "molecule-backup"
    assert manifest["profile"] == "lab" and manifest["run_id"] == "molecule-backup"
    snap = manifest["snapshot"]
    assert snap["venv"]["path"] == SEED_VENV
    assert snap["cuda"]["target"] == "/usr/local/cuda-12.8"


def test_venv_lock_is_the_venv_s_package_list(host, backup):
    _bid, path, _manifest = backup
    lock = host.file(f"{path}/venv.lock").content_string.splitlines()
    freeze = host.check_output(f"{SEED_VENV}/bin/python -m pip freeze --all").splitlines()
    assert sorted(lock) == sorted(freeze)
    assert "lab-torch==2.9.1+cu128" in lock


def test_venv_archive_holds_the_venv(host, backup):
    _bid, path, _manifest = backup
    members = host.check_output(f"tar -tzf {path}/venv.tar.gz").splitlines()
    assert "lab-cu128-seed/bin/python" in members
    assert any(m.startswith("lab-cu128-seed/lib/python3.11/site-packages/lab_torch/") for m in members)


def test_controller_copy_matches_the_host(host, backup):
    bid, path, _manifest = backup
    local = Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"]) / "controller" / "backups" / "molecule-backup" / bid
    for name in ("manifest.json", "manifest.json.sha256", "venv.lock"):
        assert hashlib.sha256((local / name).read_bytes()).hexdigest() == host.file(f"{path}/{name}").sha256sum


def test_check_mode_reports_no_change(check_run):
    assert check_run.stats["molecule-backup"]["changed"] == 0, [t.task for t in check_run.changed_tasks()]
    assert check_run.task("Publish the backup").res["ansible_facts"]["backup_reused"] is True
