# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""serving_process_info on real processes of this machine: a server stand-in started from a venv (a link to the base
interpreter, as uv and venv make them) with a child, read through /proc; systemd answered by a recorded script."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import pytest
from ansible.module_utils.testing import patch_module_args
from module_harness import Exit, Fail

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _unit as un
from ansible_collections.gpufleet.upgrade.plugins.modules import serving_process_info

# A launcher that starts one worker, as SGLang's launcher starts its scheduler, and both wait.
LAUNCHER = (
    "import subprocess, sys, time; "
    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
    "print('up', flush=True); time.sleep(60)"
)


@pytest.fixture
def server(tmp_path):
    """A server started as the unit would start it: <root>/current/bin/python, CUDA_HOME from its environment."""
    venv = tmp_path / "venvs" / "cu130-abc"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    current = tmp_path / "current"
    os.symlink(venv, current)
    env = {"PATH": "/usr/bin:/bin", "CUDA_HOME": "/usr/local/cuda-13.0", "HF_TOKEN": "secret"}
    proc = subprocess.Popen(
        [str(current / "bin" / "python"), "-c", LAUNCHER, "--port", "30000"], env=env, stdout=subprocess.PIPE
    )
    assert proc.stdout.readline() == b"up\n"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not _children(proc.pid):
        time.sleep(0.05)
    yield {"pid": proc.pid, "venv": venv, "current": current, "tmp": tmp_path}
    for child in _children(proc.pid):
        os.kill(child, 9)
    proc.kill()
    proc.wait()


def _children(pid):
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as handle:
                    if int(handle.read().rpartition(")")[2].split()[1]) == pid:
                        out.append(int(name))
            except OSError:
                continue
    return out


def run(args):
    with patch_module_args(args), pytest.raises(Exit) as out:
        serving_process_info.main()
    return out.value.args[0]


def test_describes_the_main_process_its_venv_and_its_tree(server):
    result = run({"main_pid": server["pid"]})
    assert result["changed"] is False and result["running"] is True
    process = result["process"]
    assert process["venv"] == str(server["current"])
    assert process["venv_real"] == str(server["venv"])
    assert process["cmdline"][-2:] == ["--port", "30000"]
    # Values only for the asked variables; the token is named, not copied.
    assert process["environ"] == {"PATH": "/usr/bin:/bin", "CUDA_HOME": "/usr/local/cuda-13.0"}
    assert "HF_TOKEN" in process["environ_names"]
    assert result["tree"] == sorted([server["pid"], *_children(server["pid"])]) and len(result["tree"]) == 2
    assert "unit" not in result


def test_expectations_are_judged_and_fail_only_when_asked(server, tmp_path):
    other = tmp_path / "venvs" / "cu128-old"
    other.mkdir()
    expect = {"venv": [str(other)], "env": {"CUDA_HOME": "/usr/local/cuda-12.8"}}
    result = run({"main_pid": server["pid"], "expect": expect})
    pid = server["pid"]
    assert result["problems"] == [
        f"the running server (pid {pid}) runs from {server['venv']}, not {other}",
        f"the running server (pid {pid}) runs with CUDA_HOME=/usr/local/cuda-13.0, expect.env gives "
        "CUDA_HOME=/usr/local/cuda-12.8",
    ]
    good = run(
        {"main_pid": pid, "expect": {"venv": [str(server["current"])], "env": {"CUDA_HOME": "/usr/local/cuda-13.0"}}}
    )
    assert good["problems"] == []
    with patch_module_args({"main_pid": pid, "expect": expect, "fail_on_problems": True, "fix": "restart it"}):
        with pytest.raises(Fail) as err:
            serving_process_info.main()
    assert err.value.args[0]["msg"].endswith("; fix: restart it")
    assert f"runs from {server['venv']}" in err.value.args[0]["msg"]


def test_a_pid_that_runs_nothing_is_said(tmp_path):
    result = run({"main_pid": 2**22 + 7, "expect": {"env": {"CUDA_HOME": "/x"}}})
    assert result["running"] is False
    assert result["problems"] == [f"no process {2**22 + 7} runs"]


