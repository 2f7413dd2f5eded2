# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""_server: the serving unit's processes (systemctl's answers, fake and real process trees) and its environment
(systemd's EnvironmentFile syntax, a real process's /proc environ)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _server, _unit

# `systemctl show -p MainPID -p ControlGroup -p ActiveState -p LoadState sglang.service` on a Debian 12 lab node,
# in systemd's own order (not the order asked).
SHOW_ACTIVE = "MainPID=3700\nControlGroup=/system.slice/sglang.service\nLoadState=loaded\nActiveState=active\n"
SHOW_STOPPED = "MainPID=0\nControlGroup=\nLoadState=loaded\nActiveState=inactive\n"
SHOW_UNKNOWN = "MainPID=0\nControlGroup=\nLoadState=not-found\nActiveState=inactive\n"


def systemctl(answer, rc=0, err=""):
    calls = []

    def run(argv):
        calls.append(argv)
        return rc, answer, err

    return (lambda name: f"/usr/bin/{name}"), run, calls


def fake_tree(root, parents):
    for pid, ppid in parents.items():
        (root / str(pid)).mkdir(parents=True)
        (root / str(pid) / "stat").write_text(f"{pid} (python3) S {ppid} {pid} {pid} 0 -1 0\n")


def test_read_unit_takes_the_answer_in_systemds_order():
    which, run, calls = systemctl(SHOW_ACTIVE)
    assert _server.read_unit("sglang", which, run) == {
        "main_pid": 3700,
        "cgroup": "/system.slice/sglang.service",
        "active_state": "active",
    }
    assert calls[0][:3] == ["/usr/bin/systemctl", "show", "sglang.service"]
    which, run, _calls = systemctl(SHOW_STOPPED)
    assert _server.read_unit("sglang.service", which, run)["main_pid"] == 0


@pytest.mark.parametrize(
    ("which", "answer", "rc", "message"),
    [
        (lambda name: None, "", 0, "no systemctl"),
        (lambda name: "/bin/systemctl", SHOW_UNKNOWN, 0, "systemd knows no unit sglang.service"),
        (lambda name: "/bin/systemctl", "", 1, "exited 1: Failed to connect to bus"),
    ],
)
def test_a_unit_that_cannot_be_read_says_why(which, answer, rc, message):
    def run(argv):
        return rc, answer, "Failed to connect to bus" if rc else ""

    with pytest.raises(_server.ServerUnknown, match=message):
        _server.read_unit("sglang", which, run)


def test_server_pid_set_expands_the_main_pid_to_its_descendants(tmp_path):
    fake_tree(tmp_path, {1: 0, 3700: 1, 3703: 3700, 3704: 3700, 3710: 3703, 4242: 1})
    assert _server.server_pid_set(main_pid=3700, proc_root=str(tmp_path)) == {3700, 3703, 3704, 3710}
    assert _server.server_pid_set(server_pids=[12], main_pid=3703, proc_root=str(tmp_path)) == {12, 3703, 3710}
    assert _server.server_pid_set(main_pid=0, proc_root=str(tmp_path)) == set()
    assert _server.server_pid_set(proc_root=str(tmp_path)) is None


def test_resolve_reads_the_unit_and_an_explicit_main_pid_wins(tmp_path):
    fake_tree(tmp_path, {1: 0, 3700: 1, 3703: 3700, 5000: 1, 5001: 5000})
    which, run, calls = systemctl(SHOW_ACTIVE)
    got = _server.resolve({"server_unit": "sglang"}, which, run, proc_root=str(tmp_path), cgroup_root=str(tmp_path))
    assert got["pids"] == {3700, 3703} and got["main_pid"] == 3700 and got["source"] == "systemd (active)"
    assert got["cgroup"] == "/system.slice/sglang.service" and got["error"] is None
    got = _server.resolve({"server_unit": "sglang", "server_main_pid": 5000}, which, run, proc_root=str(tmp_path))
    assert got["pids"] == {5000, 5001} and got["source"] == "server_main_pid" and len(calls) == 1
    assert _server.server_fact(got)["pids"] == [5000, 5001]


def test_resolve_without_systemd_leaves_the_server_unknown_with_the_reason(tmp_path):
    got = _server.resolve({"server_unit": "sglang"}, lambda name: None, None, proc_root=str(tmp_path))
    assert got["pids"] is None and "no systemctl" in got["error"]
    assert _server.server_notes(got) == [f"{got['error']}; every compute process counts as foreign"]
    assert _server.resolve({}, lambda name: None, None)["pids"] is None


