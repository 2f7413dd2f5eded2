# Copyright: (c) 2026, gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Paths, ports and small helpers shared by the lab commands."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LAB_SRC = REPO / "lab"
STATE = Path(os.environ.get("GPUFLEET_LAB_STATE", REPO / ".lab"))
MIRRORS = STATE / "mirrors"
CACHE = STATE / "cache"
CONTAINERS_CONF = LAB_SRC / "containers.conf"
IMAGE_REPO = "localhost/gpufleet-lab-node"

# Mirror ports: fixed defaults shared by every lab on the machine (docs/design.md);
# the environment moves them for parallel runs.
DEFAULT_PORTS = {"lab-main": 38100, "lab-stale": 38101, "redist": 38102}
PORT_ENV = {"lab-main": "LAB_MAIN_PORT", "lab-stale": "LAB_STALE_PORT", "redist": "LAB_REDIST_PORT"}


def mirror_ports(overrides: dict[str, int | None] | None = None) -> dict[str, int]:
    ports = {}
    for name, default in DEFAULT_PORTS.items():
        value = (overrides or {}).get(name) or os.environ.get(PORT_ENV[name]) or default
        ports[name] = int(value)
    return ports


def mirror_urls(ports: dict[str, int]) -> dict[str, str]:
    return {
        "lab-main": f"http://127.0.0.1:{ports['lab-main']}/simple",
        "lab-stale": f"http://127.0.0.1:{ports['lab-stale']}/simple",
        "redist": f"http://127.0.0.1:{ports['redist']}/redist",
    }


def log(msg: str) -> None:
    print(f"[lab {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def podman_env() -> dict[str, str]:
    env = dict(os.environ)
    env["CONTAINERS_CONF"] = str(CONTAINERS_CONF)
    return env


def run(cmd, *, check=True, capture=False, env=None, input=None, cwd=None, timeout=None):
    """Run a command; on failure raise with its output so the caller sees why."""
    res = subprocess.run(
        cmd,
        check=False,
        text=True,
        capture_output=capture,
        env=env,
        input=input,
        cwd=cwd,
        timeout=timeout,
    )
    if check and res.returncode != 0:
        detail = f"\nstdout: {res.stdout}\nstderr: {res.stderr}" if capture else ""
        raise RuntimeError(f"command failed (rc={res.returncode}): {cmd}{detail}")
    return res


def podman(*args, check=True, capture=True, input=None, timeout=None):
    return run(["podman", *args], check=check, capture=capture, env=podman_env(), input=input, timeout=timeout)


def hash_paths(paths, extra: str = "") -> str:
    """Content hash of files and trees (names + bytes), used as a cache key for recipes."""
    h = hashlib.sha256(extra.encode())
    for root in sorted(Path(p) for p in paths):
        files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
        for f in files:
            if "__pycache__" in f.parts:
                continue
            rel = f.relative_to(REPO) if f.is_relative_to(REPO) else f
            h.update(str(rel).encode() + b"\0")
            h.update(f.read_bytes() + b"\0")
    return h.hexdigest()


def replace_dir(tmp: Path, final: Path) -> None:
    """Move a finished build over its final path so a killed build never leaves half a tree."""
    old = final.with_name(f".old-{final.name}-{os.getpid()}")
    if final.exists():
        final.rename(old)
    tmp.rename(final)
    if old.exists():
        shutil.rmtree(old)


def write_atomic(path: Path, data: str | bytes, mode: int | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    if isinstance(data, str):
        tmp.write_text(data)
    else:
        tmp.write_bytes(data)
    if mode is not None:
        tmp.chmod(mode)
    tmp.rename(path)


def free_port(exclude: set[int] | None = None) -> int:
    """A loopback port nobody listens on now (and that the caller has not handed out yet)."""
    exclude = exclude or set()
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in exclude and port < 60000:
            return port
    raise RuntimeError("no free loopback port found")


def port_open(port: int, host: str = "127.0.0.1", timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def require_root_tools() -> None:
    """Install podman, runc and debootstrap when missing (the lab's only system packages)."""
    missing = [t for t in ("podman", "runc", "debootstrap") if shutil.which(t) is None]
    if not missing:
        return
    if os.geteuid() != 0:
        raise RuntimeError(f"missing {missing}; run as root: apt-get install -y podman runc debootstrap")
    log(f"installing {missing} with apt-get")
    run(["apt-get", "update"])
    run(["apt-get", "install", "-y", "podman", "runc", "debootstrap"])


def venv_host_module():
    """plugins/module_utils/_venv_host.py (role venv_rebuild's and module venv_build's host code), for benchmarks."""
    spec = importlib.util.spec_from_file_location("venv_host", REPO / "plugins" / "module_utils" / "_venv_host.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
