# Copyright: (c) 2026, gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Lab mirrors: build the wheelhouses and the CUDA redist tree once, serve them on loopback.

lab-main and lab-stale are pypiserver indexes (PEP 503 HTML with #sha256 fragments, pypiserver's
``/<project>/json``, Last-Modified and Range on files). pypiserver has no PEP 691 JSON: lab-main gets it
from lab.serve.Pep691 (with PEP 700 size and upload-time); lab-stale is HTML-only on purpose.
redist is a static tree at ``/redist/`` with Last-Modified.
Servers are detached processes with pid files and JSON-lines access logs under .lab/mirrors/.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from lab import redist, wheels
from lab.common import MIRRORS, REPO, free_port, hash_paths, log, mirror_ports, mirror_urls, port_open

RUN = MIRRORS / "run"
LOGS = MIRRORS / "logs"


@contextlib.contextmanager
def _locked():
    """One lab command at a time changes the mirrors: tests, xdist workers and helpers share them."""
    MIRRORS.mkdir(parents=True, exist_ok=True)
    with (MIRRORS / ".lock").open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def build(force: bool = False) -> dict:
    t0 = time.monotonic()
    with _locked():
        out = {"wheels": wheels.build(MIRRORS, force=force), "redist": redist.build(MIRRORS / "redist", force=force)}
    out["seconds"] = round(time.monotonic() - t0, 1)
    return out


def is_built() -> bool:
    return all((MIRRORS / d).is_dir() for d in ("lab-main", "lab-stale", "redist"))


def _servers(ports: dict[str, int]) -> dict[str, list[str]]:
    return {
        # lab-main also answers PEP 691/700 JSON like the public index; lab-stale stays HTML-only (PEP 503,
        # dates only from Last-Modified) like a static per-CUDA wheel index.
        "lab-main": ["--kind", "pypi", "--root", str(MIRRORS / "lab-main"), "--pep691"],
        "lab-stale": ["--kind", "pypi", "--root", str(MIRRORS / "lab-stale")],
        "redist": ["--kind", "static", "--root", str(MIRRORS / "redist"), "--prefix", "/redist"],
    }


def pid_file(name: str, port: int) -> Path:
    return RUN / f"{name}-{port}.pid"


def access_log(name: str, port: int | None = None) -> Path:
    """JSON-lines request log of one mirror (one object per request: path, status, bytes, ts)."""
    port = port or mirror_ports()[name]
    return LOGS / f"{name}-{port}.access.jsonl"


def read_access_log(name: str, port: int | None = None, since: float = 0.0) -> list[dict]:
    path = access_log(name, port)
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if rec.get("ts", 0) >= since:
            rows.append(rec)
    return rows


def _code_hash() -> str:
    return hash_paths([Path(__file__).with_name("serve.py")])[:12]


def _started_code(name: str, port: int) -> str | None:
    lines = pid_file(name, port).read_text().split() if pid_file(name, port).exists() else []
    return lines[1] if len(lines) > 1 else None


