"""What runs against the profile: systemctl show parsed (_unit), the effective unit and the running main process
judged by the host model (_host_model.serving_items), on unit files, drop-ins and fake /proc trees in tmp_path."""

from __future__ import annotations

import os

import pytest

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _host_model as hm
from ansible_collections.gpufleet.upgrade.plugins.module_utils import _unit as un

UNIT = "gpufleet-serving.service"
PORT_ARGS = ["--host", "127.0.0.1", "--port", "30000", "--model-path", "/srv/models/m"]


def show_text(exec_argv, env_files, drop_ins=(), fragment="/etc/systemd/system/gpufleet-serving.service", **over):
    fields = {
        "MainPID": "123",
        "ControlGroup": "/system.slice/gpufleet-serving.service",
        "ActiveState": "active",
        "SubState": "running",
        "ExecStart": (
            f"{{ path={exec_argv[0]} ; argv[]={' '.join(exec_argv)} ; ignore_errors=no ; start_time=[n/a] ; "
            "stop_time=[n/a] ; pid=123 ; code=(null) ; status=0/0 }"
        ),
        "Environment": over.pop("environment", ""),
        "DropInPaths": " ".join(drop_ins),
        "FragmentPath": fragment,
        "NeedDaemonReload": "no",
    }
    fields.update(over)
    lines = [f"{k}={v}" for k, v in fields.items()]
    lines += [f"EnvironmentFiles={p} (ignore_errors=no)" for p in env_files]
    return "\n".join(lines) + "\n"


def test_parse_show_reads_what_systemd_runs():
    text = show_text(
        ["/opt/s/current/bin/python", "-m", "sglang.launch_server", *PORT_ARGS],
        ["/etc/gpufleet/gpufleet-serving.env", "/etc/extra.env"],
        drop_ins=["/etc/systemd/system/gpufleet-serving.service.d/override.conf"],
        environment='A=1 "B=two words"',
    )
    got = un.parse_show(text)
    assert got["main_pid"] == 123
    assert got["exec_start"] == ["/opt/s/current/bin/python", "-m", "sglang.launch_server", *PORT_ARGS]
    assert got["environment"] == {"A": "1", "B": "two words"}
    assert got["environment_files"] == ["/etc/gpufleet/gpufleet-serving.env", "/etc/extra.env"]
    assert got["drop_in_paths"] == ["/etc/systemd/system/gpufleet-serving.service.d/override.conf"]
    assert got["active_state"] == "active" and got["need_daemon_reload"] is False
    stopped = un.parse_show("MainPID=0\nActiveState=inactive\nExecStart=\nDropInPaths=\n")
    assert stopped["main_pid"] == 0 and stopped["exec_start"] is None and stopped["drop_in_paths"] == []


def test_parse_unit_text_follows_resets_continuations_and_escapes():
    text = (
        '[Unit]\nDescription=x\n[Service]\nEnvironment=CUDA_HOME=/usr/local/cuda-12.8 "X=a b"\n'
        "EnvironmentFile=\nEnvironmentFile=-/etc/other.env\nExecStart=\n"
        "ExecStart=/opt/s/current/bin/python -m sglang.launch_server \\\n  --port 31000 --x 50%% --y $$HOME\n"
    )
    got = un.parse_unit_text(text)
    assert got["environment"] == {"CUDA_HOME": "/usr/local/cuda-12.8", "X": "a b"}
    assert got["environment_files"] == ["/etc/other.env"]
    assert got["exec_start"] == [
        "/opt/s/current/bin/python",
        "-m",
        "sglang.launch_server",
        "--port",
        "31000",
        "--x",
        "50%",
        "--y",
        "$HOME",
    ]
    assert un.parse_unit_text("[Service]\nRestart=always\n") == {
        "exec_start": None,
        "environment": None,
        "environment_files": None,
    }


def test_argv_difference_names_the_option():
    want = ["/p", "-m", "s", "--port", "30000", "--mem-fraction-static", "0.85"]
    assert hm.argv_difference(["/p", "-m", "s", "--port", "31000", "--mem-fraction-static", "0.85"], want) == (
        "--port 31000, the other says --port 30000"
    )
    assert hm.argv_difference(["/p", "-m", "s", "--port", "30000"], want) == (
        "no --mem-fraction-static, the other says --mem-fraction-static 0.85"
    )
    assert hm.argv_difference(["/p", "-m", "s", "--port", "30000", "--mem-fraction-static", "0.85", "--x"], want) == (
        "--x, the other says no --x"
    )
    # A script run through its '#!' line: the kernel puts the interpreter before the script's path.
    assert hm.same_command(["/v/bin/python", "/opt/current/bin/sglang", "serve"], ["/opt/current/bin/sglang", "serve"])
    assert not hm.same_command(["/v/bin/python", "-m", "x"], ["/v/bin/python", "-m", "y"])


