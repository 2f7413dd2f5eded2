# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Incident bundle: what an engineer needs to understand a failed or rolled-back host, in one archive written on the
host (module incident_bundle) and fetched into the run's folder. Secrets are redacted from every environment before
anything is written. Pure functions, and a collector that takes the module's run_command."""

from __future__ import annotations

import io
import json
import os
import re
import tarfile
import time

REDACTED = "<redacted>"
# A variable whose name holds one of these words is a secret, whatever its value looks like.
SECRET_NAME_RE = re.compile(
    r"TOKEN|SECRET|PASSW(OR)?D|PASSPHRASE|AUTH|CREDENTIAL|PRIVATE|COOKIE|SESSION|(^|_)KEY($|_)|API_?KEY|ACCESS_KEY|SIGNATURE",
    re.IGNORECASE,
)
# user:password@ in a URL (an index URL with credentials) is a secret in any variable.
URL_CREDENTIALS_RE = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)[^/@\s:]+:[^/@\s]+@")
RUN_STAMP_RE = re.compile(r"(\d{4})(\d{2})(\d{2})T(\d{2})(\d{2})(\d{2})Z")
KERNEL_GPU_RE = re.compile(r"NVRM|Xid|nvidia|nvlink|nvswitch|pcieport.*(AER|error)", re.IGNORECASE)


def is_secret(name: str) -> bool:
    return bool(SECRET_NAME_RE.search(name or ""))


def redact_value(name: str, value: str) -> str:
    if is_secret(name):
        return REDACTED
    return URL_CREDENTIALS_RE.sub(lambda m: f"{m.group('scheme')}{REDACTED}@", value)


def redact_env(env: dict) -> dict:
    return {k: redact_value(k, str(v)) for k, v in env.items()}


def redact_env_file(text: str) -> str:
    """An environment file (systemd EnvironmentFile, shell style): every KEY=VALUE line's value redacted where the key
    says secret or the value holds URL credentials; comments and blank lines kept."""
    out = []
    for line in (text or "").splitlines():
        stripped = line.strip()
        body = stripped[len("export ") :] if stripped.startswith("export ") else stripped
        if not body or body.startswith(("#", ";")) or "=" not in body:
            out.append(line)
            continue
        key, value = body.split("=", 1)
        key = key.strip()
        quote = value[:1] if value[:1] in ("'", '"') and value.endswith(value[:1]) and len(value) > 1 else ""
        inner = value[1:-1] if quote else value
        new = redact_value(key, inner)
        prefix = "export " if stripped.startswith("export ") else ""
        out.append(f"{prefix}{key}={quote}{new}{quote}")
    return "\n".join(out) + ("\n" if out else "")


