# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The CUDA of a wheel read from its shared objects' DT_NEEDED entries (_elf), and the lock rules judging by it.

The shared objects are real ELF files built here with gcc, linked against stand-in CUDA libraries that carry the real
sonames (libcudart.so.13 ...), then zipped into wheels as the planner's wheelhouse holds them."""

from __future__ import annotations

import pathlib
import shutil
import subprocess
import zipfile

import pytest

from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _elf
from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _lock_rules as lr

GCC = shutil.which("gcc")
needs_gcc = pytest.mark.skipif(GCC is None, reason="gcc is not installed: the tests build real shared objects with it")
KERNEL_WHEEL = "sglang_kernel-0.4.10-cp310-abi3-manylinux2014_x86_64.whl"


def _gcc(*args):
    subprocess.run([GCC, *args], check=True, capture_output=True)


def fake_library(tmp_path, soname):
    """A shared library whose soname is ``soname`` (libcudart.so.13), at tmp_path/soname."""
    src = tmp_path / "lib.c"
    src.write_text(f"int lib_{abs(hash(soname))}(void) {{ return 1; }}\n")
    out = tmp_path / soname
    _gcc("-shared", "-fPIC", "-o", str(out), f"-Wl,-soname,{soname}", str(src))
    return out


def shared_object(tmp_path, name, sonames):
    """A shared object at tmp_path/name that links (DT_NEEDED) the stand-in libraries of ``sonames``."""
    for soname in sonames:
        if not (tmp_path / soname).exists():
            fake_library(tmp_path, soname)
    src = tmp_path / f"{name}.c"
    src.write_text("int op(void) { return 2; }\n")
    out = tmp_path / name
    links = [f"-l:{soname}" for soname in sonames]
    _gcc("-shared", "-fPIC", "-o", str(out), str(src), f"-L{tmp_path}", "-Wl,--no-as-needed", *links)
    return out


def wheel(tmp_path, filename, members):
    """A wheel (zip) at tmp_path/filename holding ``members`` ({path in the wheel: local file or bytes})."""
    path = tmp_path / filename
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for arcname, content in members.items():
            if isinstance(content, bytes):
                zf.writestr(arcname, content)
            else:
                zf.write(content, arcname)
        dist = filename.split("-")[0] + "-" + filename.split("-")[1] + ".dist-info"
        zf.writestr(f"{dist}/METADATA", "Metadata-Version: 2.1\nName: x\nVersion: 1\n")
    return path


def entry(name, version, filename):
    return {"name": name, "version": version, "filename": filename}


def profile(cuda="13.0", exceptions=()):
    return {"name": "p", "cuda": {"version": cuda}, "wheels": {"rules": {"cuda_exceptions": list(exceptions)}}}


@pytest.mark.parametrize(
    ("soname", "major"),
    [
        ("libcudart.so.13", 13),
        ("libcudart.so.11.0", 11),
        ("libcublasLt.so.12", 12),
        ("libnvrtc-builtins.so.13.0", 13),
        ("libnvJitLink.so.13", 13),
        ("libnppc.so.12", 12),
        ("libcuda.so.1", None),  # the driver: any CUDA
        ("libcufft.so.11", None),  # numbered on its own (CUDA 12's)
        ("libcurand.so.10", None),
        ("libnccl.so.2", None),
        ("libc.so.6", None),
        ("libcudart_static.a", None),
    ],
)
def test_the_cuda_major_of_a_toolkit_library_s_soname(soname, major):
    assert _elf.cuda_major_of_soname(soname) == major


@needs_gcc
def test_needed_entries_of_a_real_shared_object(tmp_path):
    so = shared_object(tmp_path, "common_ops.so", ["libcudart.so.13", "libcublas.so.13"])
    with so.open("rb") as stream:
        needed = _elf.needed(stream)
    assert needed[:2] == ["libcudart.so.13", "libcublas.so.13"]


def test_a_file_that_is_no_elf_file_has_no_needed_entries(tmp_path):
    script = tmp_path / "libfoo.so"
    script.write_text("/* GNU ld script */\nINPUT(libfoo.so.1)\n")
    with script.open("rb") as stream:
        assert _elf.needed(stream) is None


@needs_gcc
def test_a_kernel_wheel_without_a_cuda_tag_is_cuda_13_by_its_libraries(tmp_path):
    so = shared_object(tmp_path, "common_ops.so", ["libcuda.so.1", "libcudart.so.13", "libnvrtc.so.13"])
    path = wheel(tmp_path, KERNEL_WHEEL, {"sgl_kernel/common_ops.so": so, "sgl_kernel/__init__.py": b""})
    assert _elf.wheel_cuda(str(path)) == (13, "libcudart.so.13 in sgl_kernel/common_ops.so")


