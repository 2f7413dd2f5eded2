"""_proc: the process tree and one process described, over fake /proc and cgroup trees built in tmp_path."""

from __future__ import annotations

import os

import pytest

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _proc


def add_process(proc, pid, ppid, comm="python3", cmdline=(), environ=None, exe=None, cwd=None):
    """A /proc/<pid> folder as the kernel shows it: stat, cmdline, environ and the exe and cwd links."""
    folder = proc / str(pid)
    folder.mkdir(parents=True)
    (folder / "stat").write_text(f"{pid} ({comm}) S {ppid} {pid} {pid} 0 -1 4194560 0 0 0 0\n")
    (folder / "cmdline").write_bytes(b"".join(arg.encode() + b"\0" for arg in cmdline))
    env = environ or {}
    (folder / "environ").write_bytes(b"".join(f"{k}={v}".encode() + b"\0" for k, v in env.items()))
    if exe is not None:
        os.symlink(exe, folder / "exe")
    if cwd is not None:
        os.symlink(cwd, folder / "cwd")
    return folder


@pytest.fixture
def proc(tmp_path):
    root = tmp_path / "proc"
    root.mkdir()
    return root


@pytest.fixture
def venv(tmp_path):
    """A uv-style venv whose bin/python is a link to a base interpreter, reached through a ``current`` link."""
    base = tmp_path / "usr" / "bin"
    base.mkdir(parents=True)
    (base / "python3.12").write_text("")
    (base / "python3.12").chmod(0o755)
    real = tmp_path / "srv" / "venvs" / "cu130-abc"
    (real / "bin").mkdir(parents=True)
    (real / "pyvenv.cfg").write_text(f"home = {base}\n")
    os.symlink(base / "python3.12", real / "bin" / "python")
    os.symlink(real, tmp_path / "srv" / "current")
    return {"real": real, "current": tmp_path / "srv" / "current", "base": base / "python3.12"}


def test_the_tree_holds_the_main_pid_and_every_descendant_only(proc):
    add_process(proc, 1, 0, comm="systemd")
    add_process(proc, 100, 1, comm="sglang launcher")
    add_process(proc, 101, 100, comm="sglang::scheduler_TP0")
    add_process(proc, 102, 100)
    add_process(proc, 103, 101, comm="a (weird) name")  # a grandchild whose name holds parentheses and spaces
    add_process(proc, 200, 1, comm="sshd")
    assert _proc.process_tree(100, proc_root=str(proc)) == {100, 101, 102, 103}
    assert _proc.process_tree(101, proc_root=str(proc)) == {101, 103}


def test_a_main_pid_that_is_gone_or_zero_gives_an_empty_tree(proc):
    add_process(proc, 1, 0)
    assert _proc.process_tree(4242, proc_root=str(proc)) == set()
    assert _proc.process_tree(0, proc_root=str(proc)) == set()
    assert _proc.process_tree(None, proc_root=str(proc)) == set()


def test_the_cgroup_adds_members_re_parented_away_and_their_children(proc, tmp_path):
    add_process(proc, 1, 0)
    add_process(proc, 100, 1)
    add_process(proc, 300, 1)  # left the launcher's tree (re-parented to init) but stays in the unit's cgroup
    add_process(proc, 301, 300)
    add_process(proc, 400, 1)
    cgroups = tmp_path / "cgroup"
    unit = cgroups / "system.slice" / "sglang.service"
    (unit / "sub").mkdir(parents=True)
    (unit / "cgroup.procs").write_text("100\n300\n")
    (unit / "sub" / "cgroup.procs").write_text("999\n")  # a member that exited since: not returned
    tree = _proc.process_tree(100, proc_root=str(proc), cgroup="/system.slice/sglang.service", cgroup_root=str(cgroups))
    assert tree == {100, 300, 301}
    assert _proc.process_tree(0, proc_root=str(proc), cgroup="/absent.slice", cgroup_root=str(cgroups)) == set()


def test_describe_finds_the_venv_from_the_started_path_not_the_resolved_exe(proc, venv):
    started = str(venv["current"] / "bin" / "python")
    # /proc/<pid>/exe is resolved by the kernel: it names the base interpreter, never the venv.
    add_process(
        proc,
        100,
        1,
        cmdline=[started, "-m", "sglang.launch_server", "--port", "30000"],
        environ={"CUDA_HOME": "/usr/local/cuda-13.0", "EMPTY": ""},
        exe=str(venv["base"]),
        cwd="/",
    )
    got = _proc.describe(100, proc_root=str(proc))
    assert got["exe"] == str(venv["base"])
    assert got["cmdline"] == [started, "-m", "sglang.launch_server", "--port", "30000"]
    assert got["environ"] == {"CUDA_HOME": "/usr/local/cuda-13.0", "EMPTY": ""}
    assert got["venv"] == str(venv["current"])
    assert got["venv_from"] == "argv0"
    assert got["venv_real"] == os.path.realpath(venv["real"])
    assert got["errors"] == {}


def test_describe_walks_up_from_an_exe_link_inside_a_venv(proc, venv):
    add_process(proc, 100, 1, cmdline=["python"], exe=str(venv["real"] / "bin" / "python"), cwd="/")
    got = _proc.describe(100, proc_root=str(proc))
    assert got["venv"] == str(venv["real"])
    assert got["venv_from"] == "exe"


def test_an_argv0_that_leads_elsewhere_is_not_trusted(proc, venv, tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "python").write_text("")
    add_process(proc, 100, 1, cmdline=[str(venv["current"] / "bin" / "python")], exe=str(other / "python"), cwd="/")
    got = _proc.describe(100, proc_root=str(proc))
    assert got["started_as"] == str(other / "python")
    assert got["venv"] is None


