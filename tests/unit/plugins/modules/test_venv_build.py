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
import re
import shutil
import sys
from pathlib import Path

import pytest
from ansible.module_utils.testing import patch_module_args
from module_harness import Exit, Fail

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _venv_host
from ansible_collections.gpufleet.upgrade.plugins.modules import venv_build
from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _outcome

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
    # uv's own words, not its progress lines: the cause is in the message.
    assert "Hash mismatch" in result["error"] and "Hash mismatch" in result["msg"], result["msg"]
    assert result["msg"].endswith("fix: check the profile, the indexes or the fleet cache, then run again"), result
    assert (current / "keep").read_text() == "old stack\n"
    # The venv it began is removed in the same run, not left for the next build.
    assert result["removed"] == args["venv"] and not os.path.lexists(args["venv"]), result
    assert "no_space" not in result, result


# What uv 0.13 prints when the disk is full (seen on a full tmpfs): creating the venv, or starting the build's cache in
# the sync. The stand-in uv says it at that step (after creating the venv's folder, as uv had); every other call goes
# to the real uv.
FULL_DISK = {
    "venv": ("Failed to create virtual environment", "{venv}/bin/activate"),
    "pip": ("Failed to initialize cache at `{cache}`", "{cache}/.gitignore"),
}
FULL_DISK_UV = """#!{python}
import os, sys
if sys.argv[1:2] == [{step!r}]:
    os.makedirs({venv!r} + "/bin", exist_ok=True)
    print("Using CPython 3.12.3 interpreter at: /usr/bin/python3.12", file=sys.stderr)
    print("error: " + {error!r}, file=sys.stderr)
    print("  cause: failed to write to file `" + {path!r} + "`: No space left on device (os error 28)", file=sys.stderr)
    sys.exit(2)
os.execv({uv!r}, [{uv!r}] + sys.argv[1:])
"""


def full_disk_host(host, step, **changes):
    """Arguments whose tools venv holds a uv that finds the disk full at ``step`` (venv or pip)."""
    args = dict(params(host, **changes), host="gpu-a01")
    uv = host["tools"] / "bin" / "uv"
    uv.unlink()
    names = {"venv": args["venv"], "cache": os.path.join(args["serving_root"], ".uv-build-cache")}
    error, path = (text.format(**names) for text in FULL_DISK[step])
    script = FULL_DISK_UV.format(
        python=sys.executable, step=step, venv=args["venv"], error=error, path=path, uv=hosttests.UV
    )
    uv.write_text(script)
    uv.chmod(0o755)
    return args


def test_a_full_disk_names_the_mount_the_need_and_the_free_space_and_removes_the_partial_venv(host, tmp_path):
    current = tmp_path / "serving" / "venvs" / "old-1"
    current.mkdir(parents=True)
    (current / "keep").write_text("old stack\n")
    args = full_disk_host(host, "venv", current=str(current))
    args["wheels"] = [dict(args["wheels"][0], installed_size=3 << 30)]  # as the controller read it from the wheel
    ok, result = call(args)
    assert not ok and result["failed_step"] == "venv", result
    mount = result["no_space"]["mount"]
    assert os.path.ismount(mount) and (args["venv"] + "/").startswith(os.path.join(mount, "")), result["no_space"]
    assert result["no_space"]["seen"] == args["venv"] + "/bin/activate", result["no_space"]
    # The need is the disk gate's: the lock's installed size times 1.5; the free space is measured after the cleanup.
    assert re.fullmatch(
        rf"no space left on {re.escape(mount)} on gpu-a01: need 4\.50 GiB, free \d+\.\d\d GiB", result["error"]
    )
    assert (
        result["fix"]
        == f"free space on {mount} (old venvs, old toolkits, caches) or move gpufleet_serving_root to a larger disk"
    )
    assert result["msg"] == (
        f"the new venv {args['venv']} failed at step venv: {result['error']}; the partial venv was removed, current was"
        f" not switched, the old venv keeps serving; fix: {result['fix']}, then run again"
    )
    assert not os.path.lexists(args["venv"]) and result["removed"] == args["venv"], "the partial venv was left"
    assert (current / "keep").read_text() == "old stack\n"
    # The run's report and the console keep the whole message: the cause is never cut (a reason of lab length).
    failed = {
        "msg": f"safe-fi-18127-node2: {result['msg']}".replace(
            args["venv"], "/opt/gpufleet/serving/venvs/lab-cu130-0123456789ab"
        )
    }
    reason = _outcome.failure_reason("Fail when the new venv could not be built or did not pass its checks", failed)
    assert reason.endswith(failed["msg"]) and "no space left on" in reason, reason


def test_a_full_disk_in_the_sync_names_the_cache_uv_wrote_and_sizes_from_the_current_venv(host, tmp_path):
    # A lock without installed sizes: the need is the current venv's size times 1.5, as the disk gate sizes it.
    current = tmp_path / "serving" / "venvs" / "old-1"
    current.mkdir(parents=True)
    (current / "big").write_bytes(b"x" * (1 << 20))
    args = full_disk_host(host, "pip", current=str(current))
    ok, result = call(args)
    assert not ok and result["failed_step"] == "sync", result
    assert result["no_space"]["seen"] == args["serving_root"] + "/.uv-build-cache/.gitignore", result
    assert "need 0.00 GiB" in result["error"] and " on gpu-a01: " in result["error"], result["error"]
    assert not os.path.lexists(args["venv"]) and result["removed"] == args["venv"]


def test_where_a_full_disk_is_named_when_no_tool_names_a_path(tmp_path):
    spec = {"venv": str(tmp_path / "s" / "venvs" / "v"), "wheelhouse": str(tmp_path / "wh"), "tools_root": "/t"}
    fetch = _venv_host.full_disk(spec, "fetch", "http://c/wheels/a.whl: [Errno 28] No space left on device")
    assert fetch["seen"] == spec["wheelhouse"] and os.path.ismount(fetch["mount"]) and fetch["free_bytes"] >= 0
    assert _venv_host.full_disk(spec, "sync", "uv ... exited 2: error: Hash mismatch") is None
    assert _venv_host.full_disk(spec, "build", "OSError: [Errno 28] No space left on device: '/x/y'")["seen"] == "/x/y"
    assert _venv_host.cause("Resolved 3 packages\nPrepared 2\nerror: Failed to install\n  cause: boom\n") == (
        "error: Failed to install cause: boom"
    )


def test_the_argument_spec_refuses_a_call_without_the_lock(host):
    args = params(host)
    del args["mark"]
    ok, result = call(args)
    assert not ok and "mark" in result["msg"], result
