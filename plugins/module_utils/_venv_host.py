# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The host side of role venv_rebuild, one call per step: ``inspect`` and ``locate`` (read-only), ``build``.

Stdlib only, so one file serves two ways:
- ``build`` (pull the locked wheels, build the venv, verify it) is module ``gpufleet.upgrade.venv_build``, which
  imports this file: argument spec, check mode and diff are the module's; one pipelined SSH exchange per host.
- ``inspect`` and ``locate`` run it as a script through ansible.builtin.raw (``python3 -c <this file> ARGS``, one
  SSH exchange with no module wrapper: on 16 lab hosts 1.05 s against 3.1 s through a module, whose wrapper costs each
  host a Python start-up with Ansible's imports; the audit's first round trip is locate).

Usage: as a script (each prints one JSON object)

    python _venv_host.py inspect SERVING_ROOT TOOLS_ROOT PYTHON WHEELHOUSE
    python _venv_host.py locate SERVING_ROOT [STATE_PATH]   (platform, venvs, current and the lock the state file
                                                            records, no subprocess)

build(SPEC, open_url), which the module calls: SPEC is
            {"check": bool, "venv", "current", "python", "tools_root", "wheelhouse", "serving_root", "lock_file",
             "lock_text", "tools_file", "tools_text", "uv_version" (the lock's),
             "wheels": [{"filename", "sha256"}], "pull_base" ("" = the wheels were pushed), "timeout",
             "compile_bytecode": bool, "verify": {verify_venv.py's SPEC}, "verifier" (verify_venv.py's source),
             "mark"}
The steps: fetch the wheels the host lacks from the fleet cache (each checked against the lock's sha256 while it
streams; a wrong file is refused and never installed), write the lock's requirements, install the locked uv in
the tools venv when it differs, remove an unverified venv of this lock (a failed build's leftovers), create the
venv with the host's Python and ``uv pip sync --require-hashes --no-index`` through the build's own cache
(``sync_venv``), run the verifier inside the new venv, and mark the venv verified. With "check", it reports the
steps it would run and changes nothing. A build that fails removes the venv it began ("removed"), and one that ran
out of space says where ("no_space": the mount, its free bytes after that, the path that could not be written).
The answer: {"ok", "changed", "steps", "fetched", "failed_step", "error", "verify", "not_judged", "seconds",
"removed", "no_space"}; "not_judged" names the imports the verifier could not judge on this host
(they need the NVIDIA driver, and the host serves without a GPU); "seconds" gives the wall time of each step run
(the fetch, the sync, the verifier ...), which the summary and bench/ read.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time

# Every distribution of the venv, venv tooling included: the lock may pin setuptools (torch requires it), and the
# inspection runs before the plan, so it cannot know which tooling the lock leaves out. The venvs this role builds
# hold exactly the lock (uv venv seeds nothing), so the diff against the lock is empty for an in-sync venv.
LIST_PACKAGES = (
    "import importlib.metadata as m, json, re;"
    "print(json.dumps(sorted(re.sub(r'[-_.]+', '-', d.metadata['Name']).lower() + '==' + d.version"
    " for d in m.distributions())))"
)
# sha256 of the wheels this script checked or fetched, by file name with the file's size, mtime, ctime and inode
# (as _toolkit.stat_signature; this file runs alone, stdlib only): an unchanged file is not read again (a 2 GB wheel
# takes seconds to hash), and a file replaced or put back, even with its size and mtime kept (cp -p), is hashed anew.
# uv checks every hash again when it installs.
HASHES = ".gpufleet-sha256.json"
MARK = ".gpufleet-verified"
# A full disk as uv (os error 28), pip and Python (Errno 28) say it.
NO_SPACE = re.compile(r"No space left on device|\(os error 28\)|\[Errno 28\]")
# The first line of what a tool says went wrong: uv's "error:" (or its "\u00d7" report), pip's "ERROR:".
ERROR_LINE = re.compile("(error|ERROR)\\b|\u00d7")


class StepError(Exception):
    """A step that failed: its name, what was seen, the tool's output, and the path it was writing when known."""

    def __init__(self, step, error, output="", path=None):
        super().__init__(error)
        self.step, self.error, self.output, self.path = step, error, output, path


def run(argv, timeout=120):
    try:
        # pylint: disable-next=ansible-bad-function
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def read(path):
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read().strip()
    except OSError:
        return None


def free_bytes(path):
    while path and not os.path.exists(path):
        path = os.path.dirname(path)
    stat = os.statvfs(path or "/")
    return stat.f_bavail * stat.f_frsize


# ---- wheel hashes ------------------------------------------------------------------------------------------


def _stamp(path):
    st = os.stat(path)
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def recorded_hashes(wheelhouse):
    """{file name: sha256} of the wheels whose stat signature is the one recorded when they were hashed (a record of
    another shape counts as none: the file is hashed again)."""
    try:
        with open(os.path.join(wheelhouse, HASHES), encoding="utf-8") as handle:
            table = json.load(handle)
    except (OSError, ValueError):
        return {}
    out = {}
    for name, entry in table.items() if isinstance(table, dict) else ():
        try:
            if isinstance(entry, list) and len(entry) == 5 and _stamp(os.path.join(wheelhouse, name)) == entry[:4]:
                out[name] = entry[4]
        except OSError:
            continue
    return out


def file_sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def record_hashes(wheelhouse, known):
    table = {}
    for name, digest in known.items():
        try:
            table[name] = [*_stamp(os.path.join(wheelhouse, name)), digest]
        except OSError:
            continue
    write_text(os.path.join(wheelhouse, HASHES), json.dumps(table, sort_keys=True) + "\n")


def missing_wheels(wheels, wheelhouse, known):
    """The lock's wheels the wheelhouse lacks or holds with another sha256 (files not recorded are hashed now)."""
    missing = []
    for wheel in wheels:
        path = os.path.join(wheelhouse, wheel["filename"])
        if wheel["filename"] not in known and os.path.isfile(path):
            known[wheel["filename"]] = file_sha256(path)
        if known.get(wheel["filename"]) != wheel["sha256"]:
            missing.append(wheel)
    return missing


def short_read(url, received, size=None, announced=None):
    """Why a download is a truncated one (fewer bytes than the lock's size or the server's Content-Length), or None.

    A cut download fails its sha256 as well; naming it by its bytes says what happened (a mirror or a connection
    that stopped early) instead of suggesting a different file.
    """
    expected = [(size, "the lock's size"), (announced, "the Content-Length the server announced")]
    for want, what in expected:
        if want is not None and received < int(want):
            return (
                f"truncated download of {url}: received {received} of {int(want)} bytes ({what}); "
                "fix: check the fleet cache or the mirror behind it serves the whole file, then run again"
            )
    return None


def fetch(url, dest, sha256, timeout, size, open_url):
    """Download url to dest through a temporary name, refusing a file cut short or whose sha256 is not the lock's.

    ``open_url`` opens the URL (the module passes ansible.module_utils.urls.open_url: proxies and certificates as
    every Ansible module handles them)."""
    tmp = f"{dest}.part-{os.getpid()}"
    digest = hashlib.sha256()
    received = 0
    announced = None
    try:
        with open_url(url, timeout=timeout) as resp, open(tmp, "wb") as out:
            length = resp.headers.get("Content-Length")
            announced = int(length) if length and length.isdigit() else None
            try:
                for chunk in iter(lambda: resp.read(1 << 20), b""):
                    digest.update(chunk)
                    out.write(chunk)
                    received += len(chunk)
            except http.client.IncompleteRead as exc:
                received += len(exc.partial)
        short = short_read(url, received, size, announced)
        if short:
            raise StepError("fetch", short)
        if digest.hexdigest() != sha256:
            raise StepError(
                "fetch",
                f"the checksum of {os.path.basename(dest)} from {url} did not match the lock: "
                f"sha256 {digest.hexdigest()}, the lock says {sha256}",
            )
        os.chmod(tmp, 0o644)
        os.replace(tmp, dest)
    except OSError as exc:
        raise StepError("fetch", f"{url}: {exc}", path=tmp) from exc
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return digest.hexdigest()


# ---- inspect -----------------------------------------------------------------------------------------------


def recorded_lock(serving_root, state_path):
    """The lock the host's last upgrade applied: the state file's ``lock`` record (venv_name, hash, profile) and the
    text of ``<serving_root>/locks/<venv_name>.txt`` the build wrote. An audit without a lock file judges the host
    against it (``_lock_file.recorded_lock`` on the controller checks the two agree)."""
    record = {"state_path": state_path, "lock": None, "lock_text": None, "lock_text_path": None}
    try:
        with open(state_path, encoding="utf-8") as handle:
            lock = json.load(handle).get("lock")
    except FileNotFoundError:
        return lock_of_current(serving_root, record)
    except (OSError, ValueError, AttributeError):
        return record
    if isinstance(lock, dict) and lock.get("venv_name"):
        record["lock"] = lock
        record["lock_text_path"] = os.path.join(serving_root, "locks", os.path.basename(lock["venv_name"]) + ".txt")
        record["lock_text"] = read(record["lock_text_path"])
    return record


def lock_of_current(serving_root, record):
    """With the state file gone, the lock the host still keeps for the venv ``current`` points at: the build's
    ``locks/<venv_name>.txt``, whose header names that venv and the lock's hash, which the venv's verified mark
    repeats. ``record["lock"]`` says it came from there (``from: current``); anything that does not agree leaves no
    lock, and the audit says the host records none."""
    record["state_missing"] = True
    link = os.path.join(serving_root, "current")
    if not os.path.islink(link):
        return record
    venv = os.path.realpath(link)
    name = os.path.basename(venv).split(".repair-", 1)[0]
    path = os.path.join(serving_root, "locks", name + ".txt")
    text = read(path)
    header = re.search(r"^# (\S+): lock ([0-9a-f]{64})$", text or "", re.MULTILINE)
    if not header or header.group(1) != name or read(os.path.join(venv, MARK)) != header.group(2):
        return record
    digest = header.group(2)
    if not name.endswith("-" + digest[:12]):
        return record
    record.update(
        lock={"venv_name": name, "hash": digest, "profile": name[: -len(digest[:12]) - 1], "from": "current"},
        lock_text=text,
        lock_text_path=path,
    )
    return record


def locate(serving_root, state_path=None):
    """What the host model's expected venv is picked from (entry point expected, an audit): platform, venvs, current,
    and with ``state_path`` the lock the last upgrade applied. Reads a few directory entries and files and starts no
    process, so the audit's extra round trip costs the host little."""
    venvs_dir = os.path.join(serving_root, "venvs")
    venvs = []
    if os.path.isdir(venvs_dir):
        for name in sorted(os.listdir(venvs_dir)):
            path = os.path.join(venvs_dir, name)
            if os.path.isdir(path) and not os.path.islink(path):
                verified = read(os.path.join(path, MARK))
                venvs.append({"name": name, "path": path, "mtime": os.stat(path).st_mtime, "verified": verified})
    current_link = os.path.join(serving_root, "current")
    current = os.path.realpath(current_link) if os.path.islink(current_link) else None
    glibc = platform.libc_ver()[1] or ""
    found = {
        "arch": platform.machine(),
        "glibc": glibc,
        "platform": f"{platform.machine()}-manylinux_{glibc.replace('.', '_')}" if glibc else "",
        "venvs": venvs,
        "current": current,
        "current_is_link": os.path.islink(current_link),
    }
    if state_path:
        found["recorded"] = recorded_lock(serving_root, state_path)
    return found


def inspect(serving_root, tools_root, python, wheelhouse):
    """What the role decides on: locate's platform, venvs and current, and Python, uv, free disk, current packages,
    wheelhouse."""
    found = locate(serving_root)
    current = found["current"]
    venvs_dir = os.path.join(serving_root, "venvs")
    installed = None
    if current and os.path.exists(os.path.join(current, "bin", "python")):
        out = run([os.path.join(current, "bin", "python"), "-c", LIST_PACKAGES])
        installed = json.loads(out) if out else None
    uv = run([os.path.join(tools_root, "bin", "uv"), "--version"])
    return {
        **found,
        "python_exists": os.access(python, os.X_OK),
        "python_version": run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"]),
        "installed": installed,
        "uv_version": uv.split()[1] if uv and re.match(r"^uv \S+", uv) else None,
        "free_bytes": free_bytes(serving_root),
        # Only the hashes recorded for unchanged files: the inspection reads no wheel (build hashes what it needs).
        "wheelhouse": recorded_hashes(wheelhouse) if os.path.isdir(wheelhouse) else {},
        "missing_dirs": [
            d for d in (venvs_dir, os.path.join(serving_root, "locks"), wheelhouse) if not os.path.isdir(d)
        ],
    }


# ---- build -------------------------------------------------------------------------------------------------


def write_text(path, text):
    """Write text through a temporary name; False when the file already holds it."""
    try:
        with open(path, encoding="utf-8") as handle:
            if handle.read() == text:
                return False
    except OSError:
        pass
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
    return True


def command(step, argv, timeout=1800):
    try:
        # pylint: disable-next=ansible-bad-function
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        shown = " ".join(argv[:4])
        out = "".join(x.decode(errors="replace") if isinstance(x, bytes) else x for x in (exc.stdout, exc.stderr) if x)
        raise StepError(step, f"{shown} ... did not finish within {timeout} s", out.strip()) from None
    if proc.returncode != 0:
        shown = " ".join(argv[:4])
        output = (proc.stdout + proc.stderr).strip()
        raise StepError(step, f"{shown} ... exited {proc.returncode}: {cause(output)}", output)
    return proc


def cause(output, limit=600):
    """What a tool said went wrong, on one line, without the progress it printed before: from its first error line
    (``ERROR_LINE``: uv's, with its ``cause:`` lines, pip's) to the end, else its last three lines (a
    traceback ends with the exception)."""
    lines = [line.strip() for line in (output or "").splitlines() if line.strip()]
    first = next((n for n, line in enumerate(lines) if ERROR_LINE.match(line)), max(len(lines) - 3, 0))
    text = " ".join(lines[first:])
    return text if len(text) <= limit else text[: limit - 3] + "..."


def tools_uv_version(tools_root):
    out = run([os.path.join(tools_root, "bin", "uv"), "--version"])
    return out.split()[1] if out and re.match(r"^uv \S+", out) else None


def build_steps(spec, known):
    """The steps build would run for this spec on this host, in order, and the wheels it would fetch.

    Pushed wheels are not fetched: the controller copied them, and uv refuses one whose sha256 is not the lock's."""
    missing = missing_wheels(spec["wheels"], spec["wheelhouse"], known)
    missing = missing if spec.get("pull_base") else []
    steps = ["fetch"] if missing else []
    if read(spec["lock_file"]) != spec["lock_text"].strip():
        steps.append("lock file")
    if tools_uv_version(spec["tools_root"]) != spec["uv_version"]:
        steps.append("tools")
    if os.path.lexists(spec["venv"]) and spec["venv"] != spec.get("current"):
        steps.append("remove unverified")
    steps += ["venv", "sync", "verify", "mark"]
    return steps, missing


def build(spec, open_url):
    """Run the build's steps (see the module docstring); ``open_url`` opens the fleet cache's URLs (see fetch)."""
    seconds, started = {}, time.monotonic()

    def lap(step):
        nonlocal started
        now = time.monotonic()
        seconds[step] = round(now - started, 3)
        started = now

    recorded = recorded_hashes(spec["wheelhouse"]) if os.path.isdir(spec["wheelhouse"]) else {}
    known = dict(recorded)
    steps, missing = build_steps(spec, known)
    lap("steps")
    answer = {"ok": True, "changed": True, "steps": steps, "fetched": [w["filename"] for w in missing]}
    if spec.get("check"):
        return answer
    answer["seconds"] = seconds
    uv = os.path.join(spec["tools_root"], "bin", "uv")
    try:
        for folder in (
            os.path.join(spec["serving_root"], "venvs"),
            os.path.dirname(spec["lock_file"]),
            spec["wheelhouse"],
        ):
            os.makedirs(folder, mode=0o755, exist_ok=True)
        for wheel in missing:
            dest = os.path.join(spec["wheelhouse"], wheel["filename"])
            known[wheel["filename"]] = fetch(
                f"{spec['pull_base']}/{wheel['filename']}",
                dest,
                wheel["sha256"],
                spec.get("timeout", 600),
                wheel.get("size"),
                open_url,
            )
        if missing:
            lap("fetch")
        if known != recorded:
            record_hashes(spec["wheelhouse"], known)
        write_text(spec["lock_file"], spec["lock_text"])
        if "tools" in steps:
            write_text(spec["tools_file"], spec["tools_text"])
            if not os.path.exists(os.path.join(spec["tools_root"], "bin", "pip")):
                command("tools", [spec["python"], "-m", "venv", spec["tools_root"]])
            pip = [os.path.join(spec["tools_root"], "bin", "pip"), "install", "--no-index", "--find-links"]
            pip += [spec["wheelhouse"], "--require-hashes", "--disable-pip-version-check", "-r", spec["tools_file"]]
            command("tools", pip)
            lap("tools")
        if "remove unverified" in steps:
            shutil.rmtree(spec["venv"])
        command("venv", [uv, "venv", "--no-config", "--python", spec["python"], spec["venv"]])
        lap("venv")
        sync_venv(spec, uv)
        lap("sync")
        answer["verify"] = verify(spec, uv)
        # Imports that need the NVIDIA driver on a host that serves without one: not failed, shown to the operator.
        answer["not_judged"] = (answer["verify"].get("checks") or {}).get("not_judged") or {}
        lap("verify")
        if not answer["verify"].get("ok"):
            raise StepError("verify", "; ".join(answer["verify"].get("failures") or ["no answer"]))
        write_text(os.path.join(spec["venv"], MARK), spec["mark"] + "\n")
        lap("mark")
    except StepError as exc:
        answer.update(ok=False, failed_step=exc.step, error=exc.error, output=exc.output[-4000:])
        after_failure(spec, answer, exc.path)
    except OSError as exc:
        answer.update(ok=False, failed_step="build", error=f"{type(exc).__name__}: {exc}")
        after_failure(spec, answer, exc.filename)
    return answer


def after_failure(spec, answer, path=None):
    """Remove the venv the failed build began, then, when the disk was full, say where (``no_space``)."""
    removed = remove_partial(spec)
    if removed:
        answer["removed"] = removed
    full = full_disk(spec, answer["failed_step"], f"{answer['error']}\n{answer.get('output', '')}", path)
    if full:
        answer["no_space"] = full


def remove_partial(spec):
    """Remove the venv a failed build left at the new venv's path (never the one current points at, nor a verified
    one), so that a full disk gets its space back in the same run; its path, or None."""
    venv, current = spec["venv"], spec.get("current")
    if not os.path.isdir(venv) or os.path.islink(venv) or os.path.exists(os.path.join(venv, MARK)):
        return None
    if current and os.path.realpath(venv) == os.path.realpath(current):
        return None
    shutil.rmtree(venv, ignore_errors=True)
    return None if os.path.lexists(venv) else venv


def full_disk(spec, step, text, path=None):
    """{mount, free_bytes, seen} of a failure that was a full disk, else None: ``seen`` is the path that could not be
    written (from the error, or the path the tool named), else the folder the step writes."""
    if not NO_SPACE.search(text or ""):
        return None
    # uv: "failed to write to file `PATH`: No space left on device"; Python: "No space left on device: 'PATH'".
    named = re.search(r"[`'\"](/[^`'\"]+)[`'\"]: No space left|No space left on device: [`'\"](/[^`'\"]+)", text)
    folders = {"fetch": spec["wheelhouse"], "tools": spec["tools_root"]}
    seen = path or (named and (named.group(1) or named.group(2))) or folders.get(step, os.path.dirname(spec["venv"]))
    mount = os.path.abspath(seen)
    while not os.path.exists(mount):
        mount = os.path.dirname(mount)
    while not os.path.ismount(mount):
        mount = os.path.dirname(mount)
    return {"mount": mount, "free_bytes": free_bytes(mount), "seen": seen}


def build_cache(spec):
    """The build's own uv cache: under the serving root, on the venvs' file system (hardlinks need it), not among the
    venvs; new for every build and removed after it (the host lock keeps builds on one host one at a time)."""
    return os.path.join(spec["serving_root"], ".uv-build-cache")


def sync_venv(spec, uv):
    """Install exactly the lock into the new venv: uv unpacks each wheel once into the build's own cache and
    hardlinks the files into the venv, then the cache is removed, so each venv file has one link and no cache or
    other venv shares it (an edit to one venv reaches nothing else; a repair never reuses a damaged file), and no
    unpacked copy of the stack stays on the host's disk. Bytecode is compiled here, while the host still serves,
    not by the serving start after the switch."""
    cache = build_cache(spec)
    shutil.rmtree(cache, ignore_errors=True)  # a killed build's leftovers
    try:
        command("sync", sync_argv(spec, uv, cache), timeout=int(spec.get("sync_timeout") or 3600))
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def sync_argv(spec, uv, cache):
    """The uv command of sync_venv (bench/venv_rebuild.py times the same command without Ansible)."""
    sync = [uv, "pip", "sync", "--no-config", "--require-hashes", "--no-index", "--link-mode", "hardlink"]
    sync += ["--cache-dir", cache, "--find-links", spec["wheelhouse"]]
    sync += ["--python", os.path.join(spec["venv"], "bin", "python")]
    sync += ["--compile-bytecode"] if spec.get("compile_bytecode") else []
    return [*sync, spec["lock_file"]]


def verify(spec, uv):
    """Run the verifier (verify_venv.py's source) with the new venv's Python: imports happen inside that venv."""
    python = os.path.join(spec["venv"], "bin", "python")
    proc = subprocess.run(  # pylint: disable=ansible-bad-function
        [python, "-c", spec["verifier"], json.dumps(spec["verify"]), uv],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    try:
        return json.loads(proc.stdout)
    except ValueError:
        return {
            "ok": False,
            "failures": [f"the verifier exited {proc.returncode}: {(proc.stdout + proc.stderr)[-2000:]}"],
        }


def main(argv):
    """The script entry point (inspect, locate) that role venv_rebuild runs through raw, outside any module: its
    answer goes to stdout, as a module's would."""
    if argv[:1] == ["inspect"] and len(argv) == 5:
        print(json.dumps(inspect(*argv[1:5])))  # pylint: disable=ansible-bad-function
        return 0
    if argv[:1] == ["locate"] and len(argv) in (2, 3):
        print(json.dumps(locate(*argv[1:3])))  # pylint: disable=ansible-bad-function
        return 0
    print(__doc__, file=sys.stderr)  # pylint: disable=ansible-bad-function
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))  # pylint: disable=ansible-bad-function
