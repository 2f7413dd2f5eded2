# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What runs: a process tree and one process described from /proc, pure functions (host side).

Every function takes the /proc root (and the cgroup root) as an argument, so a unit test builds a fake tree
in a temporary folder. Nothing here raises for a process that is gone or unreadable: a pid that vanished is
left out of a tree, and ``describe`` returns each field it could not read as None with the reason in
``errors``.

The venv an interpreter lives in is found from the path it was started by, not from where that path leads:
a venv's ``bin/python`` is a link to the base interpreter, and ``/proc/<pid>/exe`` is already resolved by the
kernel (it names ``/usr/bin/python3.12``, not the venv). So the started path (``argv[0]``, which systemd
requires to be absolute) is walked up, without resolving links, to the folder that holds ``pyvenv.cfg``;
``argv[0]`` is trusted only when it leads to the same file as ``exe`` (a process may set its own argv[0]).
A path through a link (``current``) says where the link points now, not where it pointed when the process
started: the venv whose site-packages the process has mapped (its compiled extensions, /proc/<pid>/maps, resolved
when they were loaded) is the one it runs from, so that one is ``venv_real`` when there is one.
"""

from __future__ import annotations

import os

DELETED = " (deleted)"


# --------------------------------------------------------------------------- the tree


def _pid_dirs(proc_root) -> list:
    try:
        names = os.listdir(proc_root)
    except OSError:
        return []
    return [int(name) for name in names if name.isdigit()]


def stat_fields(pid, proc_root="/proc"):
    """The fields of /proc/<pid>/stat after the command name (state, ppid, ...); None when the process is gone."""
    try:
        with open(os.path.join(proc_root, str(pid), "stat"), encoding="utf-8", errors="replace") as handle:
            line = handle.read()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may itself hold spaces and parentheses: split after the
    # last ')'.
    return line.rpartition(")")[2].split()


def stat_ppid(pid, proc_root="/proc"):
    """The parent pid from /proc/<pid>/stat; None when the process is gone or the line is not understood."""
    fields = stat_fields(pid, proc_root) or []
    try:
        return int(fields[1])
    except (IndexError, ValueError):
        return None


def children_map(proc_root="/proc") -> dict:
    """{ppid: [pid, ...]} over every process in /proc (a process that vanished while read is left out)."""
    out = {}
    for pid in _pid_dirs(proc_root):
        ppid = stat_ppid(pid, proc_root)
        if ppid is not None:
            out.setdefault(ppid, []).append(pid)
    return out


def cgroup_members(cgroup, cgroup_root="/sys/fs/cgroup") -> set:
    """The pids of a cgroup and of every cgroup below it: a unit's ``ControlGroup`` (/system.slice/x.service).

    Under cgroup v2 the path is below the root; under v1 (hybrid) systemd keeps its tree under ``unified`` or
    ``systemd``: the first of those that holds the path is read.
    """
    rel = str(cgroup).lstrip("/")
    bases = [os.path.join(cgroup_root, sub, rel) for sub in ("", "unified", "systemd")]
    base = next((b for b in bases if os.path.isdir(b)), None)
    pids = set()
    for folder, _dirs, files in os.walk(base) if base else ():
        if "cgroup.procs" not in files:
            continue
        try:
            with open(os.path.join(folder, "cgroup.procs"), encoding="ascii", errors="replace") as handle:
                pids.update(int(word) for word in handle.read().split() if word.isdigit())
        except OSError:
            continue
    return pids


def process_tree(main_pid, proc_root="/proc", cgroup=None, cgroup_root="/sys/fs/cgroup") -> set:
    """The main pid and every descendant that runs now, plus the members of ``cgroup`` (and theirs) when given.

    A server's scheduler and workers are children (or grandchildren) of its launcher; a unit's cgroup also holds
    a process that was re-parented away from it. A main pid of 0 or None (a unit that is not running) contributes
    nothing; a pid that is not in /proc is not returned.
    """
    alive = set(_pid_dirs(proc_root))
    roots = set()
    if main_pid and int(main_pid) in alive:
        roots.add(int(main_pid))
    if cgroup:
        roots.update(pid for pid in cgroup_members(cgroup, cgroup_root) if pid in alive)
    if not roots:
        return set()
    kids = children_map(proc_root)
    tree, todo = set(), list(roots)
    while todo:
        pid = todo.pop()
        if pid in tree:
            continue
        tree.add(pid)
        todo.extend(kids.get(pid, ()))
    return tree


# --------------------------------------------------------------------------- who holds a port

TCP_LISTEN = "0A"


def listening_inodes(port, proc_root="/proc") -> set:
    """Socket inodes listening on TCP ``port`` (IPv4 and IPv6), from /proc/net/tcp and tcp6."""
    inodes = set()
    for name in ("tcp", "tcp6"):
        try:
            with open(os.path.join(proc_root, "net", name), encoding="ascii", errors="replace") as handle:
                lines = handle.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            # sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
            if len(fields) < 10 or fields[3] != TCP_LISTEN:
                continue
            local_port = fields[1].rpartition(":")[2]
            if local_port and int(local_port, 16) == int(port):
                inodes.add(fields[9])
    inodes.discard("0")
    return inodes


def listeners(port, proc_root="/proc") -> list:
    """The pids whose open sockets listen on TCP ``port`` (sorted); a process whose fds cannot be read is left out."""
    inodes = {f"socket:[{inode}]" for inode in listening_inodes(port, proc_root)}
    if not inodes:
        return []
    found = []
    for pid in _pid_dirs(proc_root):
        fd_dir = os.path.join(proc_root, str(pid), "fd")
        try:
            names = os.listdir(fd_dir)
        except OSError:
            continue
        for name in names:
            try:
                if os.readlink(os.path.join(fd_dir, name)) in inodes:
                    found.append(pid)
                    break
            except OSError:
                continue
    return sorted(found)


# --------------------------------------------------------------------------- one process


def _read(path):
    with open(path, "rb") as handle:
        return handle.read()


def _nul_split(raw) -> list:
    return [part.decode("utf-8", "surrogateescape") for part in raw.split(b"\0") if part]


def parse_environ(raw) -> dict:
    """/proc/<pid>/environ (NUL separated NAME=value) as a dict; an entry without '=' is kept with value ''."""
    env = {}
    for entry in _nul_split(raw):
        name, _sep, value = entry.partition("=")
        env[name] = value
    return env


def find_venv(path):
    """The folder above ``path`` holding pyvenv.cfg, walking up without resolving links; None when there is none."""
    if not path or not os.path.isabs(path):
        return None
    folder = os.path.dirname(os.path.normpath(path))
    while True:
        if os.path.isfile(os.path.join(folder, "pyvenv.cfg")):
            return folder
        parent = os.path.dirname(folder)
        if parent == folder:
            return None
        folder = parent


def _which(name, env, cwd):
    """Where ``name`` (argv[0]) leads: absolute as is, relative to the process's cwd, a bare name on its PATH."""
    if os.path.isabs(name):
        return name
    if "/" in name:
        return os.path.normpath(os.path.join(cwd, name)) if cwd else None
    for folder in (env or {}).get("PATH", "").split(os.pathsep):
        candidate = os.path.join(folder, name)
        if folder and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def _same_file(left, right) -> bool:
    try:
        return os.path.samefile(left, right)
    except OSError:
        return False


