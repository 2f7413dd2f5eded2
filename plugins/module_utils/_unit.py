# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A systemd unit as systemd runs it: ``systemctl show`` parsed, unit files and drop-ins read, the environment a
service gets with where each variable comes from. Pure functions (host side), no Ansible.

systemd merges the unit file (``FragmentPath``) with every drop-in (``DropInPaths``, ``<unit>.d/*.conf`` under
/etc, /run and /usr), in that order: a later ``Environment=`` assignment of a variable wins, an empty
``ExecStart=`` or ``EnvironmentFile=`` clears what came before. The variables of the ``EnvironmentFile=`` files
override every ``Environment=`` assignment, later files over earlier ones (systemd.exec(5)).
"""

from __future__ import annotations

import os
import shlex

# Unit folders systemd reads before /etc/systemd/system (systemd.unit(5), system manager's search path): a unit
# file there overrides the collection's; one in a later folder (/run/systemd/system, /lib/systemd/system, ...) gives
# way to it once it is written and systemd reloaded.
BEFORE_ETC = (
    "/etc/systemd/system.control",
    "/run/systemd/system.control",
    "/run/systemd/transient",
    "/run/systemd/generator.early",
)

# What the model reads of a unit (systemctl show -p ...).
SHOW_PROPERTIES = (
    "MainPID",
    "ControlGroup",
    "ActiveState",
    "SubState",
    "ExecStart",
    "Environment",
    "EnvironmentFiles",
    "DropInPaths",
    "FragmentPath",
    "NeedDaemonReload",
)


# Characters a backslash escapes inside double quotes (systemd's SHELL_NEED_ESCAPE); before others it stays.
_DQ_ESCAPES = '"\\`$'


def parse_env_file(text: str) -> dict:
    """A systemd EnvironmentFile, read as systemd reads it: ``KEY=value`` lines, ``#`` and ``;`` comment lines,
    values bare (a backslash escapes the next character, trailing blanks are dropped), in single quotes (literal)
    or in double quotes (a backslash escapes a double quote, a backslash, a backtick or a dollar sign and stays
    before any other character); a backslash before the end of a line joins the next one."""
    env = {}
    for key, value in _assignments(text or ""):
        env[key] = value
    return env


def _assignments(text):
    pos, n = 0, len(text)
    while pos < n:
        end = text.find("\n", pos)
        end = n if end < 0 else end
        line = text[pos:end]
        stripped = line.lstrip()
        key, sep, _rest = stripped.partition("=")
        if not stripped or stripped[0] in "#;" or not sep or not key.strip():
            pos = end + 1
            continue
        start = pos + (len(line) - len(stripped)) + len(key) + 1
        value, pos = _value(text, start)
        yield key.strip(), value


def _value(text, pos):
    """The value starting at ``pos`` and the position after its line."""
    n, out, quote, trail = len(text), [], None, 0
    while pos < n and text[pos] in " \t":
        pos += 1
    while pos < n:
        ch = text[pos]
        if quote is None and ch == "\n":
            break
        if ch == "\\" and pos + 1 < n and quote != "'":
            nxt = text[pos + 1]
            if nxt == "\n":
                pass  # a line continuation
            elif quote == '"' and nxt not in _DQ_ESCAPES:
                out.append(ch + nxt)
            else:
                out.append(nxt)
            pos, trail = pos + 2, 0
            continue
        if quote is None and ch in "'\"":
            quote, trail = ch, 0
        elif ch == quote:
            quote = None
        else:
            out.append(ch)
            trail = trail + 1 if quote is None and ch in " \t" else 0
        pos += 1
    value = "".join(out)
    return (value[: len(value) - trail] if trail else value), pos + 1


def unit_name(unit: str) -> str:
    """A unit as systemctl names it: ``sglang`` is ``sglang.service``."""
    return unit if "." in unit else f"{unit}.service"


def show_argv(systemctl, unit) -> list:
    """The command that prints a unit's properties the model reads."""
    return [systemctl, "show", unit, "--no-pager", "-p", ",".join(SHOW_PROPERTIES)]


def _split(text) -> list:
    try:
        return shlex.split(text, posix=True)
    except ValueError:
        return text.split()


def _exec_argv(value):
    """``{ path=/x ; argv[]=/x -m y ; ignore_errors=no ; ... }`` -> ['/x', '-m', 'y'] (None when not understood).

    systemctl prints argv joined by spaces without quoting: an argument that holds a space reads as two.
    """
    head, sep, rest = value.partition("argv[]=")
    if not sep:
        return None
    return rest.split(" ; ", 1)[0].split()


def parse_show(text) -> dict:
    """``systemctl show`` output as ``{main_pid, control_group, active_state, sub_state, exec_start, environment,
    environment_files, drop_in_paths, fragment_path, need_daemon_reload}``."""
    raw = {}
    for line in (text or "").splitlines():
        key, sep, value = line.partition("=")
        if sep:
            raw.setdefault(key, []).append(value)

    def one(key, default=""):
        return (raw.get(key) or [default])[-1]

    env = {}
    for entry in _split(" ".join(raw.get("Environment") or [])):
        name, _sep, value = entry.partition("=")
        env[name] = value
    files = []
    for value in raw.get("EnvironmentFiles") or []:
        # "/etc/x.env (ignore_errors=no)"
        path = value.rsplit(" (ignore_errors=", 1)[0].strip()
        if path:
            files.append(path)
    exec_start = next((argv for argv in map(_exec_argv, raw.get("ExecStart") or []) if argv), None)
    main_pid = one("MainPID", "0")
    return {
        "main_pid": int(main_pid) if main_pid.isdigit() else 0,
        "control_group": one("ControlGroup") or None,
        "active_state": one("ActiveState") or "unknown",
        "sub_state": one("SubState") or "unknown",
        "exec_start": exec_start,
        "environment": env,
        "environment_files": files,
        "drop_in_paths": one("DropInPaths").split(),
        "fragment_path": one("FragmentPath") or None,
        "need_daemon_reload": one("NeedDaemonReload") == "yes",
    }


# --------------------------------------------------------------------------- unit files


def takes_precedence(fragment) -> bool:
    """Whether a unit file at ``fragment`` wins over one in /etc/systemd/system."""
    folder = os.path.dirname(os.path.normpath(fragment or ""))
    return folder in BEFORE_ETC


def parse_unit_text(text) -> dict:
    """A unit file or drop-in's ``[Service]`` settings that decide what runs: ``{exec_start, environment,
    environment_files}``, each None when the file does not set it.

    ``exec_start``: the argv of its last non-empty ``ExecStart=`` ([] when it only clears it); ``environment``:
    ``{name: value}`` its ``Environment=`` lines set; ``environment_files``: its ``EnvironmentFile=`` paths ([] when
    it only clears them), a leading '-' (optional file) dropped.
    """
    out = {"exec_start": None, "environment": None, "environment_files": None}
    section, pending = None, ""
    for line in (text or "").splitlines():
        line = pending + line.strip()
        pending = ""
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        if section != "Service" or "=" not in line:
            continue
        key, _sep, value = line.partition("=")
        key, value = key.strip(), value.strip()
        if key == "ExecStart":
            # Prefixes such as '-' or '@' change how systemd runs the command, not what it runs.
            words = _split(value.lstrip("-@:+!"))
            out["exec_start"] = [w.replace("$$", "$").replace("%%", "%") for w in words]
        elif key == "Environment":
            env = out["environment"] if out["environment"] is not None else {}
            for entry in _split(value):
                name, _sep, val = entry.partition("=")
                env[name] = val
            out["environment"] = env
        elif key == "EnvironmentFile":
            files = out["environment_files"] if out["environment_files"] is not None and value else []
            if value:
                files.append(value.lstrip("-"))
            out["environment_files"] = files
    return out


def read_text(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:
        return None


def read_sources(fragment_path, drop_in_paths, read=read_text) -> list:
    """``[{path, kind: unit|drop-in, readable, settings}]`` in systemd's merge order (the unit file, its drop-ins)."""
    sources = []
    for kind, path in [("unit", fragment_path)] + [("drop-in", p) for p in drop_in_paths or ()]:
        if not path:
            continue
        text = read(path)
        sources.append(
            {"path": path, "kind": kind, "readable": text is not None, "settings": parse_unit_text(text or "")}
        )
    return sources


class UnitError(Exception):
    """systemctl could not say how it runs the unit."""


def only(env, keys) -> dict:
    """The variables of ``keys`` only: the rest of an environment is named, never copied (it may hold tokens)."""
    return {k: v for k, v in (env or {}).items() if k in keys}


def env_file_values(paths, parse, read=read_text) -> dict:
    """``{path: {name: value}}`` of each environment file, read with ``parse`` (an unreadable one: {})."""
    return {path: parse(read(path) or "") for path in paths or ()}


# --------------------------------------------------------------------------- where a setting comes from


def env_origin(name, unit, sources, env_files) -> dict | None:
    """Where the service's value of ``name`` comes from: ``{value, path, kind, via}`` or None when nothing sets it.

    ``kind``: ``environment file`` (``via``: the unit file or drop-in whose EnvironmentFile= names it) or the
    ``unit``/``drop-in`` whose ``Environment=`` set it last.
    """
    for path in reversed(unit.get("environment_files") or []):
        values = env_files.get(path) or {}
        if name in values:
            via = next(
                (s for s in reversed(sources) if path in (s["settings"]["environment_files"] or [])),
                None,
            )
            return {
                "value": values[name],
                "path": path,
                "kind": "environment file",
                "via": via["path"] if via else None,
                "via_kind": via["kind"] if via else None,
            }
    env = unit.get("environment") or {}
    if name not in env:
        return None
    source = next(
        (s for s in reversed(sources) if (s["settings"]["environment"] or {}).get(name) == env[name]),
        None,
    )
    return {
        "value": env[name],
        "path": source["path"] if source else None,
        "kind": source["kind"] if source else "manager",
        "via": None,
        "via_kind": None,
    }


def exec_origin(sources):
    """The unit file or drop-in whose ``ExecStart=`` the service runs (the last that sets one); None if none."""
    return next((s for s in reversed(sources) if s["settings"]["exec_start"]), None)


def expected_exec(unit_text) -> list:
    """The argv of a rendered unit's ExecStart (the collection's template), as systemd reads it."""
    return parse_unit_text(unit_text)["exec_start"] or []
