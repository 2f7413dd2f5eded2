# Copyright: (c) 2026, gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Download exact wheels from the default index (the machine's pip configuration) into a cache."""

from __future__ import annotations

import sys
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

from lab.common import CACHE, log, run

DOWNLOADS = CACHE / "downloads"
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux_2_12_x86_64"]


def cached_wheel(req: str, dest: Path = DOWNLOADS) -> Path | None:
    r = Requirement(req)
    for f in sorted(dest.glob("*.whl")):
        name, version, _, _ = parse_wheel_filename(f.name)
        if name == canonicalize_name(r.name) and r.specifier.contains(version, prereleases=True):
            return f
    return None


def fetch(req: str, dest: Path = DOWNLOADS) -> Path:
    """One exact requirement, no dependencies: one pip call each, since pins of one name may differ."""
    hit = cached_wheel(req, dest)
    if hit:
        return hit
    dest.mkdir(parents=True, exist_ok=True)
    log(f"downloading {req}")
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:"]
    cmd += ["--python-version", "3.11", "--platform", "any"]
    for plat in PLATFORMS:
        cmd += ["--platform", plat]
    # pip writes the finished file under its final name only once complete, so a kill leaves no half wheel.
    run([*cmd, "-d", str(dest), req], capture=True)
    hit = cached_wheel(req, dest)
    if not hit:
        raise RuntimeError(f"pip download {req} gave no matching wheel in {dest}")
    return hit
