# Copyright: (c) 2026, gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The shapes of the real cu130 set's big wheels, and lab wheels padded to those shapes.

A wheel's install cost is not its size alone: pip and uv unpack every file, and pip compiles every ``.py`` to
bytecode. A torch wheel holds 12,482 entries (2,227 ``.py``), flashinfer-cubin 8,947 cubins. A lab wheel padded
with one large file keeps the bytes and loses that cost, so ``pad_wheel`` fills a lab stand-in with the file
counts, bytes and compressed bytes of the real wheel, by extension, read from ``lab/wheels/shapes.json``.

``shapes.json`` is recorded from the default index by ``scripts/record_index_data.py --shapes``: the central
directory of each real wheel, read with HTTP range requests (a few hundred kB of a 500 MB wheel), summarised by
``shape_of``. The default index does not carry flashinfer-jit-cache, so its shape is an estimate
(``jit_cache_estimate``), and says so.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import itertools
import json
import os
import posixpath
import zipfile
from pathlib import Path

from lab.common import LAB_SRC

SHAPES = LAB_SRC / "wheels" / "shapes.json"
LARGEST = 8  # files described one by one; the rest by extension
SHAPE_DIR = "_lab_shape"
MB = 1_000_000
# The lab stand-ins of the real set's big wheels: (lab project, version) -> the real project whose shape it takes.
STAND_INS = {
    ("lab-torch", "2.11.0+cu130"): "torch",
    ("lab-flashinfer-jit-cache", "0.6.4+cu130"): "flashinfer-jit-cache",
    ("lab-sgl-kernel", "0.3.21+cu130"): "sgl-kernel",
    ("lab-flashinfer-cubin", "0.6.4"): "flashinfer-cubin",
}
# flashinfer-jit-cache cu130 x86_64 (stack facts: about 1.9 GB; not on the default index). Its layout is
# flashinfer_jit_cache/jit_cache/<module>/<module>.so; flashinfer's own figures give 96 modules for 280-400 MB,
# about 3.5 MB each, so 1.9 GB holds about 540 modules.
JIT_CACHE_BYTES = 1900 * MB
JIT_CACHE_MODULES = 540


def _ext(name: str) -> str:
    if name.endswith("/"):
        return "/"
    base = posixpath.basename(name)
    return os.path.splitext(base)[1].lower() if "." in base.lstrip(".") else ""


def shape_of(infos: list[zipfile.ZipInfo], filename: str, size: int) -> dict:
    """A wheel's shape from its central directory: entries, folders, bytes and compressed bytes by extension
    (directory entries under "/"), with the ``LARGEST`` files one by one."""
    files = [i for i in infos if not i.filename.endswith("/")]
    files.sort(key=lambda i: (-i.file_size, i.filename))
    groups: dict[str, dict] = {}
    for info in [i for i in infos if i.filename.endswith("/")] + files[LARGEST:]:
        g = groups.setdefault(_ext(info.filename), {"files": 0, "bytes": 0, "compressed": 0})
        g["files"] += 1
        g["bytes"] += info.file_size
        g["compressed"] += info.compress_size
    return {
        "filename": filename,
        "size": size,
        "entries": len(infos),
        "dirs": len({posixpath.dirname(i.filename) for i in files}),
        "largest": [
            {"ext": _ext(i.filename), "bytes": i.file_size, "compressed": i.compress_size} for i in files[:LARGEST]
        ],
        "groups": dict(sorted(groups.items())),
    }


def jit_cache_estimate(recorded: dict) -> dict:
    """flashinfer-jit-cache's shape, estimated: ``JIT_CACHE_MODULES`` .so files in a folder each, of
    ``JIT_CACHE_BYTES`` compressed in all, at the compression ratio of sgl-kernel's recorded .so files."""
    so = [f for f in recorded["sgl-kernel"]["largest"] if f["ext"] == ".so"]
    so_group = recorded["sgl-kernel"]["groups"].get(".so", {"bytes": 0, "compressed": 0})
    ratio = (sum(f["bytes"] for f in so) + so_group["bytes"]) / (
        sum(f["compressed"] for f in so) + so_group["compressed"]
    )
    compressed = JIT_CACHE_BYTES - 200_000
    return {
        "filename": "flashinfer_jit_cache-0.6.4+cu130-cp39-abi3-manylinux_2_28_x86_64.whl",
        "size": JIT_CACHE_BYTES,
        "estimated": (
            f"not on the default index: {JIT_CACHE_MODULES} .so modules in a folder each, {JIT_CACHE_BYTES} bytes"
            f" compressed, at sgl-kernel's recorded .so ratio ({ratio:.2f})"
        ),
        "entries": JIT_CACHE_MODULES + 8,
        "dirs": JIT_CACHE_MODULES + 2,
        "largest": [],
        "groups": {
            ".so": {"files": JIT_CACHE_MODULES, "bytes": int(compressed * ratio), "compressed": compressed},
            ".py": {"files": 6, "bytes": 600_000, "compressed": 150_000},
            "": {"files": 2, "bytes": 200_000, "compressed": 50_000},
        },
    }


def load_shapes(path: Path = SHAPES) -> dict:
    """project -> shape: the recorded ones plus the jit-cache estimate."""
    recorded = json.loads(path.read_text())["wheels"]
    return {**recorded, "flashinfer-jit-cache": jit_cache_estimate(recorded)}


