# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The CUDA a wheel's compiled code is built for, read from the ``DT_NEEDED`` entries of its shared objects.

Some CUDA wheels say nothing of their CUDA in their name or version (sglang-kernel 0.4.10 on the default index: no
local tag, no -cuNN name); the dynamic linker still has to find the CUDA libraries they were linked against, by
soname, and a CUDA toolkit library's soname carries the CUDA major (``libcudart.so.13``). Read with pyelftools from
the wheel file on the controller; nothing is imported or run.

A wheel may carry one build per CUDA major and choose at import (torch-memory-saver 0.0.10: ``*_cu12.abi3.so``
linking ``libcudart.so.12``, ``*_cu13.abi3.so`` linking ``libcudart.so.13``, and Python code that reads
``torch.version.cuda`` and loads ``f"{stem}_cu{major}.*.so"``). ``runtime_builds`` recognises such a wheel by what its
files are (builds of the same libraries whose names carry the CUDA major they link) and how it loads them (a module
of its own that reads the CUDA version and names a build by a formatted CUDA tag), read with ``ast``, never run.
"""

from __future__ import annotations

import ast
import itertools
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


# --- several CUDA builds in one wheel, chosen at import ---------------------------------------------------------

# A CUDA major in a shared object's file name: foo_cu12.abi3.so, foo-cu130.so, foo_cuda13.so (cu130: major 13).
_NAME_TAG = re.compile(r"[_.-]cu(?:da)?(\d{2,3})(?=[_.-])")
# A CUDA tag a module formats from a value: the text just before the value ends with cu or cuda (f"{stem}_cu{major}").
_TAG_BEFORE_VALUE = re.compile(r"(?:^|[_.-])cu(?:da)?$")
_TAG_FORMAT = re.compile(r"[_.-]cu(?:da)?(?:\{[^}]*\}|%[ds])")
# Python files read for the loader: a module that picks a build is small; a vendored data file is not read.
_SOURCE_BYTES = 1024 * 1024


def build_tag(member: str) -> tuple | None:
    """(CUDA major, the member's path without the tag) for a shared object whose file name carries a CUDA tag
    (``pkg/ops_cu13.abi3.so`` -> (13, ``pkg/ops.abi3.so``)), else None."""
    folder, _sep, base = member.rpartition("/")
    match = _NAME_TAG.search(base)
    if not match:
        return None
    digits = match.group(1)
    major = int(digits) if len(digits) == 2 else int(digits[:-1])
    untagged = base[: match.start()] + base[match.end() :]
    return major, f"{folder}/{untagged}" if folder else untagged


def builds_by_major(needed_by_member: dict) -> dict | None:
    """{"by_major": {major: [members]}, "untagged": {member: major}} when every shared object that links a CUDA
    toolkit library is one build of a library the wheel carries once per CUDA major: its file name carries the major
    it links (``ops_cu12.so`` links ``libcudart.so.12``), every such library has a build for each of the majors, and
    an untagged one (``ops.so``) is a further copy of a library that has tagged builds. None otherwise: a wheel whose
    libraries simply link different majors is a mix, not a choice."""
    families, untagged = {}, {}
    for member in sorted(needed_by_member):
        majors = {m for m in map(cuda_major_of_soname, needed_by_member[member]) if m is not None}
        if not majors:
            continue
        if len(majors) > 1:
            return None
        major = majors.pop()
        tag = build_tag(member)
        if tag is None:
            untagged[member] = major
        elif tag[0] != major:
            return None  # named for one CUDA, linked against another
        else:
            families.setdefault(tag[1], {}).setdefault(major, []).append(member)
    majors = {m for family in families.values() for m in family}
    if len(majors) < 2 or any(set(family) != majors for family in families.values()):
        return None
    if any(member not in families for member in untagged):
        return None
    by_major = {m: sorted(x for family in families.values() for x in family.get(m, [])) for m in sorted(majors)}
    return {"by_major": by_major, "untagged": untagged}


def _reads_cuda_version(node) -> str | None:
    """What a node reads of the CUDA the process runs: ``torch.version.cuda`` (as an attribute or through getattr),
    or a probe of the CUDA runtime by soname (``f"libcudart.so.{major}"``)."""
    if isinstance(node, ast.Attribute) and node.attr == "cuda":
        if isinstance(node.value, ast.Attribute) and node.value.attr == "version":
            return ast.unparse(node)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr":
        args = node.args
        if (
            len(args) >= 2
            and isinstance(args[0], ast.Attribute)
            and args[0].attr == "version"
            and isinstance(args[1], ast.Constant)
            and args[1].value == "cuda"
        ):
            return ast.unparse(node)
    if isinstance(node, ast.JoinedStr) and node.values:
        first = node.values[0]
        if isinstance(first, ast.Constant) and str(first.value).startswith("libcudart.so."):
            return ast.unparse(node)
    return None


def _formats_cuda_tag(node) -> str | None:
    """A file name built from a CUDA major: an f-string with ``cu`` right before a value (``f"{stem}_cu{major}.so"``),
    or a format string that has ``_cu{}`` / ``_cu%d``."""
    if isinstance(node, ast.JoinedStr):
        for before, value in itertools.pairwise(node.values):
            if (
                isinstance(before, ast.Constant)
                and isinstance(value, ast.FormattedValue)
                and _TAG_BEFORE_VALUE.search(str(before.value))
            ):
                return ast.unparse(node)
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and _TAG_FORMAT.search(node.value):
        return repr(node.value)
    return None


def build_chooser(sources: dict) -> str | None:
    """Where a wheel's own Python code chooses a build by the CUDA it runs with: the first module (by path) that both
    reads the CUDA version and names a file by a formatted CUDA tag, as
    ``torch_memory_saver/utils.py: reads getattr(torch.version, 'cuda', None) (line 45), loads f'{stem}_cu{major}.*.so'
    (line 91)``; None when no module does both."""
    for path in sorted(sources):
        try:
            tree = ast.parse(sources[path])
        except (SyntaxError, ValueError):
            continue
        reads, names = [], []
        for node in ast.walk(tree):
            read = _reads_cuda_version(node)
            if read:
                reads.append((node.lineno, read))
            named = _formats_cuda_tag(node)
            if named:
                names.append((node.lineno, named))
        if reads and names:
            read, name = min(reads), min(names)
            return f"{path}: reads {read[1]} (line {read[0]}), loads {name[1]} (line {name[0]})"
    return None


def runtime_builds(needed_by_member: dict, sources: dict) -> dict | None:
    """{"by_major": {major: [members]}, "untagged": {...}, "chooser": where} for a wheel that carries a build per CUDA
    major and chooses one at import (``builds_by_major`` and ``build_chooser`` both found), else None."""
    builds = builds_by_major(needed_by_member)
    if builds is None:
        return None
    chooser = build_chooser(sources)
    return {**builds, "chooser": chooser} if chooser else None


def wheel_sources(path: str) -> dict:
    """{member: text} of a wheel's Python modules (each up to 1 MiB), for ``build_chooser``."""
    out = {}
    with zipfile.ZipFile(path) as wheel:
        for info in wheel.infolist():
            if info.filename.endswith(".py") and info.file_size <= _SOURCE_BYTES:
                out[info.filename] = wheel.read(info).decode("utf-8", errors="replace")
    return out


# torch's own libraries: a shared object linking them is built against one torch release (its C++ ABI).
_TORCH_SONAME = re.compile(r"^lib(?:torch|torch_cpu|torch_cuda|torch_python|c10|c10_cuda)\.so$")


def torch_linked(needed_by_member: dict) -> str | None:
    """``libc10.so in sgl_kernel/common_ops.so``: the first torch library a shared object links, or None."""
    for member in sorted(needed_by_member):
        for soname in needed_by_member[member]:
            if _TORCH_SONAME.match(soname):
                return f"{soname} in {member}"
    return None


def wheel_links(path: str) -> dict:
    """What a wheel's shared objects link, read once: {"cuda": major, sorted majors or None, "evidence" (see
    cuda_from_needed), "builds" (runtime_builds where several majors are linked, else None), "torch" (torch_linked)}.
    Its Python modules are read only when several majors are linked."""
    needed_by_member = wheel_needed(path)
    found = cuda_from_needed(needed_by_member)
    several = found is not None and isinstance(found[0], list)
    return {
        "cuda": found[0] if found else None,
        "evidence": found[1] if found else None,
        "builds": runtime_builds(needed_by_member, wheel_sources(path)) if several else None,
        "torch": torch_linked(needed_by_member),
    }
