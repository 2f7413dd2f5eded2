# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Read, in one round trip, what venv_rebuild decides on: platform, Python, venvs, current, uv, free disk, and the
packages of the current venv. Read-only; stdlib only; prints one JSON object.

Usage: inspect_host.py SERVING_ROOT TOOLS_ROOT PYTHON WHEELHOUSE
"""

import hashlib
import json
import os
import platform
import re
import subprocess
import sys

LIST_PACKAGES = (
    "import importlib.metadata as m, json, re;"
    "print(json.dumps(sorted(re.sub(r'[-_.]+', '-', d.metadata['Name']).lower() + '==' + d.version"
    " for d in m.distributions() if d.metadata['Name'].lower() not in ('pip', 'setuptools', 'wheel'))))"
)


def run(argv):
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    except OSError:
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


def wheelhouse_hashes(folder):
    """sha256 of every wheel already on the host: wheels of an unchanged lock are not copied again."""
    out = {}
    if os.path.isdir(folder):
        for name in os.listdir(folder):
            if name.endswith(".whl"):
                digest = hashlib.sha256()
                with open(os.path.join(folder, name), "rb") as handle:
                    for chunk in iter(lambda: handle.read(1 << 20), b""):
                        digest.update(chunk)
                out[name] = digest.hexdigest()
    return out


def main(serving_root, tools_root, python, wheelhouse):
    venvs_dir = os.path.join(serving_root, "venvs")
    venvs = []
    if os.path.isdir(venvs_dir):
        for name in sorted(os.listdir(venvs_dir)):
            path = os.path.join(venvs_dir, name)
            if os.path.isdir(path) and not os.path.islink(path):
                verified = read(os.path.join(path, ".gpufleet-verified"))
                venvs.append({"name": name, "path": path, "mtime": os.stat(path).st_mtime, "verified": verified})
    current_link = os.path.join(serving_root, "current")
    current = os.path.realpath(current_link) if os.path.islink(current_link) else None
    installed = None
    if current and os.path.exists(os.path.join(current, "bin", "python")):
        out = run([os.path.join(current, "bin", "python"), "-c", LIST_PACKAGES])
        installed = json.loads(out) if out else None
    uv = run([os.path.join(tools_root, "bin", "uv"), "--version"])
    glibc = platform.libc_ver()[1] or ""
    print(
        json.dumps(
            {
                "arch": platform.machine(),
                "glibc": glibc,
                "platform": f"{platform.machine()}-manylinux_{glibc.replace('.', '_')}" if glibc else "",
                "python_exists": os.access(python, os.X_OK),
                "python_version": run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"]),
                "venvs": venvs,
                "current": current,
                "current_is_link": os.path.islink(current_link),
                "installed": installed,
                "uv_version": uv.split()[1] if uv and re.match(r"^uv \S+", uv) else None,
                "free_bytes": free_bytes(serving_root),
                "wheelhouse": wheelhouse_hashes(wheelhouse),
                "missing_dirs": [
                    d
                    for d in (os.path.join(serving_root, "venvs"), os.path.join(serving_root, "locks"), wheelhouse)
                    if not os.path.isdir(d)
                ],
            }
        )
    )


if __name__ == "__main__":
    main(*sys.argv[1:5])
