# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""wheel_plan: the module's documentation and spec agree; the action plugin writes nothing in check mode."""

from __future__ import annotations

import json
from unittest.mock import MagicMock

import pytest
import yaml
from ansible.module_utils.testing import patch_module_args
from module_harness import Fail

from ansible_collections.gpufleet.upgrade.plugins.action import wheel_plan as action
from ansible_collections.gpufleet.upgrade.plugins.modules import wheel_plan as module
from ansible_collections.gpufleet.upgrade.plugins.plugin_utils._wheels import PlanError

PROFILE = {"name": "lab", "python": {"version": "3.11"}, "wheels": {"indexes": [], "packages": [], "rules": {}}}


def fake_lock(name="six-1.17.0-py3-none-any.whl", sha="a" * 64):
    return {
        "profile": "lab",
        "python": "3.11",
        "platform": "x86_64-manylinux_2_36",
        "hash": "b" * 64,
        "hash12": "b" * 12,
        "venv_name": "lab-" + "b" * 12,
        "packages": [
            {
                "name": "six",
                "version": "1.17.0",
                "filename": name,
                "url": "u",
                "sha256": sha,
                "size": 1,
                "role": "profile",
            }
        ],
        "tools": [],
        "report": {},
    }


def test_documentation_matches_argument_spec():
    doc = yaml.safe_load(module.DOCUMENTATION)
    assert set(doc["options"]) == set(module.ARGUMENT_SPEC)
    for name, spec in module.ARGUMENT_SPEC.items():
        assert doc["options"][name]["type"] == spec["type"], name
        assert doc["options"][name].get("default") == spec.get("default"), name
    assert doc["attributes"]["check_mode"]["support"] == "full"


def test_module_refuses_to_run_on_a_host():
    with patch_module_args({}), pytest.raises(Fail) as info:
        module.main()
    assert "action plugin on the controller" in info.value.args[0]["msg"]


def make_action(args, check_mode=False, diff=False):
    task = MagicMock()
    task.args = args
    task.check_mode = check_mode
    task.diff = diff
    task.async_val = 0
    task.action = "gpufleet.upgrade.wheel_plan"
    plugin = action.ActionModule(task, MagicMock(), MagicMock(), MagicMock(), MagicMock(), MagicMock())
    plugin._templar.template = lambda value: value
    return plugin


@pytest.fixture
def planned(monkeypatch):
    calls = {}

    def make_lock(profile, target, fetcher, uv, tools, today, wheelhouse, cache_dir, reuse_wheelhouse):
        calls.update(target=target, wheelhouse=wheelhouse, today=today)
        return fake_lock()

    monkeypatch.setattr(action, "make_lock", make_lock)
    monkeypatch.setattr(action, "find_uv", lambda path: "/usr/bin/uv")
    monkeypatch.setattr(
        action, "fetch_wheelhouse", lambda f, lock, wh, profile=None: {"path": wh, "fetched": [], "reused": []}
    )
    return calls


def test_check_mode_returns_the_lock_and_writes_nothing(planned, tmp_path):
    plugin = make_action({"profile": PROFILE, "controller_dir": str(tmp_path)}, check_mode=True, diff=True)
    result = plugin.run(task_vars={"inventory_hostname": "h1"})
    assert not result.get("failed"), result
    assert result["lock"]["venv_name"] == "lab-bbbbbbbbbbbb"
    assert "ansible_facts" not in result  # a fact would shadow the variable the role sets (ansible-core 2.21)
    assert result["changed"] is True  # no lock file yet: applying would write one
    assert result["fetch"]["would_fetch"] == ["six-1.17.0-py3-none-any.whl"]
    assert planned["wheelhouse"] is None  # nothing fetched into the wheelhouse while planning
    assert list(tmp_path.iterdir()) == []
    assert "lab-bbbbbbbbbbbb" in result["diff"]["after"]


def test_apply_writes_lock_and_report_then_reports_no_change(planned, tmp_path):
    args = {"profile": PROFILE, "controller_dir": str(tmp_path), "platform": "aarch64-manylinux_2_28"}
    first = make_action(dict(args)).run(task_vars={})
    lock_path = tmp_path / "locks" / "lab-bbbbbbbbbbbb.json"
    assert first["changed"] is True and first["lock_path"] == str(lock_path)
    assert json.loads(lock_path.read_text())["hash"] == "b" * 64
    assert (tmp_path / "locks" / "lab-bbbbbbbbbbbb.txt").read_text().startswith("wheel plan for profile lab")
    assert planned["target"].platform == "aarch64-manylinux_2_28" and planned["target"].python_version == "3.11"
    assert planned["wheelhouse"] == str(tmp_path / "wheelhouse")
    second = make_action(dict(args)).run(task_vars={})
    assert second["changed"] is False


def test_profile_and_controller_dir_come_from_play_vars(planned, tmp_path):
    result = make_action({}).run(task_vars={"gpufleet_stack": PROFILE, "gpufleet_controller_dir": str(tmp_path)})
    assert not result.get("failed"), result
    assert (tmp_path / "locks").is_dir()


def test_missing_profile_names_the_host_and_the_fix(planned):
    result = make_action({}).run(task_vars={"inventory_hostname": "gpu-7"})
    assert result["failed"] and result["msg"].startswith("gpu-7: no profile; run role gpufleet.upgrade.stack")


def test_plan_error_becomes_a_failure_naming_host_and_profile(monkeypatch, tmp_path):
    def boom(*args, **kwargs):
        raise PlanError("no build of lab-sglang satisfies spec ==0.9.9")

    monkeypatch.setattr(action, "make_lock", boom)
    monkeypatch.setattr(action, "find_uv", lambda path: "/usr/bin/uv")
    result = make_action({"profile": PROFILE, "controller_dir": str(tmp_path)}).run(
        task_vars={"inventory_hostname": "h"}
    )
    assert result["failed"]
    assert result["msg"] == "h: wheel plan for profile 'lab' failed: no build of lab-sglang satisfies spec ==0.9.9"
    assert list(tmp_path.iterdir()) == []