def test_a_relative_argv0_is_read_against_the_cwd_and_a_bare_name_against_path(proc, venv):
    add_process(proc, 100, 1, cmdline=["bin/python"], exe=str(venv["base"]), cwd=str(venv["current"]))
    assert _proc.describe(100, proc_root=str(proc))["venv"] == str(venv["current"])
    path = {"PATH": f"/nonexistent:{venv['current'] / 'bin'}"}
    add_process(proc, 101, 1, cmdline=["python"], environ=path, exe=str(venv["base"]), cwd="/")
    assert _proc.describe(101, proc_root=str(proc))["venv"] == str(venv["current"])


def test_a_deleted_executable_is_marked(proc, tmp_path):
    add_process(proc, 100, 1, cmdline=["/gone/venv/bin/python"], exe="/gone/venv/bin/python (deleted)", cwd="/")
    got = _proc.describe(100, proc_root=str(proc))
    assert got["exe"] == "/gone/venv/bin/python"
    assert got["exe_deleted"] is True
    assert got["venv"] is None


def test_a_missing_pid_and_unreadable_fields_are_values_not_crashes(proc):
    gone = _proc.describe(4242, proc_root=str(proc))
    assert gone["running"] is False
    assert "4242" in gone["errors"]["pid"]
    # A kernel thread, or a process of another user read without root: no exe link, no environ.
    folder = add_process(proc, 2, 0, comm="kthreadd")
    (folder / "environ").unlink()
    got = _proc.describe(2, proc_root=str(proc))
    assert got["running"] is True
    assert got["exe"] is None and got["environ"] is None and got["venv"] is None
    assert set(got["errors"]) == {"exe", "cwd", "environ"}
    assert got["cmdline"] == []


def test_a_stat_line_that_is_not_understood_is_left_out(proc):
    (proc / "7").mkdir()
    (proc / "7" / "stat").write_text("garbage")
    add_process(proc, 8, 7)
    assert _proc.stat_ppid(7, str(proc)) is None
    assert _proc.process_tree(7, proc_root=str(proc)) == {7, 8}


def test_the_mapped_site_packages_name_the_venv_run_even_after_current_moved(proc, venv, tmp_path):
    """current was switched to another venv after the server started: its mapped extensions say which it runs."""
    newer = tmp_path / "srv" / "venvs" / "cu130-new"
    (newer / "bin").mkdir(parents=True)
    (newer / "pyvenv.cfg").write_text("")
    os.symlink(venv["base"], newer / "bin" / "python")
    (tmp_path / "srv" / "current").unlink()
    os.symlink(newer, tmp_path / "srv" / "current")
    folder = add_process(
        proc, 100, 1, cmdline=[str(venv["current"] / "bin" / "python")], exe=str(venv["base"]), cwd="/"
    )
    so = f"{venv['real']}/lib/python3.12/site-packages/torch/lib/libtorch.so"
    (folder / "maps").write_text(
        "7f0000000000-7f0000001000 r-xp 00000000 fd:01 42  /usr/lib/x86_64-linux-gnu/libc.so.6\n"
        f"7f0000002000-7f0000003000 r-xp 00000000 fd:01 43  {so}\n"
    )
    got = _proc.describe(100, proc_root=str(proc))
    assert got["venv"] == str(venv["current"])
    assert got["venv_real"] == str(venv["real"])
    assert got["venv_from"] == "maps"


def test_mapped_venv_needs_a_venv_or_a_deleted_file(tmp_path):
    system = "7f00-7f01 r-xp 0 fd:01 1 /usr/local/lib/python3.12/site-packages/yaml/_yaml.so\n"
    assert _proc.mapped_venv(system) is None
    gone = "7f00-7f01 r-xp 0 fd:01 1 /srv/venvs/old/lib/python3.12/site-packages/x.so (deleted)\n"
    assert _proc.mapped_venv(gone) == "/srv/venvs/old"
    assert _proc.mapped_venv("7f00-7f01 rw-p 0 0:0 0 [heap]\n") is None


def test_listeners_name_the_processes_that_hold_a_port(proc):
    (proc / "net").mkdir()
    header = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
    (proc / "net" / "tcp").write_text(
        header
        # 127.0.0.1:30000 listening (inode 555), 127.0.0.1:30000 established (inode 556), :22 listening (inode 557)
        + "   0: 0100007F:7530 00000000:0000 0A 00000000:00000000 00:00000000 00000000 0 0 555 1\n"
        + "   1: 0100007F:7530 0100007F:9C40 01 00000000:00000000 00:00000000 00000000 0 0 556 1\n"
        + "   2: 00000000:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000 0 0 557 1\n"
    )
    (proc / "net" / "tcp6").write_text(
        header + "   0: 00000000000000000000000000000000:7531 00000000000000000000000000000000:0000 0A "
        "00000000:00000000 00:00000000 00000000 0 0 558 1\n"
    )
    for pid, socket in ((100, 555), (101, 556), (102, 557), (103, 558)):
        folder = add_process(proc, pid, 1)
        (folder / "fd").mkdir()
        os.symlink(f"socket:[{socket}]", folder / "fd" / "3")
        os.symlink("/dev/null", folder / "fd" / "0")
    assert _proc.listeners(30000, str(proc)) == [100]
    assert _proc.listeners(30001, str(proc)) == [103]
    assert _proc.listeners(22, str(proc)) == [102]
    assert _proc.listeners(9, str(proc)) == []
