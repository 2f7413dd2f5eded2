# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Benchmark: the install alone, on this machine, no Ansible and no lab node: role venv_rebuild's host code against
pip, and the floor of unpacking the same bytes.

    python bench/venv_install.py [--scale 1] [--repeats 2] [--uv PATH] [--python PATH]

bench/venv_rebuild.py times whole playbook runs on a lab node of this 2-core machine. This one times only what a
host does to install the lock, so that it can run where the cores are: on a GPU host (the device machine), with
the lab-main wheels carried there. The lock is the sized set's big wheels (lab.wheels.sized_index: the real
cu130 wheels' shapes at 1/scale), with their sha256. Every run gets a fresh venv folder and empty tool caches, and
the file system is synced first. Methods:

- role:  ``uv venv`` and venv_rebuild's own ``sync_venv`` (plugins/module_utils/_venv_host.py: the build's own
         cache on the venv's file system, hardlinks, bytecode compiled, the cache removed);
- pip:   ``python -m venv`` and ``pip install --no-index --require-hashes --no-deps -r LOCK`` (what
         ansible.builtin.pip runs for such a lock; pip compiles bytecode);
- unzip: the wheels unpacked by ``unzip -q``, one process per wheel at once (the bytes' floor: inflate and write,
         no installer), when unzip is on the PATH.

Prints one JSON object: medians, pip/role, role/unzip, cores.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from lab.common import venv_host_module  # noqa: E402
from lab.wheel_shapes import STAND_INS  # noqa: E402
from lab.wheels import sized_index, wheel_key  # noqa: E402

venv_host = venv_host_module()


def run(argv: list[str], **kw) -> None:
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, **kw)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scale", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--uv", default=shutil.which("uv") or str(Path(sys.executable).with_name("uv")))
    ap.add_argument("--python", default=sys.executable, help="the Python the venvs are built on")
    ap.add_argument("--work", default=str(REPO / ".lab" / "venv-install-bench"), help="folder of the venvs")
    args = ap.parse_args(argv)

    sized = sized_index(args.scale)
    wheels = sorted(w for w in Path(sized["root"]).glob("*.whl") if wheel_key(w) in STAND_INS)
    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    lock = work / "lock.txt"
    lines = []
    for w in wheels:
        name, version = wheel_key(w)
        with w.open("rb") as handle:  # streamed: a real-size wheel is up to 1.9 GB
            digest = hashlib.file_digest(handle, "sha256").hexdigest()
        lines.append(f"{name}=={version} --hash=sha256:{digest}")
    lock.write_text("\n".join(lines) + "\n")
    venv = work / "venv"
    env = {**os.environ, "UV_CACHE_DIR": str(work / "uv-shared-cache"), "PIP_NO_CACHE_DIR": "1"}
    env.pop("PIP_CONSTRAINT", None)

    def role():
        run([args.uv, "venv", "-q", "--no-config", "--python", args.python, str(venv)], env=env)
        spec = {"serving_root": str(work), "venv": str(venv), "wheelhouse": str(sized["root"])}
        venv_host.sync_venv({**spec, "lock_file": str(lock), "compile_bytecode": True}, args.uv)

    def pip():
        run([args.python, "-m", "venv", str(venv)], env=env)
        pip_cmd = [str(venv / "bin" / "pip"), "install", "-q", "--isolated", "--no-index", "--find-links"]
        run([*pip_cmd, str(sized["root"]), "--require-hashes", "--no-deps", "-r", str(lock)], env=env)

    def unzip():
        venv.mkdir()
        procs = [subprocess.Popen(["unzip", "-q", "-o", str(w), "-d", str(venv / w.name)]) for w in wheels]
        if any(p.wait() for p in procs):
            raise RuntimeError("unzip failed")

    methods = {"role": role, "pip": pip}
    if shutil.which("unzip"):
        methods["unzip"] = unzip
    times: dict[str, list[float]] = {}
    for _ in range(args.repeats):
        for name, fn in methods.items():
            shutil.rmtree(venv, ignore_errors=True)
            shutil.rmtree(work / "uv-shared-cache", ignore_errors=True)
            os.sync()
            t0 = time.monotonic()
            fn()
            times.setdefault(name, []).append(time.monotonic() - t0)
    shutil.rmtree(work, ignore_errors=True)
    med = {k: round(statistics.median(v), 2) for k, v in times.items()}
    out = {
        "scale": args.scale,
        "wheels": {w.name: w.stat().st_size for w in wheels},
        "cores": os.cpu_count(),
        "python": args.python,
        "repeats": args.repeats,
        "median_s": med,
        "runs_s": {k: [round(x, 2) for x in v] for k, v in times.items()},
        "pip/role": round(med["pip"] / med["role"], 2),
    }
    if "unzip" in med:
        out["role/unzip"] = round(med["role"] / med["unzip"], 2)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
