# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""venv_build: the host side of role venv_rebuild's build as a module, against a real uv and a wheel made here.

The build's steps themselves are tested on the host code (tests/unit/roles/test_venv_host.py); these hold the module's
own contract: argument spec, check mode that changes nothing, the diff, and a failure that names the venv and the
step and leaves the current venv alone.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

import pytest
from ansible.module_utils.testing import patch_module_args
from module_harness import Exit, Fail

from ansible_collections.gpufleet.upgrade.plugins.modules import venv_build

_path = Path(__file__).resolve().parents[2] / "roles" / "test_venv_host.py"
_spec = importlib.util.spec_from_file_location("venv_host_tests", _path)
hosttests = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(hosttests)


@pytest.fixture
def host(tmp_path):
    """A serving root, a tools venv whose uv is this machine's, and the lock's one wheel pushed to the wheelhouse."""
    serving = tmp_path / "serving"
    tools = tmp_path / "tools"
    (tools / "bin").mkdir(parents=True)
    os.symlink(hosttests.UV, tools / "bin" / "uv")
    made = tmp_path / "made"
    made.mkdir()
    wheel = hosttests.make_wheel(made)
    wheelhouse = serving / "wheelhouse"
    wheelhouse.mkdir(parents=True)
    shutil.copy(wheel, wheelhouse / wheel.name)
    return {"serving": serving, "tools": tools, "wheelhouse": wheelhouse, "wheel": wheel}


def params(host, **changes):
    spec = hosttests.spec_for(host, host["wheel"], pull_base="")
    spec.pop("check")
    spec["current"] = ""
    spec.update(changes)
    return spec


def call(args, check=False, diff=False):
    args = dict(args, _ansible_check_mode=check, _ansible_diff=diff)
    with patch_module_args(args), pytest.raises((Exit, Fail)) as info:
        venv_build.main()
    return info.type is Exit, info.value.args[0]


def test_check_mode_reports_the_steps_and_writes_nothing(host):
    args = params(host)
    ok, result = call(args, check=True, diff=True)
    assert ok and result["changed"] and result["ok"], result
    assert result["steps"] == ["lock file", "venv", "sync", "verify", "mark"], result
    assert result["fetched"] == [], "a pushed wheel is never fetched"
    assert not Path(args["venv"]).exists() and not Path(args["lock_file"]).exists(), "check mode wrote on the host"
    assert result["diff"]["before"] == f"{args['venv']}: absent\n"
    assert result["diff"]["after"].startswith(f"{args['venv']}: verified for lock lockhash\n"), result["diff"]


def test_builds_verifies_and_marks_the_venv(host):
    args = params(host)
    ok, result = call(args, diff=True)
    assert ok and result["changed"] and result["ok"], result
    assert result["verify"]["ok"] and result["not_judged"] == {}, result
    assert set(result["seconds"]) >= {"venv", "sync", "verify", "mark"}, result
    assert (Path(args["venv"]) / ".gpufleet-verified").read_text() == "lockhash\n"
    assert "absent" in result["diff"]["before"] and "verified for lock lockhash" in result["diff"]["after"]


def test_a_failed_build_names_the_venv_and_step_and_leaves_current_alone(host, tmp_path):
    current = tmp_path / "serving" / "venvs" / "old-1"
    current.mkdir(parents=True)
    (current / "keep").write_text("old stack\n")
    args = params(host, current=str(current))
    args["wheels"] = [dict(args["wheels"][0], sha256="0" * 64)]
    args["lock_text"] = args["lock_text"].replace(hosttests.sha(host["wheel"]), "0" * 64)
    ok, result = call(args)
    assert not ok, result
    assert result["failed_step"] == "sync" and result["changed"], result
    assert args["venv"] in result["msg"] and "step sync" in result["msg"], result["msg"]
    assert (current / "keep").read_text() == "old stack\n"
    assert not (Path(args["venv"]) / ".gpufleet-verified").exists(), "a venv that failed was marked verified"


def test_the_argument_spec_refuses_a_call_without_the_lock(host):
    args = params(host)
    del args["mark"]
    ok, result = call(args)
    assert not ok and "mark" in result["msg"], result