def test_the_unit_is_read_through_systemctl_show(server, tmp_path):
    unit_file = tmp_path / "gpufleet-serving.service"
    unit_file.write_text(f"[Service]\nExecStart={server['current']}/bin/python -c x\n")
    dropin = tmp_path / "override.conf"
    dropin.write_text("[Service]\nEnvironment=HF_TOKEN=other LD_LIBRARY_PATH=/opt/lib\n")
    systemctl = tmp_path / "systemctl"
    systemctl.write_text(
        "#!/bin/sh\n"
        '[ "$1 $2" = "show gpufleet-serving.service" ] || exit 4\n'
        f"printf '%s\\n' MainPID={server['pid']} ActiveState=active SubState=running "
        f"'ControlGroup=/system.slice/gpufleet-serving.service' 'FragmentPath={unit_file}' 'DropInPaths={dropin}' "
        "'Environment=HF_TOKEN=other LD_LIBRARY_PATH=/opt/lib' "
        f"'ExecStart={{ path={server['current']}/bin/python ; argv[]={server['current']}/bin/python -c x ; "
        "ignore_errors=no ; start_time=[n/a] ; stop_time=[n/a] ; pid=0 ; code=(null) ; status=0/0 }'\n"
    )
    systemctl.chmod(0o755)
    result = run({"unit": "gpufleet-serving", "systemctl": str(systemctl)})
    assert result["main_pid"] == server["pid"]
    assert result["unit"]["exec_start"] == [f"{server['current']}/bin/python", "-c", "x"]
    assert result["unit"]["environment"] == {"LD_LIBRARY_PATH": "/opt/lib"}
    assert result["unit"]["environment_names"] == ["HF_TOKEN", "LD_LIBRARY_PATH"]
    assert [s["kind"] for s in result["sources"]] == ["unit", "drop-in"]
    assert result["sources"][1]["settings"]["environment"] == {"LD_LIBRARY_PATH": "/opt/lib"}
    with patch_module_args({"unit": "other", "systemctl": str(systemctl)}), pytest.raises(Fail) as err:
        serving_process_info.main()
    assert "systemctl show other.service failed (rc 4)" in err.value.args[0]["msg"]
    assert "give main_pid" in err.value.args[0]["msg"]


def test_unit_and_main_pid_are_exclusive():
    with patch_module_args({"unit": "a", "main_pid": 1}), pytest.raises(Fail) as err:
        serving_process_info.main()
    assert "mutually exclusive" in err.value.args[0]["msg"]


# --------------------------------------------------------------------------- host_state: the same code in the model


def host_state_args(server, cuda_home="/usr/local/cuda-13.0", port="30000", **serving):
    unit_path, env_path = str(server["tmp"] / "s.service"), str(server["tmp"] / "s.env")
    argv = f"{server['current']}/bin/python -c {LAUNCHER!r} --port {port}"
    files = [
        {"label": "s.service", "path": unit_path, "content": f"[Service]\nExecStart={argv}\n", "kind": "text"},
        {"label": "s.env", "path": env_path, "content": f'CUDA_HOME="{cuda_home}"\n', "kind": "env"},
    ]
    for f in files:
        with open(f["path"], "w") as handle:
            handle.write(f["content"])
    spec = dict({"main_pid": server["pid"], "unit_path": unit_path, "env_path": env_path}, **serving)
    return {"files": files, "serving": dict(spec, venv_link=str(server["current"])), "fact": "assess_result"}


def host_state(args):
    from ansible_collections.gpufleet.upgrade.plugins.modules import host_state as module

    with patch_module_args(args), pytest.raises(Exit) as out:
        module.main()
    return out.value.args[0]


def test_host_state_judges_the_running_server_against_the_profile(server):
    result = host_state(host_state_args(server))
    assert result["in_sync"], result["drift"]
    process = next(i for i in result["items"] if i["item"] == "serving process")
    assert process["observed"]["tree"] == sorted([server["pid"], *_children(server["pid"])])
    assert result["repair"] == {"restart": False, "refuse": []}

    drifted = host_state(host_state_args(server, cuda_home="/usr/local/cuda-12.8", port="31000"))
    pid = server["pid"]
    assert drifted["drift"] == [
        f"serving process: the running server (pid {pid}) was started with --port 30000, the profile says --port 31000",
        f"serving process: the running server (pid {pid}) runs with CUDA_HOME=/usr/local/cuda-13.0, the profile gives "
        "CUDA_HOME=/usr/local/cuda-12.8",
    ]
    assert drifted["ansible_facts"]["assess_result"]["drifted"] == ["serving process"]