def _serves(proc: Path, port: int) -> bool:
    """Whether the process /proc/<pid> is a lab.serve on the port (False when it is gone or unreadable)."""
    try:
        cmdline = (proc / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"lab.serve" in cmdline and str(port).encode() in cmdline


def _our_pid(name: str, port: int) -> int | None:
    """The pid from the pid file if that process is still our server (pids get reused)."""
    try:
        pid = int(pid_file(name, port).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return pid if _serves(Path(f"/proc/{pid}"), port) else None


def _other_server(port: int) -> str:
    """The lab.serve process of another checkout on the port, as 'pid N in DIR', or '' if none is found."""
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and _serves(proc, port):
            try:
                return f"pid {proc.name} in {os.readlink(proc / 'cwd')}"
            except OSError:
                continue
    return ""


def start(ports: dict[str, int] | None = None) -> dict:
    """Start the three servers unless they already run; idempotent."""
    ports = ports or mirror_ports()
    with _locked():
        return _start(ports)


def _start(ports: dict[str, int]) -> dict:
    if not is_built():
        raise RuntimeError("mirrors are not built: run `python -m lab mirrors build` first")
    RUN.mkdir(parents=True, exist_ok=True)
    LOGS.mkdir(parents=True, exist_ok=True)
    started = []
    for name, args in _servers(ports).items():
        port = ports[name]
        if _our_pid(name, port):
            continue
        if port_open(port):
            # Never share another checkout's mirror: its access log is not this checkout's, so every test that counts
            # requests (download economy, one copy per run) would read an empty log and fail without saying why.
            other = _other_server(port)
            raise RuntimeError(
                f"mirror {name}: 127.0.0.1:{port} is in use by "
                + (f"another checkout's lab mirror ({other})" if other else "another process")
                + "; stop it (`python -m lab mirrors stop` in that checkout) or choose another port "
                f"({'LAB_' + name.upper().replace('LAB-', '').replace('-', '_')}_PORT)"
            )
        cmd = [
            sys.executable,
            "-m",
            "lab.serve",
            *args,
            "--port",
            str(port),
            "--name",
            name,
            "--access-log",
            str(access_log(name, port)),
        ]
        with (LOGS / f"{name}-{port}.log").open("a") as out:
            proc = subprocess.Popen(
                cmd,
                cwd=REPO,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        pid_file(name, port).write_text(f"{proc.pid}\n{_code_hash()}\n")
        started.append((name, port, proc))
    deadline = time.monotonic() + 20
    for name, port, proc in started:
        while not port_open(port):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"mirror {name} did not come up on {port}; see {LOGS / f'{name}-{port}.log'}")
            time.sleep(0.1)
        log(f"mirror {name} up on 127.0.0.1:{port} (pid {proc.pid})")
    return {"started": [n for n, _, _ in started], "urls": mirror_urls(ports)}


def restart(ports: dict[str, int] | None = None) -> dict:
    """Stop and start under one lock (the gap is well under a second), e.g. after lab/serve.py changed."""
    ports = ports or mirror_ports()
    with _locked():
        stopped = _stop(ports)
        return {"stopped": stopped, **_start(ports)}


def stop(ports: dict[str, int] | None = None) -> list[str]:
    ports = ports or mirror_ports()
    with _locked():
        return _stop(ports)


def _stop(ports: dict[str, int]) -> list[str]:
    stopped = []
    for name, port in ports.items():
        pid = _our_pid(name, port)
        if pid:
            os.kill(pid, signal.SIGTERM)
            for _ in range(50):
                if not port_open(port):
                    break
                time.sleep(0.1)
            stopped.append(name)
        pid_file(name, port).unlink(missing_ok=True)
    return stopped


def status(ports: dict[str, int] | None = None) -> dict:
    ports = ports or mirror_ports()
    urls = mirror_urls(ports)
    out = {}
    for name, port in ports.items():
        rows = read_access_log(name, port)
        out[name] = {
            "url": urls[name],
            "port": port,
            "pid": _our_pid(name, port),
            # False: the server runs an older lab/serve.py; `mirrors restart` picks the new one up.
            "code_current": _started_code(name, port) == _code_hash() if _our_pid(name, port) else None,
            "listening": port_open(port),
            "requests": len(rows),
            "bytes_served": sum(r.get("bytes") or 0 for r in rows),
        }
    out["built"] = is_built()
    return out


def running(ports: dict[str, int] | None = None) -> bool:
    ports = ports or mirror_ports()
    return all(port_open(p) for p in ports.values())


class PrivateServer:
    """One lab.serve server on a free loopback port beside the shared mirrors, with its own access log: a test or a
    benchmark that counts its own requests, or serves another set of files (the sized wheels), starts one and stops
    it at its end. ``args`` are lab.serve's (``--kind``, ``--root`` ...); ``url`` ends in ``path``."""

    def __init__(self, name: str, args: list[str], path: str, access_log: Path | str, log_file: Path | None = None):
        self.port = free_port(set(mirror_ports().values()))
        argv = [sys.executable, "-m", "lab.serve", *args, "--port", str(self.port), "--name", name]
        argv += ["--access-log", str(access_log)]
        with open(log_file or os.devnull, "ab") as out:
            self.proc = subprocess.Popen(argv, cwd=REPO, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{self.port}{path}"
        deadline = time.monotonic() + 30
        while True:  # listening is not enough: wait until it answers, so the next free_port() cannot pick its port
            try:
                with urllib.request.urlopen(self.url + "/", timeout=2):
                    return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    code = self.proc.poll()
                    self.stop()
                    raise RuntimeError(f"{name}: lab.serve on {self.url} did not start (exit {code})") from None
                time.sleep(0.2)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
        self.proc.wait(timeout=10)

    def __enter__(self) -> PrivateServer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


@contextlib.contextmanager
def index_copies(base: Path, prefix: str):
    """Private copies of lab-main (PEP 691 on) and lab-stale under ``base``, file dates kept, each served by its own
    PrivateServer with its own access log (``<base>/<name>.jsonl``): a test that publishes to an index, or counts its
    requests, changes nothing for the others. Yields ``{name: server}``; each server also has ``root`` and ``log``."""
    servers: dict[str, PrivateServer] = {}
    try:
        for name, extra in (("lab-main", ["--pep691"]), ("lab-stale", [])):
            root, log = base / name, base / f"{name}.jsonl"
            shutil.copytree(MIRRORS / name, root, copy_function=shutil.copy2)
            server = PrivateServer(f"{prefix}-{name}", ["--kind", "pypi", "--root", str(root), *extra], "/simple", log)
            server.root, server.log = root, log
            servers[name] = server
        yield servers
    finally:
        for server in servers.values():
            server.stop()
