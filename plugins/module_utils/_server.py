# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The serving unit as the post-check sees it: which processes are the server's, and the environment it runs with.

Host side, pure functions: systemd and /proc are reached through callables and folder arguments, so unit tests
drive them with recorded answers and fake trees. Shared by nvml_info (the server's GPU processes are expected, any
other is foreign) and gpu_smoke_test (the smoke test runs with the server's environment and reports the memory the
server holds), and by the profile check on the controller (PRESENCE_FLAGS).
"""

from __future__ import annotations

import os

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _proc, _unit

# Options naming the serving unit, shared by the modules that look at its processes (nvml_info, gpu_smoke_test).
SERVER_SPEC = {
    "server_unit": {"type": "str"},
    "server_main_pid": {"type": "int"},
    "server_cgroup": {"type": "str"},
    "server_pids": {"type": "list", "elements": "int"},
}

# Variables that change a program's behaviour by their mere presence: whatever their value ("0" and "false"
# included), the program reads them with a truth test on the string. Setting one to "0" to say "off" turns the
# feature on. The profile check refuses them in serving.env; the smoke test runs with them as the server does.
PRESENCE_FLAGS = {
    "FLASHINFER_DISABLE_JIT": {
        "effect": "flashinfer turns its JIT compiler off",
        "why": 'flashinfer/jit/core.py reads it as `if os.environ.get("FLASHINFER_DISABLE_JIT")` (0.6.x)',
        "consequence": "the server then fails on any kernel the installed flashinfer-jit-cache lacks, instead of"
        " compiling it",
    },
}


class ServerUnknown(Exception):
    """The serving unit could not be read (no systemd, unit not found, systemctl failed)."""


# --------------------------------------------------------------------------- which processes are the server's


def read_unit(unit: str, which, run) -> dict:
    """The unit's main pid, cgroup and state (``systemctl show``, read by _unit.parse_show). ``which(name)`` finds an
    executable (None when absent), ``run(argv)`` returns ``(rc, stdout, stderr)`` (AnsibleModule.get_bin_path and
    run_command)."""
    systemctl = which("systemctl")
    if not systemctl:
        raise ServerUnknown("this host has no systemctl (no systemd): give the server's main pid instead")
    name = _unit.unit_name(unit)
    argv = [systemctl, "show", name, "--no-pager", "-p", "MainPID,ControlGroup,ActiveState,LoadState"]
    rc, out, err = run(argv)
    if rc != 0:
        raise ServerUnknown(f"`{' '.join(argv[1:])}` exited {rc}: {(err or out).strip()[-300:]}")
    if "LoadState=not-found" in out.splitlines():
        raise ServerUnknown(f"systemd knows no unit {name}")
    shown = _unit.parse_show(out)
    return {"main_pid": shown["main_pid"], "cgroup": shown["control_group"], "active_state": shown["active_state"]}


def server_pid_set(server_pids=None, main_pid=None, cgroup=None, proc_root="/proc", cgroup_root="/sys/fs/cgroup"):
    """The serving unit's processes: ``server_pids`` as given, plus the main pid and every descendant that runs now
    (SGLang's scheduler and TP workers are children of its launcher), plus the members of the unit's cgroup.

    None when none of the three is given (nobody said which processes are the server's). A main pid of 0 (a unit
    that does not run) adds nothing, so the set can be empty: the server runs no process.
    """
    if server_pids is None and main_pid is None and not cgroup:
        return None
    pids = {int(pid) for pid in server_pids or ()}
    if main_pid or cgroup:
        pids |= _proc.process_tree(main_pid, proc_root=proc_root, cgroup=cgroup, cgroup_root=cgroup_root)
    return pids


def resolve(params: dict, which, run, proc_root="/proc", cgroup_root="/sys/fs/cgroup") -> dict:
    """The server a module was told about (the SERVER_SPEC options): ``{unit, main_pid, cgroup, source, error,
    pids}``. An explicit ``server_main_pid`` wins over the unit (hosts without systemd); a unit that cannot be read
    leaves ``pids`` None with the reason in ``error``."""
    unit, main_pid, cgroup = params.get("server_unit"), params.get("server_main_pid"), params.get("server_cgroup")
    out = {"unit": unit, "main_pid": main_pid, "cgroup": cgroup, "source": None, "error": None}
    if main_pid is not None:
        out["source"] = "server_main_pid"
    elif unit:
        try:
            shown = read_unit(unit, which, run)
        except ServerUnknown as exc:
            out["error"] = f"the serving unit {_unit.unit_name(unit)} could not be read: {exc}"
        else:
            main_pid, cgroup = shown["main_pid"], cgroup or shown["cgroup"]
            out.update(main_pid=main_pid, cgroup=cgroup, source=f"systemd ({shown['active_state']})")
    out["pids"] = server_pid_set(params.get("server_pids"), main_pid, cgroup, proc_root, cgroup_root)
    return out


def server_fact(server: dict) -> dict:
    """What a module returns of the server: its pids sorted (JSON has no sets)."""
    pids = server.get("pids")
    return dict(server, pids=None if pids is None else sorted(pids))


def server_notes(server: dict) -> list[str]:
    if server.get("error"):
        return [f"{server['error']}; every compute process counts as foreign"]
    return []


# --------------------------------------------------------------------------- the environment it runs with


def serving_environment(main_pid=None, env_file=None, base_env=None, proc_root="/proc"):
    """The environment the serving unit runs with: ``(env, source)``.

    The running server's own (``/proc/<main pid>/environ``: systemd's environment, the unit's Environment= and
    EnvironmentFile= exactly as they reached the server), else the unit's environment file over ``base_env`` (not
    exact: what systemd adds is missing), else ``base_env`` alone. ``source`` says which, and why the better ones
    were not used.
    """
    base = dict(base_env if base_env is not None else os.environ)
    not_used = []
    if main_pid:
        path = os.path.join(proc_root, str(main_pid), "environ")
        try:
            with open(path, "rb") as handle:
                env = _proc.parse_environ(handle.read())
        except OSError as exc:
            not_used.append(f"the server's environment {path} could not be read ({exc.strerror or exc})")
        else:
            if env:
                return env, {"kind": "process", "pid": int(main_pid), "path": path}
            # a zombie's is empty, and so is a process's caught between fork and exec
            not_used.append(f"the server's environment {path} is empty")
    else:
        not_used.append("no server process runs (main pid unknown or 0)")
    if env_file:
        try:
            with open(env_file, encoding="utf-8") as handle:
                env = dict(base, **_unit.parse_env_file(handle.read()))
            return env, {"kind": "file", "path": env_file, "not_used": not_used}
        except OSError as exc:
            not_used.append(f"the unit's environment file {env_file} could not be read ({exc.strerror or exc})")
    return base, {"kind": "module", "not_used": not_used}


def presence_flags(env: dict) -> list[dict]:
    """The PRESENCE_FLAGS set in ``env``: ``[{name, value, effect, why, consequence}]``."""
    return [dict(PRESENCE_FLAGS[name], name=name, value=env[name]) for name in sorted(PRESENCE_FLAGS) if name in env]


def presence_flag_message(flag: dict) -> str:
    return (
        f"{flag['name']}={flag['value']!r}: {flag['effect']} whenever the variable is set, whatever its value"
        f" ({flag['why']}); {flag['consequence']}"
    )
