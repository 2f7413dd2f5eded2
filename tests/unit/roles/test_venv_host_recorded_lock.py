# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""_venv_host.py locate with the state path: the lock the last upgrade applied, as the audit without a lock file
reads it (the state file's record and the lock text the build wrote, which _lock_file.recorded_lock joins)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _lock
from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _lock_file as lf

SCRIPT = Path(__file__).resolve().parents[3] / "plugins" / "module_utils" / "_venv_host.py"
_spec = importlib.util.spec_from_file_location("venv_host", SCRIPT)
vh = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(vh)

HASH = "9" * 64
VENV = "lab-999999999999"
PACKAGES = [
    {"name": "lab-sgl-kernel", "version": "0.3.21+cu130", "sha256": "a" * 64},
    {"name": "six", "version": "1.17.0", "sha256": "b" * 64},
]


@pytest.fixture
def host(tmp_path):
    serving, state = tmp_path / "serving", tmp_path / "state.json"
    (serving / "locks").mkdir(parents=True)
    # The text the build writes (roles/venv_rebuild/tasks/build.yml: lock_requirements with the header, tools after).
    text = _lock.requirements_text(PACKAGES, header=f"{VENV}: lock {HASH}") + _lock.requirements_text(
        [{"name": "uv", "version": "0.13.8", "sha256": "c" * 64}], comment_prefix="# tool: "
    )
    (serving / "locks" / f"{VENV}.txt").write_text(text)
    record = {"venv_name": VENV, "hash": HASH, "profile": "lab", "file": "/c/locks/x.lock.yml"}
    state.write_text(json.dumps({"run_id": "r1", "result": "upgraded", "lock": record}))
    return serving, state


def test_locate_with_the_state_path_reads_the_recorded_lock_and_the_controller_takes_it(host):
    serving, state = host
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT.read_text(), "locate", str(serving), str(state)],
        capture_output=True,
        text=True,
        check=True,
    )
    found = json.loads(proc.stdout)
    assert found["recorded"]["lock"]["venv_name"] == VENV
    taken = lf.recorded_lock(found["recorded"], "lab")
    assert taken["hash"] == HASH and taken["venv_name"] == VENV
    assert taken["packages"] == [{"name": p["name"], "version": p["version"]} for p in PACKAGES]


def test_a_state_file_without_a_lock_or_missing_gives_no_record(host, tmp_path):
    serving, state = host
    state.write_text(json.dumps({"run_id": "r1", "result": "failed_preflight"}))
    assert vh.locate(str(serving), str(state))["recorded"]["lock"] is None
    # No state file and no current venv: nothing recorded.
    assert vh.locate(str(serving), str(tmp_path / "absent.json"))["recorded"]["lock"] is None
    assert "records no lock" in lf.recorded_lock(vh.locate(str(serving), str(state))["recorded"], "lab")["no_lock"]


def test_a_recorded_lock_whose_text_is_gone_is_named(host):
    serving, state = host
    (serving / "locks" / f"{VENV}.txt").unlink()
    recorded = vh.locate(str(serving), str(state))["recorded"]
    assert recorded["lock_text"] is None
    assert f"locks/{VENV}.txt, is missing" in lf.recorded_lock(recorded, "lab")["no_lock"]


def test_a_lost_state_file_falls_back_to_the_lock_of_the_verified_venv_current_points_at(host):
    serving, state = host
    state.unlink()
    # Without a current venv there is nothing the host still knows.
    assert vh.locate(str(serving), str(state))["recorded"]["lock"] is None
    venv = serving / "venvs" / VENV
    venv.mkdir(parents=True)
    (serving / "current").symlink_to(f"venvs/{VENV}")
    # A venv without the verified mark of that lock is no evidence either.
    assert vh.locate(str(serving), str(state))["recorded"]["lock"] is None
    (venv / vh.MARK).write_text(HASH + "\n")
    recorded = vh.locate(str(serving), str(state))["recorded"]
    assert recorded["state_missing"] and recorded["lock"] == {
        "venv_name": VENV,
        "hash": HASH,
        "profile": "lab",
        "from": "current",
    }
    taken = lf.recorded_lock(recorded, "lab")
    assert "no_lock" not in taken and taken["hash"] == HASH and "state file missing" in taken["source"]
    assert taken["packages"] == [{"name": p["name"], "version": p["version"]} for p in PACKAGES]
    # The mark of another lock: not this lock's venv.
    (venv / vh.MARK).write_text("8" * 64 + "\n")
    assert vh.locate(str(serving), str(state))["recorded"]["lock"] is None
