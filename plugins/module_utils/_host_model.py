# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The desired state of a serving host and how far the host is from it: pure logic (host side).

One model for the audit, the upgrade and the rollback. For a host and a profile it lists every managed item with
its expected and observed value and, when they differ, the drift in words a person reads:

* ``toolkit``: the target CUDA toolkit present, complete, and every file it installed unchanged (the install
  marker records each file's sha256; toolkits installed before that record only their components);
* ``cuda link``: ``/usr/local/cuda`` per the profile's link policy (``target``: the new toolkit; ``keep``: where it
  pointed when the toolkit was installed, recorded in the marker);
* ``serving venv link``: ``current`` points at a venv built for the lock;
* ``serving venv``: that venv holds exactly the lock's distributions and versions (local tags included), and each
  installed file matches its RECORD hash (a removed, added or edited package shows);
* each managed file (the serving unit, its environment file) equals its rendered template; an environment file is
  compared variable by variable;
* ``serving unit``: the unit as systemd runs it (``systemctl show``, its file and every drop-in) against the rendered
  unit and environment file: what a drop-in overrides of what the profile sets, a unit file that takes precedence
  over the collection's, a stopped unit (and who holds its port);
* ``serving process``: the unit's main process (``/proc``: command line, environment, the venv it runs from) against
  the unit and ``current``: a server started by hand, or before current or its files changed;
