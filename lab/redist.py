# Copyright: (c) 2026, gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""CUDA redistributable mirror built from NVIDIA's CUDA component wheels.

The tree mimics NVIDIA's redist layout: ``redistrib_<release>.json`` beside
``<component>/linux-x86_64/<component>-linux-x86_64-<ver>-archive.tar.xz``; each archive unpacks to one
top folder holding the toolkit sub-folders (bin/, include/, lib/, nvvm/) to merge into a toolkit root.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
import zipfile
from pathlib import Path

from lab.common import CACHE, MIRRORS, hash_paths, log, replace_dir, write_atomic
from lab.fetch import fetch

PLATFORM = "linux-x86_64"
ARCHIVE_MTIME = "@1735689600"  # fixed member mtime: identical inputs give identical archives

NAMES = {
    "cuda_nvcc": "CUDA NVCC",
    "cuda_crt": "CUDA crt",
    "libnvvm": "libnvvm",
    "cuda_cudart": "CUDA Runtime (cudart)",
    "cuda_cccl": "CXX Core Compute Libraries",
}

# The 12.8 nvcc wheel carries ptxas, nvvm and headers but not the nvcc driver itself; the archive gets a
# stand-in `bin/nvcc` that answers --version exactly like 12.8.93 and refuses to compile.
NVCC_128_STANDIN = """#!/bin/sh
# Lab stand-in: the nvidia-cuda-nvcc-cu12 12.8.93 wheel ships no nvcc driver binary.
# ptxas and libnvvm beside this file are NVIDIA's real 12.8 binaries.
case "$1" in
  --version|-V)
    cat <<'BANNER'
nvcc: NVIDIA (R) Cuda compiler driver
Copyright (c) 2005-2025 NVIDIA Corporation
Built on Fri_Feb_21_20:23:50_PST_2025
Cuda compilation tools, release 12.8, V12.8.93
Build cuda_12.8.r12.8/compiler.35583870_0
BANNER
    exit 0 ;;
esac
echo "nvcc (lab stand-in for CUDA 12.8): compiling is not available in the lab" >&2
exit 1
"""

# release -> release_date, components: name -> (wheel requirement, prefix in the wheel, moves, links, extra files)
RELEASES = {
    "12.8.1": {
        "release_date": "2025-03-05",
        "components": {
            "cuda_nvcc": {
                "wheel": "nvidia-cuda-nvcc-cu12==12.8.93",
                "prefix": "nvidia/cuda_nvcc/",
                "extra": {"bin/nvcc": NVCC_128_STANDIN},
            },
            "cuda_cudart": {
                "wheel": "nvidia-cuda-runtime-cu12==12.8.90",
                "prefix": "nvidia/cuda_runtime/",
                "links": {"lib/libcudart.so": "libcudart.so.12"},
            },
            "cuda_cccl": {"wheel": "nvidia-cuda-cccl-cu12==12.8.90", "prefix": "nvidia/cuda_cccl/"},
        },
    },
    "13.0.2": {
        "release_date": "2025-10-09",
        "components": {
            "cuda_nvcc": {"wheel": "nvidia-cuda-nvcc==13.0.88", "prefix": "nvidia/cu13/"},
            "cuda_crt": {"wheel": "nvidia-cuda-crt==13.0.88", "prefix": "nvidia/cu13/"},
            "libnvvm": {
                "wheel": "nvidia-nvvm==13.0.88",
                "prefix": "nvidia/cu13/",
                "moves": {"lib/": "nvvm/lib64/", "include/": "nvvm/include/"},
                "links": {"nvvm/lib64/libnvvm.so": "libnvvm.so.4"},
            },
            "cuda_cudart": {
                "wheel": "nvidia-cuda-runtime==13.0.96",
                "prefix": "nvidia/cu13/",
                "links": {"lib/libcudart.so": "libcudart.so.13"},
            },
            "cuda_cccl": {"wheel": "nvidia-cuda-cccl==13.0.85", "prefix": "nvidia/cu13/"},
        },
    },
}


def recipe_hash() -> str:
    return hash_paths([Path(__file__)], extra=json.dumps(RELEASES, sort_keys=True))[:12]


