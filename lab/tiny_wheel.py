# Copyright: (c) 2026, gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A small but real wheel written directly (no build backend): METADATA with Requires-Dist, WHEEL with its tag,
RECORD with real hashes. Installable by uv; for tests of the planner and the venv checks.

    tiny_wheel(folder, "torchvision", "0.26.0", requires=["torch==2.11.0"], tag="cp311-cp311-manylinux_2_17_x86_64")
"""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path


def tiny_wheel(
    folder: Path, name: str, version: str, requires=(), tag: str = "py3-none-any", files=None, meta_version=None
) -> Path:
    """``files``: more members of the package ({path inside the package: text}); ``meta_version``: a METADATA
    version other than the file name's (a wheel whose METADATA disagrees with its name)."""
    dist = name.replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    purelib = "true" if tag.endswith("-none-any") else "false"
    members = {
        f"{dist}/__init__.py": f"__version__ = {version!r}\n",
        **{f"{dist}/{path}": text for path, text in (files or {}).items()},
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {meta_version or version}\n"
        + "".join(f"Requires-Dist: {r}\n" for r in requires),
        f"{info}/WHEEL": f"Wheel-Version: 1.0\nGenerator: gpufleet-test\nRoot-Is-Purelib: {purelib}\nTag: {tag}\n",
    }
    rows = []
    path = Path(folder) / f"{dist}-{version}-{tag}.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for member, text in members.items():
            zf.writestr(member, text)
            digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
            rows.append(f"{member},sha256={digest},{len(text.encode())}")
        zf.writestr(f"{info}/RECORD", "\n".join([*rows, f"{info}/RECORD,,"]) + "\n")
    return path