@needs_gcc
def test_a_wheel_whose_libraries_link_two_cuda_majors_names_both(tmp_path):
    new = shared_object(tmp_path, "sm90.so", ["libcublas.so.13"])
    old = shared_object(tmp_path, "sm80.so", ["libcudart.so.12"])
    path = wheel(tmp_path, KERNEL_WHEEL, {"k/sm90/ops.so": new, "k/sm80/ops.so": old})
    assert _elf.wheel_cuda(str(path)) == (
        [12, 13],
        "libcudart.so.12 in k/sm80/ops.so, libcublas.so.13 in k/sm90/ops.so",
    )


@needs_gcc
def test_a_wheel_linking_only_the_driver_is_built_for_no_particular_cuda(tmp_path):
    so = shared_object(tmp_path, "ops.so", ["libcuda.so.1"])
    path = wheel(tmp_path, KERNEL_WHEEL, {"k/ops.so": so, "k/linker_script.so": b"INPUT(libk.so.1)\n"})
    assert _elf.wheel_needed(str(path))["k/ops.so"][0] == "libcuda.so.1"
    assert _elf.wheel_cuda(str(path)) is None


def test_a_damaged_shared_object_is_named(tmp_path):
    path = wheel(tmp_path, KERNEL_WHEEL, {"sgl_kernel/common_ops.so": b"\x7fELF\x02\x01\x01" + b"\xff" * 9})
    with pytest.raises(_elf.ElfReadError, match=r"sgl_kernel/common_ops.so is a damaged ELF file"):
        _elf.wheel_needed(str(path))


@needs_gcc
def test_the_lock_rules_judge_a_kernel_wheel_in_the_wheelhouse_by_its_libraries(tmp_path):
    so = shared_object(tmp_path, "common_ops.so", ["libcudart.so.13"])
    wheelhouse = tmp_path / "wheelhouse"
    wheelhouse.mkdir()
    wheel(wheelhouse, KERNEL_WHEEL, {"sgl_kernel/common_ops.so": so})
    entries = [
        entry("sglang-kernel", "0.4.10", KERNEL_WHEEL),
        # Not in the wheelhouse (a dependency fetched after the lock): judged by its name and version only.
        entry("other-kernel", "1.0", "other_kernel-1.0-cp312-cp312-manylinux_2_28_x86_64.whl"),
    ]
    report = lr.judge_lock(entries, {"sglang-kernel": [lr.ROOT]}, {}, profile(), wheelhouse=str(wheelhouse))
    assert report["cuda"] == {
        "sglang-kernel": {"version": "0.4.10", "cuda": 13, "from": "from libcudart.so.13 in sgl_kernel/common_ops.so"}
    }
    assert report["cuda_unread"] == []
    assert (
        "CUDA builds: sglang-kernel 0.4.10 (CUDA 13, from libcudart.so.13 in sgl_kernel/common_ops.so)"
        in lr.report_lines(report)
    )
    # Without the wheelhouse nothing tells its CUDA.
    assert lr.judge_lock(entries, {}, {}, profile())["cuda"] == {}


@needs_gcc
def test_a_cuda_13_kernel_wheel_in_a_cuda_12_lock_is_refused_naming_the_library(tmp_path):
    so = shared_object(tmp_path, "common_ops.so", ["libcudart.so.13"])
    wheel(tmp_path, KERNEL_WHEEL, {"sgl_kernel/common_ops.so": so})
    entries = [
        entry("sglang-kernel", "0.4.10", KERNEL_WHEEL),
        entry("sglang", "0.5.23", "sglang-0.5.23-py3-none-any.whl"),
    ]
    graph = {"sglang-kernel": ["sglang"], "sglang": [lr.ROOT]}
    with pytest.raises(lr.LockRefused) as err:
        lr.judge_lock(entries, graph, {}, profile(cuda="12.8"), wheelhouse=str(tmp_path))
    assert (
        "sglang-kernel 0.4.10 is built for CUDA 13 (from libcudart.so.13 in sgl_kernel/common_ops.so), the profile's"
        " CUDA is 12.8; required by sglang 0.5.23" in str(err.value)
    )
    allowed = lr.judge_lock(
        entries,
        graph,
        {},
        profile(cuda="12.8", exceptions=[{"package": "sglang-kernel", "reason": "r"}]),
        wheelhouse=str(tmp_path),
    )
    assert allowed["cuda_allowed"][0].endswith("allowed by wheels.rules.cuda_exceptions: r")