def plan_files(shape: dict, scale: int) -> list[tuple[str, int, int]]:
    """(relative path, bytes, compressed bytes) of the files that give ``shape`` at 1/scale: file counts, folders
    and bytes divided by scale (at least one file per extension), the largest files kept, their bytes scaled."""
    if scale < 1:
        raise ValueError(f"scale {scale}: give 1 (real sizes) or more (1/scale of them)")
    dirs = max(1, shape["dirs"] // scale)
    files = [
        (f"big{i}{f['ext']}", f["bytes"] // scale, f["compressed"] // scale) for i, f in enumerate(shape["largest"])
    ]
    n = 0
    for ext, g in shape["groups"].items():
        if ext == "/":
            continue
        count = max(1, round(g["files"] / scale))
        each, each_c = g["bytes"] // scale // count, g["compressed"] // scale // count
        for _ in range(count):
            files.append((f"d{n % dirs}/f{n}{ext}", each, each_c))
            n += 1
    return files


def _stream(seed: str, size: int):
    """``size`` deterministic incompressible bytes (shake_256 of the seed), in chunks of up to 1 MiB."""
    for i, left in enumerate(range(size, 0, -(1 << 20))):
        yield hashlib.shake_256(f"{seed}:{i}".encode()).digest(min(left, 1 << 20))


_PY_FILL = (
    "def f{n}(a, b=None, *args, **kw):\n"
    "    if a is None:\n"
    "        return [b, args, kw]\n"
    "    return [x + {n} for x in a]\n\n"
)
_HEX_RATIO = 0.8  # deflate's output per byte of the hex constants' lines, with the code between them


def py_source(seed: str, size: int, compressed: int) -> bytes:
    """A valid Python module of ``size`` bytes that deflates to about ``compressed`` bytes: string constants of
    random hex (the incompressible share) and small functions (the code pip compiles)."""
    hex_bytes = min(size, int(compressed / _HEX_RATIO))
    out = io.StringIO()
    out.write(f'"""Lab padding {seed}."""\n')
    raw = b"".join(_stream(seed, hex_bytes // 2 + 1)).hex()
    for i in range(0, hex_bytes, 64):
        out.write(f'_C{i // 64} = "{raw[i : i + 64]}"\n')
    n = 0
    while out.tell() < size:
        out.write(_PY_FILL.format(n=n))
        n += 1
    return out.getvalue().encode()


def _b64(digest: bytes) -> str:
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def _write_member(zout: zipfile.ZipFile, name: str, size: int, compressed: int, seed: str) -> list[str]:
    """Write one padding file; returns its RECORD row. Binary files are ``compressed`` random bytes then zeros
    (deflate keeps the first and all but erases the second); ``.py`` files are Python source."""
    info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
    info.external_attr = 0o644 << 16
    info.compress_type = zipfile.ZIP_DEFLATED if compressed < size else zipfile.ZIP_STORED
    if name.endswith(".py"):
        chunks = [py_source(seed, size, compressed)]
    else:
        zeros = bytes(1 << 20)
        fill = (zeros[: min(left, 1 << 20)] for left in range(size - min(compressed, size), 0, -(1 << 20)))
        chunks = itertools.chain(_stream(seed, min(compressed, size)), fill)
    digest, written = hashlib.sha256(), 0
    with zout.open(info, "w", force_zip64=size > (1 << 31)) as out:
        for chunk in chunks:
            digest.update(chunk)
            out.write(chunk)
            written += len(chunk)
    return [name, f"sha256={_b64(digest.digest())}", str(written)]


def pad_wheel(src: Path, dest: Path, shape: dict, scale: int) -> None:
    """Copy the lab wheel ``src`` to ``dest`` with the files of ``plan_files(shape, scale)`` under
    ``<package>/_lab_shape/`` and a RECORD that lists them. The content is deterministic (seeded by the wheel's
    name), so the same scale gives the same sha256 on every machine; nothing imports the padding."""
    with zipfile.ZipFile(src) as zin:
        infos = zin.infolist()
        record_name = next(i.filename for i in infos if i.filename.endswith(".dist-info/RECORD"))
        package = next(i.filename.split("/")[0] for i in infos if ".dist-info/" not in i.filename)
        tmp = dest.with_name(f".{dest.name}.tmp")
        rows = [r for r in csv.reader(io.StringIO(zin.read(record_name).decode())) if r and r[0] != record_name]
        with zipfile.ZipFile(tmp, "w", allowZip64=True, compresslevel=1) as zout:
            for info in infos:
                if info.filename != record_name:
                    zout.writestr(info, zin.read(info), compress_type=info.compress_type)
            for rel, size, compressed in plan_files(shape, scale):
                name = f"{package}/{SHAPE_DIR}/{rel}"
                rows.append(_write_member(zout, name, size, compressed, f"{src.name}:{rel}"))
            rows.append([record_name, "", ""])
            buf = io.StringIO()
            csv.writer(buf, lineterminator="\n").writerows(rows)
            rinfo = zin.getinfo(record_name)
            zout.writestr(rinfo, buf.getvalue(), compress_type=rinfo.compress_type)
    os.replace(tmp, dest)