def started_path(cmdline, exe, env, cwd):
    """The path the interpreter was started by when argv[0] leads to the running executable, else ``exe``.

    Returns (path, source) with source ``argv0`` or ``exe``; (None, None) when neither is known.
    """
    if cmdline and exe:
        candidate = _which(cmdline[0], env, cwd)
        if candidate and _same_file(candidate, exe):
            return candidate, "argv0"
    if exe:
        return exe, "exe"
    return None, None


def mapped_venv(maps_text):
    """The venv of the first file mapped from a ``<venv>/lib*/pythonX.Y/site-packages/`` folder, from the text of
    /proc/<pid>/maps; None when the process maps nothing from a site-packages folder."""
    for line in (maps_text or "").splitlines():
        fields = line.split(None, 5)
        path = fields[5] if len(fields) == 6 else ""
        marker = path.find("/site-packages/")
        if not path.startswith("/") or marker < 0:
            continue
        # <venv>/lib/python3.12/site-packages/... : two folders above site-packages
        lib = os.path.dirname(path[:marker])
        venv = os.path.dirname(lib)
        if os.path.basename(lib) not in ("lib", "lib64"):
            continue
        # A system interpreter's site-packages (/usr/local/lib/python3.12/site-packages) is no venv.
        if path.endswith(DELETED) or os.path.isfile(os.path.join(venv, "pyvenv.cfg")):
            return venv
    return None


def describe(pid, proc_root="/proc") -> dict:
    """What process ``pid`` is: its executable, command line, environment, working folder and the venv it runs from.

    Returns ``{pid, running, exe, exe_deleted, cmdline, environ, cwd, started_as, venv, venv_from, venv_real,
    errors}``: ``venv`` is the venv as started (through its links), ``venv_real`` the folder it runs from
    (``venv_from``: ``maps``, ``argv0`` or ``exe``); a field that could not be read is None and ``errors`` holds
    ``{field: reason}`` (reading another user's environment needs root).
    """
    base = os.path.join(proc_root, str(pid))
    out = {
        "pid": int(pid),
        "running": os.path.isdir(base),
        "exe": None,
        "exe_deleted": False,
        "cmdline": None,
        "environ": None,
        "cwd": None,
        "started_as": None,
        "venv": None,
        "venv_from": None,
        "venv_real": None,
        "errors": {},
    }
    if not out["running"]:
        out["errors"]["pid"] = f"no process {pid} runs ({base} is absent)"
        return out
    for field, read in (
        ("exe", lambda: os.readlink(os.path.join(base, "exe"))),
        ("cwd", lambda: os.readlink(os.path.join(base, "cwd"))),
        ("cmdline", lambda: _nul_split(_read(os.path.join(base, "cmdline")))),
        ("environ", lambda: parse_environ(_read(os.path.join(base, "environ")))),
    ):
        try:
            out[field] = read()
        except OSError as exc:
            out["errors"][field] = f"{exc.strerror or exc} ({os.path.join(base, field)})"
    # The kernel marks an executable whose file was removed (a venv deleted under a server that still runs).
    if out["exe"] and out["exe"].endswith(DELETED):
        out["exe"] = out["exe"][: -len(DELETED)]
        out["exe_deleted"] = True
    path, source = started_path(out["cmdline"], out["exe"], out["environ"], out["cwd"])
    out["started_as"] = path
    venv = find_venv(path)
    if venv:
        out["venv"], out["venv_from"], out["venv_real"] = venv, source, os.path.realpath(venv)
    try:
        mapped = mapped_venv(_read(os.path.join(base, "maps")).decode("utf-8", "surrogateescape"))
    except OSError:
        mapped = None
    if mapped:
        # A deleted venv's files are still mapped, named with " (deleted)": the folder names stay readable.
        out["venv_real"], out["venv_from"] = mapped, "maps"
        out["venv"] = out["venv"] or mapped
    return out