def test_host_state_names_a_drop_in_and_refuses_it(server, monkeypatch, tmp_path):
    from ansible.module_utils import basic

    args = host_state_args(server)
    unit_path, env_path = args["serving"]["unit_path"], args["serving"]["env_path"]
    dropin = tmp_path / "override.conf"
    dropin.write_text(f"[Service]\nEnvironmentFile={tmp_path / 'old.env'}\n")
    (tmp_path / "old.env").write_text("CUDA_HOME=/usr/local/cuda-12.8\n")
    # systemctl prints the argv joined by spaces, unquoted.
    argv = " ".join(un.parse_unit_text(args["files"][0]["content"])["exec_start"])
    shown = "\n".join(
        [
            f"MainPID={server['pid']}",
            "ActiveState=active",
            "SubState=running",
            f"FragmentPath={unit_path}",
            f"DropInPaths={dropin}",
            f"EnvironmentFiles={env_path} (ignore_errors=no)",
            f"EnvironmentFiles={tmp_path / 'old.env'} (ignore_errors=no)",
            f"ExecStart={{ path=x ; argv[]={argv} ; ignore_errors=no }}",
        ]
    )
    seen = []
    monkeypatch.setattr(basic.AnsibleModule, "run_command", lambda self, cmd, **kw: seen.append(cmd) or (0, shown, ""))
    del args["serving"]["main_pid"]
    args["serving"]["unit"] = "gpufleet-serving"
    result = host_state(args)
    assert seen[0][:3] == ["systemctl", "show", "gpufleet-serving.service"]
    assert result["drift"] == [
        f"serving unit: drop-in {dropin} adds EnvironmentFile={tmp_path / 'old.env'}, which sets "
        "CUDA_HOME=/usr/local/cuda-12.8, the profile wants /usr/local/cuda-13.0",
    ]
    # The server still runs what the profile wants (it started before the drop-in): said once, by the unit's item.
    assert result["repair"]["restart"] is False
    assert len(result["repair"]["refuse"]) == 1 and str(dropin) in result["repair"]["refuse"][0]


def test_a_server_left_running_after_current_moved_is_found_in_the_venv_it_maps(tmp_path):
    """A real process maps a compiled extension from its venv's site-packages (as SGLang maps torch's): after current
    was switched to another venv, the venv it runs from is still named, and the check says it is not current's."""
    import markupsafe

    venvs = {}
    for name in ("old", "new"):
        venvs[name] = tmp_path / "venvs" / name
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venvs[name])], check=True)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    site = venvs["old"] / "lib" / version / "site-packages"
    shutil.copytree(os.path.dirname(markupsafe.__file__), site / "markupsafe")
    current = tmp_path / "current"
    os.symlink(venvs["old"], current)
    code = "import markupsafe._speedups, time; print('up', flush=True); time.sleep(60)"
    proc = subprocess.Popen([str(current / "bin" / "python"), "-c", code], stdout=subprocess.PIPE, env={})
    try:
        assert proc.stdout.readline() == b"up\n"
        current.unlink()
        os.symlink(venvs["new"], current)
        result = run({"main_pid": proc.pid, "expect": {"venv": [str(current)]}})
        assert result["process"]["venv"] == str(current)
        assert result["process"]["venv_real"] == str(venvs["old"]) and result["process"]["venv_from"] == "maps"
        assert result["problems"] == [
            f"the running server (pid {proc.pid}) runs from {venvs['old']}, not {venvs['new']}"
        ]
    finally:
        proc.kill()
        proc.wait()


def test_host_state_gives_the_server_s_tree_to_the_gpu_judgement(server, monkeypatch):
    from ansible_collections.gpufleet.upgrade.plugins.module_utils import _nvml

    seen = {}

    def host_health(loader, required, thresholds, expected, server_pids=None):
        seen["server_pids"] = server_pids
        return {"status": "healthy", "reasons": []}, {}

    monkeypatch.setattr(_nvml, "host_health", host_health)
    args = dict(host_state_args(server), gpu_health={"required": False})
    result = host_state(args)
    assert seen["server_pids"] == {server["pid"], *_children(server["pid"])} and len(seen["server_pids"]) == 2
    assert result["in_sync"], result["drift"]
    # Without the serving option nobody says which processes are the server's.
    host_state({"gpu_health": {"required": False}})
    assert seen["server_pids"] is None
