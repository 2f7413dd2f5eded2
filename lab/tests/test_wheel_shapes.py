# Copyright: (c) 2026, gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""lab.wheel_shapes: the recorded shapes and the padded lab wheels that copy them (no podman, no network)."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import zipfile
from pathlib import Path

import pytest

from lab import wheel_shapes


def _wheel(path: Path) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("lab_torch/__init__.py", "VERSION = '2.11.0+cu130'\n")
        zf.writestr("lab_torch-2.11.0+cu130.dist-info/METADATA", "Metadata-Version: 2.1\nName: lab-torch\n")
        zf.writestr(
            "lab_torch-2.11.0+cu130.dist-info/RECORD",
            "lab_torch/__init__.py,,\nlab_torch-2.11.0+cu130.dist-info/METADATA,,\n",
        )
    return path


def test_shape_of_counts_files_by_extension_and_keeps_the_largest_apart(tmp_path):
    path = tmp_path / "w.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("pkg/", "")
        zf.writestr("pkg/lib/big.so", b"\0" * 50_000)
        for i in range(3):
            zf.writestr(f"pkg/m{i}.py", f"x = {i}\n" * 100)
        zf.writestr("pkg/include/a.h", "int a;\n")
    with zipfile.ZipFile(path) as zf:
        shape = wheel_shapes.shape_of(zf.infolist(), "w.whl", path.stat().st_size)
    assert shape["entries"] == 6
    assert shape["dirs"] == 3  # pkg, pkg/lib, pkg/include
    assert shape["largest"][0]["ext"] == ".so" and shape["largest"][0]["bytes"] == 50_000
    assert shape["largest"][0]["compressed"] < 1000
    assert list(shape["groups"]) == ["/"]  # the folder entry; the 5 files are all among the largest 8
    assert shape["groups"]["/"]["files"] == 1


def test_recorded_shapes_hold_the_real_wheels_and_the_estimated_jit_cache():
    shapes = wheel_shapes.load_shapes()
    assert set(shapes) == set(wheel_shapes.STAND_INS.values())
    torch = shapes["torch"]
    assert torch["filename"].startswith("torch-2.11.0-cp312")
    counted = sum(g["files"] for g in torch["groups"].values()) + len(torch["largest"])
    assert counted == torch["entries"] > 10_000
    assert torch["groups"][".py"]["files"] > 2000
    assert "estimated" in shapes["flashinfer-jit-cache"] and "estimated" not in torch


@pytest.mark.parametrize("scale", [1000, 200])
def test_a_padded_wheel_has_the_scaled_shape_valid_python_and_a_true_record(tmp_path, scale):
    shape = wheel_shapes.load_shapes()["torch"]
    dest = tmp_path / "lab_torch-2.11.0+cu130-py3-none-any.whl"
    wheel_shapes.pad_wheel(_wheel(tmp_path / "src.whl"), dest, shape, scale)

    # on the wire: the real wheel's size at 1/scale, within the zip headers of the files
    plan = wheel_shapes.plan_files(shape, scale)
    assert abs(dest.stat().st_size - shape["size"] / scale) < 0.02 * shape["size"] / scale + 200 * len(plan)
    with zipfile.ZipFile(dest) as zf:
        padding = [i for i in zf.infolist() if f"/{wheel_shapes.SHAPE_DIR}/" in i.filename]
        by_ext = {}
        for info in padding:
            by_ext[wheel_shapes._ext(info.filename)] = by_ext.get(wheel_shapes._ext(info.filename), 0) + 1
        for ext, group in shape["groups"].items():
            if ext != "/":
                want = max(1, round(group["files"] / scale)) + sum(f["ext"] == ext for f in shape["largest"])
                assert by_ext[ext] == want, ext
        unpacked = sum(i.file_size for i in padding)
        assert abs(unpacked - sum(b for _, b, _ in plan)) < 0.01 * unpacked
        for info in padding:
            if info.filename.endswith(".py"):
                compile(zf.read(info), info.filename, "exec")  # pip compiles these: they must be Python
        record_name = next(n for n in zf.namelist() if n.endswith(".dist-info/RECORD"))
        rows = {r[0]: r for r in csv.reader(io.StringIO(zf.read(record_name).decode())) if r}
        assert set(rows) == set(zf.namelist())
        for info in padding:
            digest = base64.urlsafe_b64encode(hashlib.sha256(zf.read(info)).digest()).rstrip(b"=").decode()
            assert rows[info.filename][1:] == [f"sha256={digest}", str(info.file_size)]
        assert zf.read("lab_torch/__init__.py") == b"VERSION = '2.11.0+cu130'\n"


def test_padding_is_the_same_on_every_build(tmp_path):
    shape = wheel_shapes.load_shapes()["flashinfer-cubin"]
    src = _wheel(tmp_path / "src.whl")
    a, b = tmp_path / "a.whl", tmp_path / "b.whl"
    wheel_shapes.pad_wheel(src, a, shape, 1000)
    wheel_shapes.pad_wheel(src, b, shape, 1000)
    assert a.read_bytes() == b.read_bytes()


def test_a_scale_below_one_is_refused():
    with pytest.raises(ValueError, match="scale 0"):
        wheel_shapes.plan_files(wheel_shapes.load_shapes()["torch"], 0)
