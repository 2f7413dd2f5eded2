# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the lock file's play (action wheel_lock) costs the controller on a lock of a real stack's size.

A lock of 210 packages and one tool (a resolved sglang stack has about 207), each wheel a real zip in the controller's
wheelhouse with a member count of its kind (torch about 13,000, a few large frameworks 2,000, most packages 40), the
wheelhouse's hash record already written (as after a plan): what the audit and every upgrade run pay, once per run.

    python bench/lock_file_checks.py setup DIR        # writes DIR/fleet.lock.yml and DIR/c/wheelhouse, one apply
    python bench/lock_file_checks.py run DIR [N]      # N applies in this process; prints the median ms of one

The collection imported is the one under GPUFLEET_COLLECTIONS_ROOT (a folder holding ansible_collections/gpufleet/
upgrade), else this checkout's: point it at a checkout of an older commit to compare. Whole process:

    farm-bench -n 7 -- python bench/lock_file_checks.py run DIR 1 --vs 'env GPUFLEET_COLLECTIONS_ROOT=OLD ...'
"""

from __future__ import annotations

import hashlib
import io
import os
import statistics
import sys
import time
import zipfile
from pathlib import Path
from unittest.mock import MagicMock

REPO = Path(__file__).resolve().parents[1]
PACKAGES = 210
INDEX = "http://127.0.0.1:38100"
PROFILE = {
    "name": "bench",
    "python": {"version": "3.12"},
    "wheels": {"indexes": [{"name": "main", "url": f"{INDEX}/simple"}], "packages": [], "rules": {}},
}


def _import_collection():
    root = os.environ.get("GPUFLEET_COLLECTIONS_ROOT")
    if not root:
        sys.path.insert(0, str(REPO / "tests"))
        from conftest import COLLECTIONS_ROOT

        root = str(COLLECTIONS_ROOT)
    sys.path.insert(0, root)
    from ansible_collections.gpufleet.upgrade.plugins.action import wheel_lock
    from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _lock_file

    return wheel_lock, _lock_file


def members(number: int) -> int:
    if number == 0:
        return 13000
    if number <= 10:
        return 2000
    if number <= 30:
        return 500
    return 40


def wheel(name: str, version: str, count: int) -> bytes:
    body = io.BytesIO()
    module = name.replace("-", "_")
    with zipfile.ZipFile(body, "w", zipfile.ZIP_STORED) as archive:
        for i in range(count):
            archive.writestr(f"{module}/m{i}.py", "x = 1\n")
        archive.writestr(
            f"{module}-{version}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
        )
    return body.getvalue()


def entry(folder: Path, name: str, version: str, count: int, role: str) -> dict:
    filename = f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
    body = wheel(name, version, count)
    (folder / filename).write_bytes(body)
    return {
        "name": name,
        "version": version,
        "filename": filename,
        "url": f"{INDEX}/files/{filename}",
        "sha256": hashlib.sha256(body).hexdigest(),
        "index": "main" if role == "profile" else None,
        "size": len(body),
        "role": role,
    }


def setup(folder: Path, lf) -> None:
    wheelhouse = folder / "c" / "wheelhouse"
    wheelhouse.mkdir(parents=True, exist_ok=True)
    packages = [entry(wheelhouse, f"pkg{i:03d}", "1.0.0", members(i), "dependency") for i in range(PACKAGES)]
    tools = [entry(wheelhouse, "uv", "0.13.8", 40, "tool")]
    digest = hashlib.sha256(b"".join(p["sha256"].encode() for p in packages)).hexdigest()
    lock = {
        "platform": "x86_64-manylinux_2_36",
        "python": "3.12",
        "hash": digest,
        "hash12": digest[:12],
        "venv_name": f"bench-{digest[:12]}",
        "packages": packages,
        "tools": tools,
        "overrides": [],
        "lock_rules": {},
    }
    lf.write(str(folder / "fleet.lock.yml"), lf.dumps(lf.make_document(PROFILE, [lock], "2026-12-08T00:00:00+00:00")))


def apply(folder: Path, action) -> dict:
    task = MagicMock()
    task.args = {"path": str(folder / "fleet.lock.yml"), "profile": PROFILE, "controller_dir": str(folder / "c")}
    task.check_mode = True
    task.async_val = 0
    task.action = "gpufleet.upgrade.wheel_lock"
    plugin = action.ActionModule(task, MagicMock(), MagicMock(), MagicMock(), MagicMock(), MagicMock())
    plugin._templar.template = lambda value: value
    result = plugin.run(task_vars={"inventory_hostname": "bench"})
    if result.get("failed"):
        raise SystemExit(result["msg"])
    return result


def main(argv: list) -> None:
    action, lf = _import_collection()
    folder = Path(argv[1])
    if argv[0] == "setup":
        folder.mkdir(parents=True, exist_ok=True)
        setup(folder, lf)
        apply(folder, action)  # the hash record, as a plan leaves it
        return
    times = []
    for _ in range(int(argv[2]) if len(argv) > 2 else 1):
        start = time.perf_counter()
        apply(folder, action)
        times.append((time.perf_counter() - start) * 1000)
    print(f"wheel_lock apply: median {statistics.median(times):.1f} ms over {len(times)} (min {min(times):.1f})")


if __name__ == "__main__":
    main(sys.argv[1:])