# --------------------------------------------------------------------------- a host on disk


@pytest.fixture
def host(tmp_path):
    """A serving host in tmp_path: two venvs, current, the unit and env files as rendered, a fake /proc."""
    base = tmp_path / "usr" / "bin" / "python3.12"
    base.parent.mkdir(parents=True)
    base.write_text("")
    base.chmod(0o755)
    venvs = {}
    for name in ("cu128-old", "cu130-new"):
        venv = tmp_path / "serving" / "venvs" / name
        (venv / "bin").mkdir(parents=True)
        (venv / "pyvenv.cfg").write_text("")
        os.symlink(base, venv / "bin" / "python")
        venvs[name] = venv
    current = tmp_path / "serving" / "current"
    os.symlink(venvs["cu130-new"], current)
    python = f"{current}/bin/python"
    argv = [python, "-m", "sglang.launch_server", *PORT_ARGS]
    env_path = str(tmp_path / "etc" / "gpufleet-serving.env")
    unit_path = str(tmp_path / "etc" / "systemd" / UNIT)
    unit_text = f"[Service]\nType=simple\nEnvironmentFile={env_path}\nExecStart={' '.join(argv)}\nRestart=on-failure\n"
    env_text = 'CUDA_HOME="/usr/local/cuda-13.0"\nCUDA_PATH="/usr/local/cuda-13.0"\n'
    os.makedirs(os.path.dirname(unit_path))
    with open(unit_path, "w") as handle:
        handle.write(unit_text)
    with open(env_path, "w") as handle:
        handle.write(env_text)
    proc = tmp_path / "proc"
    proc.mkdir()
    return {
        "tmp": tmp_path,
        "base": str(base),
        "venvs": venvs,
        "current": str(current),
        "argv": argv,
        "env_path": env_path,
        "unit_path": unit_path,
        "unit_text": unit_text,
        "env_text": env_text,
        "proc": proc,
    }


def start(host, pid, argv, environ, ppid=1):
    folder = host["proc"] / str(pid)
    folder.mkdir()
    (folder / "stat").write_text(f"{pid} (python3) S {ppid} 1 1 0\n")
    (folder / "cmdline").write_bytes(b"".join(a.encode() + b"\0" for a in argv))
    (folder / "environ").write_bytes(b"".join(f"{k}={v}".encode() + b"\0" for k, v in environ.items()))
    os.symlink(host["base"], folder / "exe")
    os.symlink("/", folder / "cwd")


RIGHT_ENV = {"CUDA_HOME": "/usr/local/cuda-13.0", "CUDA_PATH": "/usr/local/cuda-13.0", "HF_TOKEN": "secret"}


def judge(host, drop_ins=(), exec_argv=None, main_pid=123, unit=True, env_files=None, **show):
    """observe_serving over the fake host (systemctl answered as show_text with ``show``), then serving_items."""
    env_files = [host["env_path"], *(env_files or [])]
    text = show_text(
        exec_argv or host["argv"], env_files, drop_ins, fragment=host["unit_path"], MainPID=str(main_pid), **show
    )
    calls = []

    def run(argv):
        calls.append(argv)
        return 0, text, ""

    seen = hm.observe_serving(
        UNIT if unit else None,
        None if unit else main_pid,
        keys={"CUDA_HOME", "CUDA_PATH"},
        run=run,
        proc_root=str(host["proc"]),
        port=hm.argv_option(un.expected_exec(host["unit_text"]), "--port"),
    )
    if unit:
        assert calls and calls[0][:3] == ["systemctl", "show", UNIT]
    items = hm.serving_items(
        seen, host["unit_text"], host["env_text"], host["unit_path"], host["env_path"], host["current"]
    )
    return seen, {i["item"]: i for i in items}


def test_in_sync_the_server_and_its_workers_run_what_the_profile_says(host):
    start(host, 123, host["argv"], RIGHT_ENV)
    start(host, 124, ["sglang::scheduler_TP0"], RIGHT_ENV, ppid=123)
    start(host, 200, ["/usr/sbin/sshd"], {}, ppid=1)
    seen, items = judge(host)
    assert seen["tree"] == [123, 124]
    assert items["serving unit"]["ok"], items["serving unit"]
    assert items["serving process"]["ok"], items["serving process"]
    # Only the asked variables leave the host: the token is named, never copied.
    assert seen["process"]["environ"] == {"CUDA_HOME": "/usr/local/cuda-13.0", "CUDA_PATH": "/usr/local/cuda-13.0"}
    assert "HF_TOKEN" in seen["process"]["environ_names"]
    assert hm.repairs(list(items.values())) == {"restart": False, "refuse": []}


