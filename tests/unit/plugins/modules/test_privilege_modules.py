# Copyright: (c) 2026, gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A user who cannot write is told so: privilege_info names the paths, upgrade_lock says permission, not a holder."""

from __future__ import annotations

import os

import pytest
from ansible.module_utils.testing import patch_module_args
from module_harness import Exit, Fail

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _state as st
from ansible_collections.gpufleet.upgrade.plugins.modules import privilege_info, upgrade_lock

HOLDER = {"pid": 11, "pid_start": "5", "controller": "ctl", "started": "t"}


def call(module, args, check=False):
    with patch_module_args(dict(args, _ansible_check_mode=check)), pytest.raises((Exit, Fail)) as info:
        module.main()
    return info.type is Exit, info.value.args[0]


def test_lock_that_cannot_be_written_says_permission_and_become_not_another_run(tmp_path, monkeypatch):
    def denied(*_a, **_k):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(st, "create_exclusive", denied)
    path = str(tmp_path / "gpufleet" / "upgrade.lock")
    ok, res = call(upgrade_lock, {"path": path, "run_id": "r1", "holder": HOLDER})
    assert not ok and res["verdict"] == "denied"
    assert f"the upgrade lock {path} cannot be written by user" in res["msg"]
    assert "Permission denied; no other run holds it. Fix: set ansible_become: true" in res["msg"]
    assert "Nothing was changed." in res["msg"] and "lock_break" not in res["msg"]


def test_privilege_info_names_what_cannot_be_written(tmp_path, monkeypatch):
    (tmp_path / "locked").mkdir()
    locked = str(tmp_path / "locked")
    monkeypatch.setattr(os, "access", lambda path, _mode: not path.startswith(locked))
    args = {
        "host": "n1",
        "become": False,
        "paths": {"state folder": locked + "/gpufleet", "serving root": str(tmp_path)},
    }
    ok, res = call(privilege_info, args, check=True)
    assert ok and not res["changed"]
    assert res["unwritable"] == [{"label": "state folder", "path": locked + "/gpufleet", "denied_at": locked}]
    assert res["msg"].startswith(f"n1: the run connects as user {res['user']} (uid {res['uid']}) without become")
    monkeypatch.setattr(os, "access", lambda _path, _mode: True)
    ok, res = call(privilege_info, args)
    assert ok and res["msg"] == "" and res["unwritable"] == []