def test_resolve_with_a_real_process_tree():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        got = _server.resolve({"server_main_pid": os.getpid()}, lambda name: None, None)
    finally:
        child.kill()
        child.wait()
    assert {os.getpid(), child.pid} <= got["pids"] and 1 not in got["pids"]


# ------------------------------------------------------------------------------------------- the environment


def as_serving_template_writes(value):
    """roles/serving/templates/serving.env.j2: value | string | replace('\\', '\\\\') | replace('"', '\\"')."""
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


@pytest.mark.parametrize(
    "value",
    ["0", "", "/usr/local/cuda-13.0/bin:/usr/bin", 'say "hi"', "back\\slash", "a $HOME `x`", "  spaced  ", "x=y#z"],
)
def test_env_file_values_round_trip_through_the_serving_template(value):
    cuda = as_serving_template_writes("/usr/local/cuda-13.0")
    text = f"# comment\nCUDA_HOME={cuda}\nV={as_serving_template_writes(value)}\n"
    assert _unit.parse_env_file(text) == {"CUDA_HOME": "/usr/local/cuda-13.0", "V": value}


def test_env_file_syntax_as_systemd_reads_it():
    text = (
        "; a comment\n"
        "  # another\n"
        "BARE=  some value  \n"
        "SINGLE='a \\n $b'\n"
        'DOUBLE="keep \\q drop \\$"\n'
        "JOINED=one\\\n"
        "two\n"
        'MULTI="first\n'
        'second"\n'
        "not an assignment\n"
        "EMPTY=\n"
    )
    assert _unit.parse_env_file(text) == {
        "BARE": "some value",
        "SINGLE": "a \\n $b",
        "DOUBLE": "keep \\q drop $",
        "JOINED": "onetwo",
        "MULTI": "first\nsecond",
        "EMPTY": "",
    }


def started(env):
    """A real process with ``env``, once it runs (its environ is the exec's, not the fork's)."""
    code = "import sys, time; print('up', flush=True); time.sleep(30)"
    child = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline() == "up\n"
    return child


def test_the_running_servers_environment_is_taken_as_is():
    env = {"PATH": "/usr/bin:/bin", "FLASHINFER_DISABLE_JIT": "0", "ODD": "a=b c"}
    child = started(env)
    try:
        got, source = _server.serving_environment(child.pid, "/nonexistent.env", {"MODULE": "1"})
    finally:
        child.kill()
        child.wait()
    assert got == env  # nothing stripped, nothing of the module's own added
    assert source == {"kind": "process", "pid": child.pid, "path": f"/proc/{child.pid}/environ"}


def test_without_a_server_the_env_file_over_the_module_environment_and_why(tmp_path):
    env_file = tmp_path / "sglang.env"
    env_file.write_text('CUDA_HOME="/usr/local/cuda-13.0"\nPATH="/usr/local/cuda-13.0/bin:/usr/bin"\n')
    got, source = _server.serving_environment(0, str(env_file), {"PATH": "/bin", "HOME": "/root"})
    assert got == {"PATH": "/usr/local/cuda-13.0/bin:/usr/bin", "HOME": "/root", "CUDA_HOME": "/usr/local/cuda-13.0"}
    assert source == {
        "kind": "file",
        "path": str(env_file),
        "not_used": ["no server process runs (main pid unknown or 0)"],
    }
    got, source = _server.serving_environment(999999999, str(tmp_path / "absent.env"), {"HOME": "/root"})
    assert got == {"HOME": "/root"} and source["kind"] == "module"
    assert "/proc/999999999/environ could not be read" in source["not_used"][0]
    assert "absent.env could not be read" in source["not_used"][1]


def test_an_empty_environ_is_no_servers_environment(tmp_path):
    (tmp_path / "77").mkdir()
    (tmp_path / "77" / "environ").write_bytes(b"")
    got, source = _server.serving_environment(77, None, {"HOME": "/root"}, proc_root=str(tmp_path))
    assert got == {"HOME": "/root"} and source["kind"] == "module"
    assert source["not_used"] == [f"the server's environment {tmp_path}/77/environ is empty"]


def test_presence_flags_name_the_variable_its_value_and_the_reason():
    flags = _server.presence_flags({"FLASHINFER_DISABLE_JIT": "0", "CUDA_HOME": "/c"})
    assert [f["name"] for f in flags] == ["FLASHINFER_DISABLE_JIT"] and flags[0]["value"] == "0"
    message = _server.presence_flag_message(flags[0])
    assert message.startswith("FLASHINFER_DISABLE_JIT='0': flashinfer turns its JIT compiler off")
    assert "whatever its value" in message and "flashinfer/jit/core.py" in message
    assert _server.presence_flags({"CUDA_HOME": "/c"}) == []