def test_a_drop_in_that_sets_an_environment_file_variable_is_named_and_refused(host):
    """Environment= loses to EnvironmentFile= (systemd.exec): only a drop-in that adds its own file wins."""
    dropin_dir = host["tmp"] / "etc" / "systemd" / f"{UNIT}.d"
    dropin_dir.mkdir()
    masked = dropin_dir / "10-env.conf"
    masked.write_text("[Service]\nEnvironment=CUDA_HOME=/usr/local/cuda-12.8\n")
    extra = host["tmp"] / "etc" / "old-cuda.env"
    extra.write_text("CUDA_HOME=/usr/local/cuda-12.8\n")
    override = dropin_dir / "override.conf"
    override.write_text(f"[Service]\nEnvironmentFile={extra}\n")
    start(host, 123, host["argv"], dict(RIGHT_ENV, CUDA_HOME="/usr/local/cuda-12.8"))
    _seen, items = judge(host, drop_ins=[str(masked), str(override)], env_files=[str(extra)])
    unit = items["serving unit"]
    assert unit["drift"] == [
        f"serving unit: drop-in {override} adds EnvironmentFile={extra}, which sets CUDA_HOME=/usr/local/cuda-12.8, "
        "the profile wants /usr/local/cuda-13.0"
    ]
    assert unit["repair"] == "refuse" and str(override) in unit["fix"] and "daemon-reload" in unit["fix"]
    # The process runs what the unit gives: no second line for the same cause.
    assert items["serving process"]["ok"], items["serving process"]
    assert hm.repairs(list(items.values()))["refuse"] == [unit["fix"]]


def test_a_drop_in_environment_of_a_variable_the_file_does_not_set_wins(host):
    dropin = host["tmp"] / "override.conf"
    dropin.write_text("[Service]\nEnvironment=CUDA_PATH=/usr/local/cuda-12.8\n")
    with open(host["env_path"], "w") as handle:
        handle.write('CUDA_HOME="/usr/local/cuda-13.0"\n')  # the file lost CUDA_PATH: its own item says so
    start(host, 123, host["argv"], dict(RIGHT_ENV, CUDA_PATH="/usr/local/cuda-12.8"))
    _seen, items = judge(host, drop_ins=[str(dropin)], environment="CUDA_PATH=/usr/local/cuda-12.8")
    assert items["serving unit"]["drift"] == [
        f"serving unit: drop-in {dropin} sets CUDA_PATH=/usr/local/cuda-12.8, the profile wants /usr/local/cuda-13.0"
    ]


def test_a_drop_in_that_replaces_execstart_is_named(host):
    dropin = host["tmp"] / "override.conf"
    argv = [*host["argv"][:-3], "31000", *host["argv"][-2:]]
    dropin.write_text(f"[Service]\nExecStart=\nExecStart={' '.join(argv)}\n")
    start(host, 123, argv, RIGHT_ENV)
    _seen, items = judge(host, drop_ins=[str(dropin)], exec_argv=argv)
    assert items["serving unit"]["drift"] == [
        f"serving unit: drop-in {dropin} replaces ExecStart: it runs --port 31000, the profile says --port 30000"
    ]
    assert items["serving unit"]["repair"] == "refuse"
    assert items["serving process"]["ok"]


def test_a_server_started_with_other_flags_than_its_unit_is_restarted(host):
    argv = [*host["argv"][:-3], "31000", *host["argv"][-2:]]
    start(host, 123, argv, RIGHT_ENV)
    _seen, items = judge(host)
    assert items["serving unit"]["ok"]
    assert items["serving process"]["drift"] == [
        "serving process: the running server (pid 123) was started with --port 31000, the unit says --port 30000: "
        "restart the unit"
    ]
    assert hm.repairs(list(items.values())) == {"restart": True, "refuse": []}


def test_a_server_that_runs_an_old_venv_or_environment_is_restarted(host):
    """Started before current was switched and the environment file rewritten, from the old venv's own path."""
    old = [f"{host['venvs']['cu128-old']}/bin/python", *host["argv"][1:]]
    start(host, 123, old, dict(RIGHT_ENV, CUDA_HOME="/usr/local/cuda-12.8"))
    _seen, items = judge(host)
    drift = items["serving process"]["drift"]
    assert drift[0].startswith("serving process: the running server (pid 123) was started with ")
    assert drift[1] == (
        f"serving process: the running server (pid 123) runs from {host['venvs']['cu128-old']}, not "
        f"{host['venvs']['cu130-new']}: restart the unit"
    )
    assert drift[2] == (
        "serving process: the running server (pid 123) runs with CUDA_HOME=/usr/local/cuda-12.8, the unit gives "
        "CUDA_HOME=/usr/local/cuda-13.0: restart the unit"
    )


