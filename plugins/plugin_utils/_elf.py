# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The CUDA a wheel's compiled code is built for, read from the ``DT_NEEDED`` entries of its shared objects.

Some CUDA wheels say nothing of their CUDA in their name or version (sglang-kernel 0.4.10 on the default index: no
local tag, no -cuNN name); the dynamic linker still has to find the CUDA libraries they were linked against, by
soname, and a CUDA toolkit library's soname carries the CUDA major (``libcudart.so.13``). Read with pyelftools from
the wheel file on the controller; nothing is imported or run.
"""

from __future__ import annotations

import re
import shutil
import tempfile
import zipfile

try:
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile

    HAS_ELFTOOLS = True
except ImportError:  # the lock rules then judge a wheel by its name, version and requirements only, and say so
    HAS_ELFTOOLS = False

# CUDA toolkit libraries whose soname major is the CUDA major they ship with (libcudart.so.12 in CUDA 12.x,
# libcudart.so.11.0 in 11.x). Not among them: libcuda.so.1 (the driver, any CUDA), and the libraries numbered on
# their own (libcufft.so.11 is CUDA 12's, libcurand.so.10 both 12's and 13's; libcusolver, libcusparse, libnccl,
# libcudnn likewise).
_CUDA_SONAME = re.compile(
    r"^lib(?P<lib>cudart|cublasLt|cublas|nvrtc-builtins|nvrtc|nvJitLink|cupti|nvblas|nvjpeg|npp[a-z]*)"
    r"\.so\.(?P<major>\d+)(?:\.\d+)*$"
)
# Preferred evidence first when a library links several: the runtime says it most plainly.
_PREFERENCE = ("cudart", "cublas", "cublasLt", "nvrtc", "nvJitLink")
_SHARED_OBJECT = re.compile(r"\.so(?:\.\d+)*$")
# Members up to this size are read in memory; larger ones (a kernel library is hundreds of MB) from a temporary file.
_SPOOL_BYTES = 64 * 1024 * 1024


class ElfReadError(ValueError):
    """A shared object in a wheel whose ELF headers cannot be read; the message names the wheel and the member."""


def cuda_major_of_soname(soname: str) -> int | None:
    """The CUDA major a CUDA toolkit library's soname names (``libcudart.so.13`` -> 13), else None."""
    match = _CUDA_SONAME.match(soname)
    return int(match.group("major")) if match else None


def needed(stream) -> list | None:
    """The ``DT_NEEDED`` entries of an ELF file (a seekable binary stream), in order; None when it is no ELF file
    (a wheel may carry a linker script or a text file named ``*.so``). Raises ELFError for a damaged ELF file."""
    stream.seek(0)
    if stream.read(4) != b"\x7fELF":
        return None
    stream.seek(0)
    elf = ELFFile(stream)
    out = []
    for segment in elf.iter_segments():
        if segment["p_type"] == "PT_DYNAMIC":
            out.extend(tag.needed for tag in segment.iter_tags() if tag.entry.d_tag == "DT_NEEDED")
    return out


def wheel_needed(path: str) -> dict:
    """{member: its DT_NEEDED entries} for every ELF shared object in a wheel (a zip file)."""
    out = {}
    with zipfile.ZipFile(path) as wheel:
        for info in wheel.infolist():
            if info.is_dir() or not _SHARED_OBJECT.search(info.filename):
                continue
            with wheel.open(info) as member, tempfile.SpooledTemporaryFile(max_size=_SPOOL_BYTES) as copy:
                shutil.copyfileobj(member, copy, 1024 * 1024)
                try:
                    entries = needed(copy)
                except ELFError as exc:
                    raise ElfReadError(f"{path}: {info.filename} is a damaged ELF file ({exc})") from exc
            if entries is not None:
                out[info.filename] = entries
    return out


def cuda_from_needed(needed_by_member: dict) -> tuple | None:
    """(CUDA major, or the sorted majors when the libraries disagree; evidence) from {member: DT_NEEDED entries}, or
    None when no member links a CUDA toolkit library. The evidence names one soname and member per major:
    ``libcudart.so.13 in sgl_kernel/common_ops.so``."""
    seen = {}  # major -> (preference rank, soname, member)
    for member in sorted(needed_by_member):
        for soname in needed_by_member[member]:
            major = cuda_major_of_soname(soname)
            if major is None:
                continue
            lib = _CUDA_SONAME.match(soname).group("lib")
            rank = _PREFERENCE.index(lib) if lib in _PREFERENCE else len(_PREFERENCE)
            if major not in seen or rank < seen[major][0]:
                seen[major] = (rank, soname, member)
    if not seen:
        return None
    majors = sorted(seen)
    evidence = ", ".join(f"{seen[m][1]} in {seen[m][2]}" for m in majors)
    return (majors[0] if len(majors) == 1 else majors), evidence


def wheel_cuda(path: str) -> tuple | None:
    """(CUDA major or majors, evidence) a wheel's shared objects are linked for, or None (see cuda_from_needed)."""
    return cuda_from_needed(wheel_needed(path))