def _version(wheel_req: str) -> str:
    return wheel_req.split("==", 1)[1]


def _unpack(wheel: Path, spec: dict, top: Path) -> None:
    prefix = spec["prefix"]
    moves = spec.get("moves", {})
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            name = info.filename
            if ".dist-info/" in name and name.lower().endswith(("license.txt", "license")):
                (top / "LICENSE").write_bytes(zf.read(info))
                continue
            if not name.startswith(prefix) or name.endswith("/"):
                continue
            rel = name[len(prefix) :]
            # Python package markers and NVIDIA's packaging scan reports have no place in a toolkit tree.
            if rel.endswith("__init__.py") or rel.startswith(".metadata/"):
                continue
            for src, dst in moves.items():
                if rel.startswith(src):
                    rel = dst + rel[len(src) :]
                    break
            out = top / rel
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(zf.read(info))
            mode = (info.external_attr >> 16) & 0o777
            out.chmod(mode or 0o644)
    for rel, content in spec.get("extra", {}).items():
        out = top / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(content)
        out.chmod(0o755)
    for rel, target in spec.get("links", {}).items():
        link = top / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(target)


def _digests(path: Path) -> tuple[str, str]:
    sha, md5 = hashlib.sha256(), hashlib.md5()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            sha.update(chunk)
            md5.update(chunk)
    return sha.hexdigest(), md5.hexdigest()


def _archive(staging: Path, topname: str, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = (
        f"tar -C {staging} --sort=name --owner=0 --group=0 --numeric-owner --mtime={ARCHIVE_MTIME} "
        f"-cf - {topname} | xz -T0 -1 > {out}"
    )
    subprocess.run(["bash", "-o", "pipefail", "-c", cmd], check=True)


def build(dest: Path = MIRRORS / "redist", force: bool = False) -> dict:
    """Build the redist tree unless its stamp matches the recipe; return a summary with timings."""
    stamp = dest / ".recipe"
    if not force and stamp.exists() and stamp.read_text().strip() == recipe_hash():
        log(f"redist mirror up to date ({dest})")
        return {"cached": True}
    t0 = time.monotonic()
    tmp = dest.with_name(f".tmp-{dest.name}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    staging_root = CACHE / f"redist-staging-{os.getpid()}"
    summary = {"cached": False, "archives": {}}
    try:
        for release, rel in RELEASES.items():
            manifest = {
                "release_date": rel["release_date"],
                "release_label": release,
                "release_product": "cuda",
            }
            for comp, spec in rel["components"].items():
                version = _version(spec["wheel"])
                wheel = fetch(spec["wheel"])
                topname = f"{comp}-{PLATFORM}-{version}-archive"
                staging = staging_root / f"{release}-{comp}"
                _unpack(wheel, spec, staging / topname)
                relpath = f"{comp}/{PLATFORM}/{topname}.tar.xz"
                out = tmp / relpath
                if not out.exists():
                    t = time.monotonic()
                    _archive(staging, topname, out)
                    log(f"archived {relpath} ({out.stat().st_size / 1e6:.1f} MB, {time.monotonic() - t:.1f}s)")
                shutil.rmtree(staging)
                sha, md5 = _digests(out)
                manifest[comp] = {
                    "name": NAMES[comp],
                    "license": "CUDA Toolkit",
                    "version": version,
                    PLATFORM: {"relative_path": relpath, "sha256": sha, "md5": md5, "size": str(out.stat().st_size)},
                }
                summary["archives"][relpath] = out.stat().st_size
            (tmp / f"redistrib_{release}.json").write_text(json.dumps(manifest, indent=2) + "\n")
        (tmp / ".recipe").write_text(recipe_hash() + "\n")
        replace_dir(tmp, dest)
    finally:
        shutil.rmtree(staging_root, ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)
    summary["seconds"] = round(time.monotonic() - t0, 1)
    write_atomic(dest.parent / "redist-build.json", json.dumps(summary, indent=2) + "\n")
    log(f"redist mirror built in {summary['seconds']}s")
    return summary