def test_a_stopped_unit_is_drift_a_restart_repairs(host):
    seen, items = judge(host, main_pid=0, ActiveState="inactive", SubState="dead")
    assert seen["process"] is None and seen["tree"] == []
    assert "serving process" not in items
    assert items["serving unit"]["drift"] == ["serving unit: gpufleet-serving.service is inactive (dead), not serving"]
    assert hm.repairs(list(items.values())) == {"restart": True, "refuse": []}


def test_a_unit_loaded_from_elsewhere_is_refused(host):
    start(host, 123, host["argv"], RIGHT_ENV)
    seen_items = judge(host, FragmentPath="/run/systemd/transient/gpufleet-serving.service")[1]
    unit = seen_items["serving unit"]
    assert unit["drift"] == [
        "serving unit: systemd loads gpufleet-serving.service from /run/systemd/transient/gpufleet-serving.service, "
        f"which overrides {host['unit_path']}"
    ]
    assert unit["repair"] == "refuse"
    # A unit of the old stack's package (/lib/systemd/system) gives way to the collection's once it is written.
    packaged = judge(host, FragmentPath="/lib/systemd/system/gpufleet-serving.service")[1]["serving unit"]
    assert packaged["drift"] == [
        "serving unit: systemd loads gpufleet-serving.service from /lib/systemd/system/gpufleet-serving.service, "
        f"not {host['unit_path']}"
    ]
    assert packaged["repair"] == "restart"


def test_without_systemd_the_main_pid_is_judged_against_the_profile(host):
    start(host, 123, host["argv"], dict(RIGHT_ENV, CUDA_HOME="/usr/local/cuda-12.8"))
    seen, items = judge(host, unit=False)
    assert seen["unit"] is None and "serving unit" not in items
    assert items["serving process"]["drift"] == [
        "serving process: the running server (pid 123) runs with CUDA_HOME=/usr/local/cuda-12.8, the profile gives "
        "CUDA_HOME=/usr/local/cuda-13.0"
    ]
    _seen, gone = judge(host, unit=False, main_pid=999)
    assert gone["serving process"]["drift"] == ["serving process: no process 999 runs"]


def test_a_server_started_by_hand_on_the_unit_s_port_is_refused_with_its_pid(host):
    """The unit is stopped and a server someone started by hand, with other flags, holds its port."""
    argv = [*host["argv"], "--mem-fraction-static", "0.5"]
    start(host, 321, argv, RIGHT_ENV)
    (host["proc"] / "net").mkdir()
    (host["proc"] / "net" / "tcp").write_text(
        "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
        "   0: 0100007F:7530 00000000:0000 0A 00000000:00000000 00:00000000 00000000 0 0 4242 1\n"
    )
    (host["proc"] / "321" / "fd").mkdir()
    os.symlink("socket:[4242]", host["proc"] / "321" / "fd" / "5")
    seen, items = judge(host, main_pid=0, ActiveState="inactive", SubState="dead")
    assert seen["port"] == "30000" and seen["port_holder"]["pid"] == 321
    unit = items["serving unit"]
    assert unit["drift"] == [
        f"serving unit: gpufleet-serving.service is inactive, while pid 321 ({' '.join(argv)[:77]}...) serves its port "
        "30000"
    ]
    assert unit["repair"] == "refuse"
    assert unit["fix"].endswith(
        "; fix: stop pid 321 (the collection does not stop a process it did not start), run again"
    )


def test_a_file_edited_under_a_server_that_runs_the_profile_is_said_by_the_file_item_only(host):
    """The environment file now says CUDA_HOME 12.8, the unit was not restarted: the server runs what the profile
    wants. The file's own item names the edit; neither the unit nor the process item repeats it."""
    with open(host["env_path"], "w") as handle:
        handle.write('CUDA_HOME="/usr/local/cuda-12.8"\nCUDA_PATH="/usr/local/cuda-13.0"\n')
    start(host, 123, host["argv"], RIGHT_ENV)
    _seen, items = judge(host)
    assert items["serving unit"]["ok"] and items["serving process"]["ok"], items
    # Restarted on the edited file, the server runs what the unit gives: still the file's drift, said once.
    (host["proc"] / "123" / "environ").write_bytes(b"CUDA_HOME=/usr/local/cuda-12.8\0CUDA_PATH=/usr/local/cuda-13.0\0")
    _seen, items = judge(host)
    assert items["serving unit"]["ok"] and items["serving process"]["ok"], items