def parse_environ(raw: bytes) -> dict:
    """/proc/<pid>/environ: NUL-separated KEY=VALUE."""
    env = {}
    for item in (raw or b"").split(b"\0"):
        if b"=" in item:
            key, value = item.split(b"=", 1)
            env[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
    return env


def environ_text(env: dict) -> str:
    return "".join(f"{k}={v}\n" for k, v in sorted(redact_env(env).items()))


def run_started(run_id: str) -> str | None:
    """The run's start from its id (``[kind-]20261208T001203Z-123456``), as journalctl's --since takes it."""
    m = RUN_STAMP_RE.search(run_id or "")
    if not m:
        return None
    y, mo, d, h, mi, s = m.groups()
    return f"{y}-{mo}-{d} {h}:{mi}:{s} UTC"


def gpu_kernel_lines(text: str) -> str:
    return "".join(line + "\n" for line in (text or "").splitlines() if KERNEL_GPU_RE.search(line))


def venv_packages(venv: str) -> str:
    """name==version of every distribution a venv holds, read from its .dist-info folders (no interpreter run: a
    broken venv is what a failed host may have)."""
    found = []
    lib = os.path.join(venv, "lib")
    for pyver in sorted(os.listdir(lib)) if os.path.isdir(lib) else []:
        site = os.path.join(lib, pyver, "site-packages")
        for entry in sorted(os.listdir(site)) if os.path.isdir(site) else []:
            if entry.endswith(".dist-info"):
                name, _sep, version = entry[: -len(".dist-info")].partition("-")
                found.append(f"{name}=={version}")
    return "".join(f"{line}\n" for line in sorted(found, key=str.lower))


class Collector:
    """Gathers the bundle's members; every item that cannot be had is listed in MANIFEST.json with the reason."""

    def __init__(self, run, which, read_bytes=None):
        self.run, self.which = run, which
        self.read_bytes = read_bytes or _read_bytes
        self.members: dict[str, bytes] = {}
        self.missing: dict[str, str] = {}

    def add(self, name: str, data) -> None:
        self.members[name] = data.encode() if isinstance(data, str) else data

    def command(self, name: str, argv: list, keep=None) -> str | None:
        tool = self.which(argv[0])
        if not tool:
            self.missing[name] = f"{argv[0]} is not installed"
            return None
        rc, out, err = self.run([tool, *argv[1:]])
        if rc != 0:
            self.missing[name] = f"{' '.join(argv)}: rc {rc}: {(err or '').strip()[:300]}"
            return None
        self.add(name, keep(out) if keep else out)
        return out

    def file(self, name: str, path: str, transform=None) -> None:
        try:
            data = self.read_bytes(path)
        except OSError as exc:
            self.missing[name] = f"{path}: {exc.strerror or exc}"
            return
        self.add(name, transform(data) if transform else data)

    def manifest(self, meta: dict) -> bytes:
        doc = dict(meta, members=sorted(self.members), missing=dict(sorted(self.missing.items())))
        return (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()


def _read_bytes(path: str) -> bytes:
    with open(path, "rb") as fh:
        return fh.read()


def collect(c: Collector, p: dict, main_pid: int | None) -> None:
    """Every item of the bundle, in the archive's layout (p: the module's parameters)."""
    since = p.get("since") or run_started(p.get("run_id") or "")
    unit = p.get("unit")
    if unit:
        argv = ["journalctl", "-u", unit, "--no-pager", "-o", "short-iso-precise"]
        c.command(f"journal/{unit}.log", argv + (["--since", since] if since else []))
    if c.command("kernel/gpu-errors.log", ["journalctl", "-k", "-b", "--no-pager"], gpu_kernel_lines) is None:
        if c.command("kernel/gpu-errors.log", ["dmesg"], gpu_kernel_lines) is not None:
            c.missing.pop("kernel/gpu-errors.log", None)
    c.command("nvidia-smi-q.txt", ["nvidia-smi", "-q"])
    for label, venv in (p.get("venvs") or {}).items():
        if venv and os.path.isdir(venv):
            c.add(f"venvs/{label}.txt", f"# {venv}\n" + venv_packages(venv))
        elif venv:
            c.missing[f"venvs/{label}.txt"] = f"{venv}: no such folder"
    state_dir = p.get("state_dir")
    if state_dir:
        c.file("state.json", os.path.join(state_dir, "state.json"))
        results = os.path.join(state_dir, "results")
        names = sorted(n for n in os.listdir(results) if n.startswith("postcheck-")) if os.path.isdir(results) else []
        for name in names[-int(p.get("postcheck_results") or 3) :]:
            c.file(f"postcheck/{name}", os.path.join(results, name))
        if not names:
            c.missing["postcheck/"] = f"{results}: no post-check result"
    if p.get("env_file"):
        c.file("env/unit.env", p["env_file"], lambda b: redact_env_file(b.decode("utf-8", "replace")).encode())
    if main_pid:
        c.file("env/process.environ", f"/proc/{main_pid}/environ", lambda b: environ_text(parse_environ(b)).encode())
    for name, content in sorted((p.get("extra") or {}).items()):
        c.add(name, content if isinstance(content, str) else json.dumps(content, indent=2, sort_keys=True) + "\n")


def write_archive(dest: str, members: dict, mtime: float | None = None) -> int:
    """Write a .tar.gz under a staging name, then rename it over ``dest``; returns its size."""
    mtime = time.time() if mtime is None else mtime
    os.makedirs(os.path.dirname(dest) or ".", exist_ok=True)
    staging = f"{dest}.partial-{os.getpid()}"
    top = os.path.basename(dest).split(".tar")[0]
    with tarfile.open(staging, "w:gz") as tar:
        for name, data in sorted(members.items()):
            info = tarfile.TarInfo(f"{top}/{name}")
            info.size, info.mtime, info.mode = len(data), int(mtime), 0o600
            tar.addfile(info, io.BytesIO(data))
    os.chmod(staging, 0o600)
    os.replace(staging, dest)
    return os.path.getsize(dest)