def test_a_damaged_kernel_wheel_refuses_the_lock(tmp_path):
    wheel(tmp_path, KERNEL_WHEEL, {"sgl_kernel/common_ops.so": b"\x7fELF\x02\x01\x01" + b"\xff" * 9})
    with pytest.raises(lr.LockRefused, match=r"common_ops.so is a damaged ELF file .*Fix: delete the file"):
        lr.judge_lock([entry("sglang-kernel", "0.4.10", KERNEL_WHEEL)], {}, {}, profile(), wheelhouse=str(tmp_path))


def kernel_torch_lock(wheelhouse, kernel_so):
    """A lock of a kernel wheel (holding ``kernel_so``), a CUDA 13 torch and its runtime, both wheels in
    ``wheelhouse``; torch's shared object is no ELF file: torch is judged by the NVIDIA libraries it requires."""
    wheel(wheelhouse, KERNEL_WHEEL, {"sgl_kernel/common_ops.so": kernel_so})
    torch = "torch-2.14.1-cp312-cp312-manylinux_2_28_x86_64.whl"
    wheel(wheelhouse, torch, {"torch/lib/libtorch_cuda.so": b"\x7fELF"})
    return [
        entry("sglang-kernel", "0.4.10", KERNEL_WHEEL),
        entry("torch", "2.14.1", torch),
        entry("nvidia-cuda-runtime", "13.0.96", "nvidia_cuda_runtime-13.0.96-py3-none-manylinux_2_28_x86_64.whl"),
    ]


def test_without_pyelftools_the_wheels_left_unread_are_named(tmp_path, monkeypatch):
    monkeypatch.setattr(lr, "HAS_ELFTOOLS", False)
    entries = kernel_torch_lock(tmp_path, b"\x7fELF")
    report = lr.judge_lock(entries, {"nvidia-cuda-runtime": ["torch"]}, {}, profile(), wheelhouse=str(tmp_path))
    assert report["cuda_unread"] == ["sglang-kernel 0.4.10"]
    assert lr.report_lines(report)[-1] == (
        "not judged: the CUDA of sglang-kernel 0.4.10 (their shared objects were not read: pyelftools is not"
        " installed on the controller; pip install pyelftools)"
    )


@needs_gcc
def test_after_the_fetch_a_dependency_s_kernel_wheel_is_judged_by_its_libraries(tmp_path):
    entries = kernel_torch_lock(tmp_path, shared_object(tmp_path, "common_ops.so", ["libcudart.so.12"]))
    with pytest.raises(
        lr.LockRefused,
        match=r"refused after its wheels were fetched: sglang-kernel 0.4.10 is built"
        r" for CUDA 12 \(from libcudart.so.12 in sgl_kernel/common_ops.so\)",
    ):
        lr.judge_linked_cuda(entries, profile(), str(tmp_path), {"sglang-kernel": ["sglang"]})
    ok = lr.judge_linked_cuda(entries, profile(cuda="12.8"), str(tmp_path))
    assert ok["cuda"] == {
        "sglang-kernel": {"version": "0.4.10", "cuda": 12, "from": "from libcudart.so.12 in sgl_kernel/common_ops.so"}
    }


class _HeldFetcher:
    """The wheelhouse already holds every file: fetch_wheelhouse downloads nothing."""

    def download(self, url, dest, sha256, record):
        assert pathlib.Path(dest).exists(), f"the test's wheelhouse lacks {dest}"
        return False


@needs_gcc
def test_the_fetch_refuses_a_lock_whose_dependency_links_another_cuda_and_records_a_good_one(tmp_path):
    from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _wheel_plan as wp

    entries = kernel_torch_lock(tmp_path, shared_object(tmp_path, "common_ops.so", ["libcudart.so.12"]))
    wheel(tmp_path, entries[2]["filename"], {"nvidia/cu13/lib/libcudart.so.13": b"not read"})
    packages = [dict(e, url=f"file://{tmp_path / e['filename']}", sha256="0" * 64) for e in entries]

    def lock():
        return {
            "packages": [dict(p) for p in packages],
            "tools": [],
            "lock_rules": {"required_by": {"sglang-kernel": ["sglang"]}},
        }

    with pytest.raises(
        lr.LockRefused, match=r"after its wheels were fetched: sglang-kernel 0.4.10 is built for CUDA 12"
    ):
        wp.fetch_wheelhouse(_HeldFetcher(), lock(), str(tmp_path), profile())
    good = lock()
    wp.fetch_wheelhouse(_HeldFetcher(), good, str(tmp_path), profile(cuda="12.8"))
    assert good["lock_rules"]["cuda"]["sglang-kernel"]["cuda"] == 12
    # Without the profile (a reviewed lock file applied: judged when it was planned) nothing is judged.
    untouched = lock()
    wp.fetch_wheelhouse(_HeldFetcher(), untouched, str(tmp_path))
    assert "cuda" not in untouched["lock_rules"]