* ``gpus``: the GPU health judged by ``nvml_info`` (driver against the profile's minimum, errors, clocks), the
  processes of the server's tree counted as its own.

Every item is ``{item, ok, expected, observed, drift: [words]}`` (the items of what runs also ``repair``: restart, or
refuse with its ``fix``); ``judge`` adds the verdict, ``repairs`` what a re-run does about what runs.
"""

from __future__ import annotations

import base64
import csv
import os
import re

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _proc
from ansible_collections.gpufleet.upgrade.plugins.module_utils import _toolkit as tk
from ansible_collections.gpufleet.upgrade.plugins.module_utils import _unit as un
from ansible_collections.gpufleet.upgrade.plugins.module_utils._backup import canonical_name as canon
from ansible_collections.gpufleet.upgrade.plugins.module_utils._redist import file_sha256

BOOTSTRAP = ("pip", "setuptools", "wheel")
# At most this many file names in one drift line (the count says how many more).
SHOWN_FILES = 3


def item(name, expected, observed, drift=()) -> dict:
    drift = [str(d) for d in drift]
    return {"item": name, "ok": not drift, "expected": expected, "observed": observed, "drift": drift}


def _files_line(prefix, problems) -> str:
    shown = ", ".join(f"{path} {how}" for path, how in problems[:SHOWN_FILES])
    more = f" and {len(problems) - SHOWN_FILES} more" if len(problems) > SHOWN_FILES else ""
    return f"{prefix}: {shown}{more}"


# --------------------------------------------------------------------------- the serving venv


def site_packages(venv) -> list:
    """The venv's site-packages folders (lib/pythonX.Y/site-packages, lib64 too when it is not a link)."""
    out = []
    for lib in ("lib", "lib64"):
        base = os.path.join(venv, lib)
        if not os.path.isdir(base) or (lib == "lib64" and os.path.islink(base)):
            continue
        for name in sorted(os.listdir(base)):
            candidate = os.path.join(base, name, "site-packages")
            if name.startswith("python") and os.path.isdir(candidate):
                out.append(candidate)
    return out


def read_metadata(dist_info) -> tuple:
    """(Name, Version) from a dist-info's METADATA headers."""
    name = version = None
    try:
        with open(os.path.join(dist_info, "METADATA"), encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if not line.strip():
                    break  # the headers end at the first blank line
                key, _sep, value = line.partition(":")
                if key == "Name" and name is None:
                    name = value.strip()
                elif key == "Version" and version is None:
                    version = value.strip()
    except OSError:
        pass
    return name, version


def record_rows(dist_info) -> list:
    """The judged rows of a distribution's RECORD: ``[(relative path, urlsafe-base64 sha256, size text)]``.

    Entries without a hash (RECORD itself, byte-code) are left out. Raises OSError when there is no RECORD."""
    with open(os.path.join(dist_info, "RECORD"), encoding="utf-8", errors="replace", newline="") as handle:
        # RECORD is CSV (PEP 376): a path holding a comma or a quote is quoted, so it is read as CSV, not split.
        rows = list(csv.reader(handle))
    return [
        (row[0], row[1][len("sha256=") :], row[2]) for row in rows if len(row) == 3 and row[1].startswith("sha256=")
    ]


def file_state(path, want, size, verify, digests=None):
    """``None`` when the file at ``path`` is what one RECORD row says, else ``'missing'`` or ``'edited'``.

    verify ``record`` compares size and sha256, ``size`` the size only. ``digests`` ({path: hash}) keeps each file's
    hash, so a file several RECORDs claim is read once."""
    try:
        st = os.stat(path)
    except OSError:
        return "missing"
    if size.isdigit() and st.st_size != int(size):
        return "edited"
    if verify == "record":
        digests = {} if digests is None else digests
        if path not in digests:
            digests[path] = base64.urlsafe_b64encode(bytes.fromhex(file_sha256(path))).rstrip(b"=").decode()
        if digests[path] != want:
            return "edited"
    return None


def record_problems(site, dist_info, verify="record", claims=None, digests=None) -> list:
    """Files of a distribution that differ from its RECORD: ``[(path, 'missing' | 'edited')]``.

    verify: ``record`` compares sizes and sha256, ``size`` sizes only (fast on a multi-GB torch venv), ``none`` skips.
    Entries without a hash (RECORD itself, byte-code) are not judged. ``claims`` ({normalised path: [(name, hash,
    size)]}, ``shared_files``): a file that several installed distributions install holds the last one's copy, so
    it is accepted when it matches any of their RECORDs.
    """
    if verify == "none":
        return []
    try:
        rows = record_rows(dist_info)
    except OSError:
        return [(os.path.basename(dist_info) + "/RECORD", "missing")]
    return rows_problems(site, rows, verify, claims, digests)


def rows_problems(site, rows, verify="record", claims=None, digests=None) -> list:
    """``record_problems`` of RECORD rows already read."""
    claims = claims or {}
    digests = {} if digests is None else digests
    problems = []
    for rel, want, size in rows:
        path = os.path.normpath(os.path.join(site, rel))
        how = file_state(path, want, size, verify, digests)
        if how == "edited" and any(
            file_state(path, h, s, verify, digests) is None for _n, h, s in claims.get(path, ())
        ):
            continue
        if how:
            problems.append((rel, how))
    return problems


def shared_files(site, records) -> dict:
    """``{normalised path: [(name, hash, size)]}`` of the files that the RECORDs of several distributions claim.

    records: ``{distribution name: RECORD rows}`` (``record_rows``). Two wheels may ship one top-level file
    (flashinfer-python and torch-c-dlpack-ext each install ``build_backend.py``); the one unpacked last wins."""
    claims = {}
    for name, rows in records.items():
        for rel, want, size in rows:
            claims.setdefault(os.path.normpath(os.path.join(site, rel)), []).append((name, want, size))
    return {path: owners for path, owners in claims.items() if len({owner[0] for owner in owners}) > 1}


def shared_lines(site, shared, verify="record", digests=None) -> list:
    """One line per shared file: who installs it and whose RECORD it matches (``edited`` drift when none)."""
    if verify == "none":
        return []
    lines = []
    for path, owners in sorted(shared.items()):
        names = sorted({owner[0] for owner in owners})
        matching = sorted({n for n, h, s in owners if file_state(path, h, s, verify, digests) is None})
        rel = os.path.relpath(path, site)
        matches = f"it matches {_and(matching)}'s RECORD" if matching else "it matches none of their RECORDs"
        lines.append(f"{rel} is installed by {_and(names)}; {matches}")
    return lines


def _and(names) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def read_venv(venv, verify="record") -> dict:
    """What a venv holds: ``{path, exists, distributions: {canon name: {name, version, problems}}, shared: [words]}``.

    ``shared`` says, once per file, which distributions install the same file and whose RECORD it matches."""
    if not venv or not os.path.isdir(venv):
        return {"path": venv, "exists": False, "distributions": {}, "shared": []}
    dists, shared_words = {}, []
    for site in site_packages(venv):
        found = []
        for entry in sorted(os.listdir(site)):
            if not entry.endswith(".dist-info"):
                continue
            dist_info = os.path.join(site, entry)
            name, version = read_metadata(dist_info)
            if name:
                found.append((dist_info, name, version))
        records = {}
        for dist_info, name, _version in found if verify != "none" else ():
            try:
                records[dist_info] = (canon(name), record_rows(dist_info))
            except OSError:
                continue
        shared = shared_files(site, dict(records.values()))
        digests = {}
        for dist_info, name, version in found:
            if verify == "none":
                problems = []
            elif dist_info in records:
                problems = rows_problems(site, records[dist_info][1], verify, shared, digests)
            else:
                problems = [(os.path.basename(dist_info) + "/RECORD", "missing")]
            dists[canon(name)] = {"name": name, "version": version, "problems": problems}
        shared_words += shared_lines(site, shared, verify, digests)
    return {"path": venv, "exists": True, "distributions": dists, "shared": shared_words}


def venv_item(observed, packages, skip=BOOTSTRAP, label="serving venv") -> dict:
    """Judge a venv (``read_venv``) against the lock's packages ``[{name, version}]``.

    ``skip``: venv tooling (pip, setuptools, wheel) that a venv may hold beside the lock; a skipped name the lock pins
    is judged like any other package (torch requires setuptools, so a real lock pins it)."""
    want = {canon(p["name"]): str(p["version"]) for p in packages}
    expected = {"path": observed.get("path"), "packages": len(want)}
    if not observed.get("exists"):
        return item(
            label,
            expected,
            {"path": observed.get("path"), "exists": False},
            [f"{label}: {observed.get('path') or 'none'} does not exist"],
        )
    skipped = {canon(s) for s in skip} - set(want)
    have = {k: v for k, v in observed["distributions"].items() if k not in skipped}
    drift = []
    for name in sorted(set(want) | set(have)):
        if name not in have:
            drift.append(f"{label}: {name} {want[name]} missing")
        elif name not in want:
            drift.append(f"{label}: {name} {have[name]['version']} not in the lock")
        elif have[name]["version"] != want[name]:
            drift.append(f"{label}: {name} is {have[name]['version']}, the lock wants {want[name]}")
        elif have[name]["problems"]:
            drift.append(_files_line(f"{label}: {name} {want[name]}", have[name]["problems"]))
    observed_view = {
        "path": observed["path"],
        "packages": len(have),
        "edited": sorted(k for k, v in have.items() if v["problems"]),
        "shared": list(observed.get("shared") or []),
    }
    return item(label, expected, observed_view, drift)


VENV_LINK = "serving venv link"


def venv_link_item(link, target, expected_path, venv_name) -> dict:
    """``current`` must point at a venv built for the lock: the lock's venv, or one rebuilt beside it (a repair)."""
    label = VENV_LINK
    if not target:
        return item(label, expected_path, None, [f"{label}: {link} is missing, the lock wants {expected_path}"])
    name = os.path.basename(os.path.normpath(target))
    if os.path.normpath(target) == os.path.normpath(expected_path) or name.startswith(f"{venv_name}.repair-"):
        return item(label, expected_path, target)
    return item(
        label, expected_path, target, [f"{label}: current is {name}, the lock wants {os.path.basename(expected_path)}"]
    )


# --------------------------------------------------------------------------- managed files


def file_item(label, path, expected_text, observed_text, kind="text") -> dict:
    """A managed file against its rendered template. kind ``env`` names each variable that differs."""
    if observed_text is None:
        return item(label, path, None, [f"{label}: {path} is missing"])
    if observed_text.rstrip("\n") == expected_text.rstrip("\n"):
        return item(label, path, path)
    drift = []
    if kind == "env":
        want, have = un.parse_env_file(expected_text), un.parse_env_file(observed_text)
        for key in sorted(set(want) | set(have)):
            if key not in have:
                drift.append(f"{label}: {key} is not set, profile wants {want[key]}")
            elif key not in want:
                drift.append(f"{label}: {key}={have[key]} is not in the profile")
            elif have[key] != want[key]:
                drift.append(f"{label}: {key} is {have[key]}, profile wants {want[key]}")
        # Comments and layout are not the service's environment: same variables, same file as far as it runs.
    else:
        want_lines, have_lines = expected_text.splitlines(), observed_text.splitlines()
        for number, (w, h) in enumerate(zip(want_lines, have_lines, strict=False), start=1):
            if w != h:
                drift.append(f"{label}: line {number} is {h!r}, the template has {w!r}")
                break
        else:
            drift.append(f"{label}: {len(have_lines)} lines, the template has {len(want_lines)}")
    return item(label, path, path, drift)


# A file's text, None when it cannot be read (the serving unit's reader: one for the files and the drop-ins).
read_text = un.read_text


# --------------------------------------------------------------------------- toolkit and link


TOOLKIT_VERIFY = ("stat", "sha256")


def toolkit_files_problems(home, files, stats=None, verify="stat", counts=None) -> list:
    """Files the toolkit's marker recorded (relative path -> sha256) that are missing or changed now.

    verify ``stat``: a file whose stat signature (``stats``, recorded at install: size, mtime, ctime, inode) is
    unchanged is the file installed, its content not read; any other file is hashed. ``sha256``: every file is
    hashed. ``counts`` (a dict) gets ``checked`` and ``hashed``.
    """
    if verify not in TOOLKIT_VERIFY:
        raise ValueError(f"toolkit verify {verify!r}: use one of {', '.join(TOOLKIT_VERIFY)}")
    stats = stats or {}
    problems, hashed = [], 0
    for rel in sorted(files):
        path = os.path.join(home, rel)
        if not os.path.isfile(path):
            problems.append((rel, "missing"))
            continue
        if verify == "stat" and rel in stats and tk.stat_signature(path) == list(stats[rel]):
            continue
        hashed += 1
        if file_sha256(path) != files[rel]:
            problems.append((rel, "edited"))
    if counts is not None:
        counts.update(checked=len(files), hashed=hashed)
    return problems


def toolkit_item(home, release, status, marker, verify="stat") -> dict:
    """The target toolkit: ``status`` is ``_toolkit.target_status``; ``marker`` its install record (or None)."""
    label = "toolkit"
    observed = {"path": home, "status": status.get("status"), "release": status.get("release")}
    drift = []
    if status.get("status") != "present":
        missing = status.get("missing") or []
        drift.append(
            f"CUDA {release} toolkit at {home} is {status.get('status')}"
            + (f" (missing {', '.join(missing)})" if missing and status.get("status") != "absent" else "")
        )
    else:
        counts = {}
        marker = marker or {}
        problems = toolkit_files_problems(home, marker.get("files") or {}, marker.get("stat"), verify, counts)
        observed.update(files_checked=counts["checked"], files_hashed=counts["hashed"])
        if problems:
            drift.append(_files_line(f"CUDA {release} toolkit", problems))
    return item(label, {"path": home, "release": release}, observed, drift)


def link_item(link_state, policy, home, recorded) -> dict:
    """The global CUDA link: ``target`` -> the new toolkit; ``keep`` -> where it resolved before the install
    (``recorded``, from the marker; nothing to judge when the install recorded none)."""
    label = "cuda link"
    want = home if policy == "target" else recorded
    have = link_state.get("resolved")
    if not want:
        return item(label, None, have)
    if have is None:
        return item(
            label, want, None, [f"{label}: {link_state.get('path')} is missing, the profile wants it at {want}"]
        )
    if os.path.normpath(have) != os.path.normpath(want):
        return item(
            label, want, have, [f"{label}: {link_state.get('path')} resolves to {have}, the profile wants {want}"]
        )
    return item(label, want, have)


def gpu_item(nvml) -> dict:
    """GPU health as ``nvml_info`` judged it (healthy, skipped on a host without GPUs, or the reasons)."""
    nvml = nvml or {}
    status = nvml.get("status") or "unknown"
    if status in ("healthy", "skipped"):
        return item("gpus", "healthy", status)
    reasons = nvml.get("reasons") or [status]
    return item("gpus", "healthy", status, [f"GPU health: {'; '.join(str(r) for r in reasons)}"])


# --------------------------------------------------------------------------- what runs

SERVING_UNIT = "serving unit"
SERVING_PROCESS = "serving process"
# How a re-run of the upgrade repairs a drifted item of what runs: restart the unit (it runs what its files say
# once restarted), or refuse (a setting the collection did not write overrides the profile: removing it is the
# operator's call).
RESTART, REFUSE = "restart", "refuse"


def _options(argv) -> dict:
    """``{option: value words}`` of an argv's ``--options`` (a flag without a value: ''), and its lead words."""
    out, key = {"": []}, ""
    for word in argv or ():
        if word.startswith("--"):
            key, _sep, inline = word.partition("=")
            out[key] = [inline] if _sep else []
        else:
            out.setdefault(key, []).append(word)
    return out


def argv_option(argv, option):
    """The value of ``--option`` in an argv (``--port 30000`` or ``--port=30000``); None when absent."""
    words = _options(argv).get(option)
    return words[0] if words else None


def argv_difference(have, want) -> str:
    """The first difference of two command lines in words: ``--port 31000, the other says --port 30000``."""
    a, b = _options(have), _options(want)
    for key in list(b) + [k for k in a if k not in b]:
        if a.get(key) == b.get(key):
            continue
        if key == "":
            return f"{' '.join(a[''])!r}, the other says {' '.join(b[''])!r}"
        mine = f"{key} {' '.join(a[key])}".strip() if key in a else f"no {key}"
        other = f"{key} {' '.join(b[key])}".strip() if key in b else f"no {key}"
        return f"{mine}, the other says {other}"
    return f"{' '.join(have or [])!r}, the other says {' '.join(want or [])!r}"


def same_command(have, want) -> bool:
    """Whether a process's command line is the command: as given, or a script run through its '#!' interpreter
    (the kernel puts the interpreter, and at most one option of it, before the script's path)."""
    have, want = list(have or ()), list(want or ())
    if " ".join(have) == " ".join(want):
        return True
    extra = len(have) - len(want)
    return bool(want) and 0 < extra <= 2 and " ".join(have[extra:]) == " ".join(want)


def _clip(text, limit=80) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _says(have, want, who):
    return argv_difference(have, want).replace("the other says", f"{who} says")


def process_differences(process, venvs, env, argv=None, who="the unit") -> list:
    """What a running process (``_proc.describe``) does otherwise than expected: ``[(kind, words)]``.

    ``venvs``: the venv folders it may run from (compared after resolving links; empty: not judged); ``env``:
    ``{name: value}`` its environment must hold (None value: must be unset); ``argv``: its command, or None.
    """
    pid = process.get("pid")
    server = f"the running server (pid {pid})"
    if not process.get("running"):
        return [("process", f"no process {pid} runs")]
    out = []
    if argv is not None and process.get("cmdline") is not None and not same_command(process["cmdline"], argv):
        out.append(("argv", f"{server} was started with {_says(process['cmdline'], argv, who)}"))
    if venvs:
        wanted = {os.path.normpath(os.path.realpath(v)) for v in venvs if v}
        real = process.get("venv_real")
        if process.get("exe_deleted"):
            out.append(("venv", f"{server} runs {process.get('exe')}, which was deleted"))
        elif real is None:
            out.append(("venv", f"{server} runs {process.get('exe') or '?'}, from no venv"))
        elif os.path.normpath(real) not in wanted:
            out.append(("venv", f"{server} runs from {real}, not {' or '.join(sorted(wanted))}"))
    environ = process.get("environ")
    if env and environ is None:
        reason = (process.get("errors") or {}).get("environ", "unreadable")
        out.append(("env", f"{server}: its environment cannot be read ({reason}); read it as root"))
    elif env:
        for name, value in sorted(env.items()):
            have = environ.get(name)
            if have != value:
                shown = "unset" if have is None else f"{name}={have}"
                wanted = f"unsets {name}" if value is None else f"gives {name}={value}"
                out.append(("env", f"{server} runs with {shown}, {who} {wanted}"))
    return out


def _unit_env_lines(unit, sources, env_files, want_env, env_path) -> list:
    """Variables the profile sets that a drop-in (or a file a drop-in names) sets otherwise: ``[(repair, words)]``.
    A difference in the collection's own files is their items' drift, not repeated here."""
    out = []
    if env_path not in (unit.get("environment_files") or []):
        culprit = next((s for s in reversed(sources) if s["settings"]["environment_files"] is not None), None)
        by = f"{culprit['kind']} {culprit['path']} sets EnvironmentFile= without it" if culprit else "nothing names it"
        repair = REFUSE if culprit and culprit["kind"] == "drop-in" else RESTART
        out.append((repair, f"{unit['name']} does not read {env_path}: {by}"))
    for name, want in sorted(want_env.items()):
        origin = un.env_origin(name, unit, sources, env_files)
        if origin is None or origin["value"] == want:
            continue
        if origin["kind"] == "drop-in":
            out.append((REFUSE, f"drop-in {origin['path']} sets {name}={origin['value']}, the profile wants {want}"))
        elif origin["kind"] == "environment file" and origin["path"] != env_path and origin["via_kind"] == "drop-in":
            out.append(
                (
                    REFUSE,
                    f"drop-in {origin['via']} adds EnvironmentFile={origin['path']}, which sets "
                    f"{name}={origin['value']}, the profile wants {want}",
                )
            )
    return out


def _unit_exec_lines(unit, sources, want_argv, fragment_text_argv) -> list:
    have = unit.get("exec_start")
    if have is None or same_command(have, want_argv):
        return []
    origin = un.exec_origin(sources)
    words = _says(have, want_argv, "the profile")
    if origin and origin["kind"] == "drop-in":
        return [(REFUSE, f"drop-in {origin['path']} replaces ExecStart: it runs {words}")]
    if fragment_text_argv is not None and same_command(fragment_text_argv, want_argv):
        # The file is the collection's again, systemd still runs what it loaded before.
        return [(RESTART, f"systemd runs {unit['name']} as loaded before its file changed ({words}): reload, restart")]
    return []


def _process_reference(process, unit, sources, observed, want_argv, want_env):
    """What the main process is judged against: ``(argv or None, {name: value}, who)``.

    Without a unit, the profile. With one, only what the process runs otherwise than both the profile and the unit
    (a stale or hand-started process, which a restart mends), judged against the unit; where the process runs what
    the unit gives, a difference from the profile is the drift of the unit's files or of a drop-in, said once by
    their items.
    """
    if unit is None:
        return want_argv, want_env, "the profile"
    have_argv = process.get("cmdline")
    unit_argv = unit.get("exec_start") or want_argv
    argv = None
    if have_argv is not None and not (same_command(have_argv, want_argv) or same_command(have_argv, unit_argv)):
        argv = unit_argv
    environ = process.get("environ")
    env = {}
    for name, want in want_env.items():
        origin = un.env_origin(name, unit, sources, observed.get("env_files") or {})
        gives = origin["value"] if origin else None
        have = (environ or {}).get(name)
        if environ is None or (have != want and have != gives):
            env[name] = gives
    return argv, env, "the unit"


def serving_items(observed, unit_text, env_text, unit_path, env_path, venv_link) -> list:
    """What runs against the profile: the effective unit (``serving unit``) and its main process (``serving
    process``). Each drifted item carries ``repair`` (restart or refuse) and, for a refusal, ``fix``.

    observed: ``{unit: _unit.parse_show(...) + {name} or None (no systemd: a main pid was given), sources:
    _unit.read_sources(...), env_files: {path: {name: value}}, process: _proc.describe(...) or None, tree: [pid]}``;
    unit_text, env_text: the unit and environment file as the collection renders them; venv_link: ``current``.
    """
    unit, sources = observed.get("unit"), observed.get("sources") or []
    want_argv, want_env = un.expected_exec(unit_text), un.parse_env_file(env_text)
    process = observed.get("process")
    items = []
    unit_lines = []
    if unit is not None:
        name = unit["name"]
        fragment = unit.get("fragment_path")
        if not fragment:
            unit_lines.append((RESTART, f"systemd has no unit {name}"))
        elif os.path.normpath(fragment) != os.path.normpath(unit_path):
            if un.takes_precedence(fragment):
                unit_lines.append((REFUSE, f"systemd loads {name} from {fragment}, which overrides {unit_path}"))
            else:
                unit_lines.append((RESTART, f"systemd loads {name} from {fragment}, not {unit_path}"))
        else:
            disk = next((s for s in sources if s["kind"] == "unit"), None)
            unit_lines += _unit_env_lines(unit, sources, observed.get("env_files") or {}, want_env, env_path)
            unit_lines += _unit_exec_lines(unit, sources, want_argv, (disk or {}).get("settings", {}).get("exec_start"))
        holder = observed.get("port_holder")
        if unit.get("active_state") != "active" and holder:
            # Started by hand, most likely: the unit cannot start while it holds the port, and the collection does
            # not stop a process it did not start.
            command = " ".join(holder.get("cmdline") or [holder.get("exe") or "?"])
            unit_lines.append(
                (
                    REFUSE,
                    f"{name} is {unit.get('active_state')}, while pid {holder['pid']} ({_clip(command)}) serves its "
                    f"port {observed.get('port')}",
                    f"stop pid {holder['pid']} (the collection does not stop a process it did not start), run again",
                )
            )
        elif unit.get("active_state") != "active":
            unit_lines.append((RESTART, f"{name} is {unit.get('active_state')} ({unit.get('sub_state')}), not serving"))
        drop_ins = [s["path"] for s in sources if s["kind"] == "drop-in"]
        entry = item(
            SERVING_UNIT,
            {"unit": unit_path, "exec_start": want_argv, "environment_file": env_path},
            {
                "unit": fragment,
                "drop_ins": drop_ins,
                "active_state": unit.get("active_state"),
                "main_pid": unit.get("main_pid"),
            },
            [f"{SERVING_UNIT}: {line[1]}" for line in unit_lines],
        )
        entry.update(_repair_of(unit_lines))
        items.append(entry)
    if process is not None:
        ref_argv, ref_env, who = _process_reference(process, unit, sources, observed, want_argv, want_env)
        target = os.path.realpath(venv_link) if venv_link and os.path.islink(venv_link) else None
        lines = process_differences(process, [target] if target else [], ref_env, ref_argv, who)
        fixed = [(RESTART, f"{words}: restart the unit" if unit is not None else words) for _kind, words in lines]
        entry = item(
            SERVING_PROCESS,
            {"argv": ref_argv, "venv": target, "env": ref_env},
            {
                "pid": process.get("pid"),
                "argv": process.get("cmdline"),
                "venv": process.get("venv_real"),
                "env": {k: (process.get("environ") or {}).get(k) for k in want_env},
                "tree": sorted(observed.get("tree") or []),
            },
            [f"{SERVING_PROCESS}: {words}" for _repair, words in fixed],
        )
        entry.update(_repair_of(fixed))
        items.append(entry)
    return items


def observe_serving(
    unit=None, main_pid=None, keys=(), run=None, systemctl="systemctl", proc_root="/proc", port=None
) -> dict:
    """What runs for a serving unit, or for a main pid where there is no systemd: ``{unit, sources, env_files,
    process, tree, port, port_holder}`` as ``serving_items`` reads it. ``port_holder``: the process that listens on
    ``port`` while the unit runs none (a server started by hand), else None.

    ``keys``: the environment variables whose values are kept, everywhere (unit, files, process). ``run(argv) ->
    (rc, stdout, stderr)`` runs systemctl (AnsibleModule.run_command); its failure raises ``_unit.UnitError``.
    """
    keys = set(keys or ())
    shown, sources, env_files = None, [], {}
    if unit:
        name = un.unit_name(unit)
        rc, out, err = run(un.show_argv(systemctl, name))
        if rc != 0:
            raise un.UnitError(f"systemctl show {name} failed (rc {rc}): {(err or out).strip()}")
        shown = dict(un.parse_show(out), name=name)
        sources = un.read_sources(shown["fragment_path"], shown["drop_in_paths"])
        env_files = {
            p: un.only(v, keys) for p, v in un.env_file_values(shown["environment_files"], un.parse_env_file).items()
        }
        shown["environment_names"] = sorted(shown["environment"])
        shown["environment"] = un.only(shown["environment"], keys)
        for source in sources:
            if source["settings"]["environment"] is not None:
                source["settings"]["environment"] = un.only(source["settings"]["environment"], keys)
        main_pid = shown["main_pid"]
    process, tree = None, []
    if main_pid:
        process = _proc.describe(main_pid, proc_root)
        if process["environ"] is not None:
            process["environ_names"] = sorted(process["environ"])
            process["environ"] = un.only(process["environ"], keys)
        tree = sorted(_proc.process_tree(main_pid, proc_root, cgroup=(shown or {}).get("control_group")))
    holder = None
    if shown is not None and not main_pid and port:
        pids = _proc.listeners(port, proc_root)
        holder = _proc.describe(pids[0], proc_root) if pids else None
        if holder and holder["environ"] is not None:
            holder["environ"] = un.only(holder["environ"], keys)
    return {
        "unit": shown,
        "sources": sources,
        "env_files": env_files,
        "process": process,
        "tree": tree,
        "port": port,
        "port_holder": holder,
    }


# The collection leaves a file it did not write: the operator removes the override (or its line).
OVERRIDE_FIX = "remove it (the collection leaves it), systemctl daemon-reload, run again"


def _repair_of(lines) -> dict:
    """``{repair, fix}`` of an item's lines ``(repair, words[, fix])``: a refusal wins over a restart (the restart
    would not mend it); its fix is the line's own, else OVERRIDE_FIX."""
    refused = [f"{line[1]}; fix: {line[2] if len(line) > 2 else OVERRIDE_FIX}" for line in lines if line[0] == REFUSE]
    if refused:
        return {"repair": REFUSE, "fix": "; ".join(refused)}
    return {"repair": RESTART if lines else None}


def repairs(items) -> dict:
    """``{restart, refuse}``: whether a re-run must restart the unit, and the fix of each item it must refuse."""
    return {
        "restart": any(i.get("repair") == RESTART for i in items if not i["ok"]),
        "refuse": [i["fix"] for i in items if not i["ok"] and i.get("repair") == REFUSE],
    }


# --------------------------------------------------------------------------- verdict


def judge(items) -> dict:
    """``{in_sync, drift, items, drifted}``: drift is every item's words, in item order."""
    drift = [line for entry in items for line in entry["drift"]]
    return {
        "in_sync": not drift,
        "drift": drift,
        "drifted": [entry["item"] for entry in items if not entry["ok"]],
        "items": list(items),
    }


# --------------------------------------------------------------------------- a stack that fits together

_CUDA_TAG = re.compile(r"^cu(?P<major>[0-9]+)(?P<minor>[0-9])$")


def cuda_of_tag(version) -> str | None:
    """'2.11.0+cu130' -> '13.0', '0.6.4+cu128' -> '12.8'; None without a CUDA local tag."""
    local = str(version or "").partition("+")[2]
    match = _CUDA_TAG.match(local)
    return f"{int(match['major'])}.{match['minor']}" if match else None


def stack_consistency(packages, env_text, toolkits, realpath=os.path.realpath) -> dict:
    """Whether a host's serving stack fits together, whatever profile it came from: the serving environment's
    CUDA_HOME is an installed toolkit, and every package of the venv built for one CUDA (local tag cuXYZ) was built
    for that toolkit's CUDA X.Y. The check a backup records and a rollback repeats after restoring.

    packages: ``[{name, version}]`` (the venv's lock as ``_backup.parse_lock`` reads it); env_text: the serving
    environment file ("" when there is none; None: not known, the environment is not judged); toolkits:
    ``[{path, version}]`` as the backup snapshot lists them.
    Returns ``{consistent, problems: [words], cuda_home, cuda_version}``.
    """
    problems = []
    env = un.parse_env_file(env_text) if env_text is not None else {}
    home = env.get("CUDA_HOME")
    by_path = {os.path.normpath(t["path"]): t for t in toolkits or ()}
    toolkit = by_path.get(os.path.normpath(realpath(home))) if home else None
    cuda = None
    if home and toolkit is None:
        installed = ", ".join(sorted(by_path)) or "none"
        problems.append(
            f"serving environment: CUDA_HOME is {home}, which is no installed toolkit (installed: {installed})"
        )
    elif toolkit is not None:
        version = str(toolkit.get("version") or "")
        cuda = ".".join(version.split(".")[:2]) or None
        if cuda is None:
            problems.append(f"serving environment: CUDA_HOME {home} has no readable version.json")
    tagged = [(p["name"], p["version"], cuda_of_tag(p["version"])) for p in packages or () if cuda_of_tag(p["version"])]
    if tagged and not home and env_text is not None:
        shown = ", ".join(f"{name} {version}" for name, version, _cuda in tagged[:SHOWN_FILES])
        problems.append(f"serving environment: no CUDA_HOME, while the venv holds CUDA builds ({shown})")
    if cuda:
        for name, version, built_for in tagged:
            if built_for != cuda:
                problems.append(
                    f"serving venv: {name} {version} is built for CUDA {built_for}, CUDA_HOME {home} is CUDA {cuda}"
                )
    return {"consistent": not problems, "problems": problems, "cuda_home": home, "cuda_version": cuda}


# --------------------------------------------------------------------------- the run record


def run_record_item(path, record, backups, problem="") -> dict:
    """The host's run record (state.json): missing while the host holds gpufleet backups means it was lost.

    ``record`` is the parsed file (None when absent), ``backups`` the ids under the state folder's backups/. A host
    gpufleet never acted on has neither and is not drift; a lost record would make a rollback guess and an audit
    call the host in sync, so it is named with what is still known and the fix. ``problem`` is why the file cannot
    be acted on (_state.validate_state's words, which name the file, the value and the fix): drift, never in sync.
    """
    if problem:
        return item("run record", f"{path} this collection can act on", "unusable", [problem])
    if record is not None:
        return item("run record", path, f"run {record.get('run_id')} {record.get('result')}")
    if not backups:
        return item("run record", f"{path} once gpufleet acts on the host", "no record and no backup")
    return item(
        "run record",
        path,
        "missing",
        [
            f"the host's run record {path} is missing although the host holds {len(backups)} gpufleet backup(s) "
            f"(newest {backups[-1]}); fix: run upgrade.yml (it records the host afresh) or rollback.yml (it restores "
            "a backup and records it)"
        ],
    )
