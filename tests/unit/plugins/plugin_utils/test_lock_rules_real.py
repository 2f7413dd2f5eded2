# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The lock rules on what the default index really serves (tests/data/lock_rules, described in its RECORDED.json):

- torch-memory-saver 0.0.10 carries a build per CUDA major (``*_cu12.abi3.so``, ``*_cu13.abi3.so`` and untagged
  copies of the CUDA 12 ones) and picks one at import by ``torch.version.cuda`` (its ``utils.py``, recorded as it
  is). Its shared objects are rebuilt here with gcc from the recorded DT_NEEDED lists.
- torchvision 0.29.2 (``torch>=2.14.0``), 0.26.0 (``torch==2.11.0``), torchaudio 2.11.0 and sgl-kernel 0.3.21 (no
  torch at all) by their recorded METADATA.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest
import yaml
from packaging.metadata import Metadata

from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _elf
from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _lock_rules as lr
from ansible_collections.gpufleet.upgrade.plugins.plugin_utils._wheels import Target, declared_requirements

DATA = Path(__file__).resolve().parents[3] / "data" / "lock_rules"
STACKS = Path(__file__).resolve().parents[4] / "stacks"
TMS = DATA / "torch_memory_saver-0.0.10"
TMS_WHEEL = json.loads((TMS / "wheel.json").read_text())
TMS_LOADER = (TMS / "utils.py").read_text()
TARGET = Target("3.12", "x86_64-manylinux_2_28")
GCC = shutil.which("gcc")
needs_gcc = pytest.mark.skipif(GCC is None, reason="gcc is not installed: the tests build real shared objects with it")


def entry(name, version, filename=None):
    return {
        "name": name,
        "version": version,
        "filename": filename or f"{name.replace('-', '_')}-{version}-py3-none-any.whl",
    }


def profile(cuda="13.0", companions=(), name="p"):
    return {"name": name, "cuda": {"version": cuda}, "wheels": {"rules": {"companions": list(companions)}}}


def requires_of(filename):
    meta = Metadata.from_email((DATA / f"{filename}.metadata").read_bytes(), validate=False)
    return declared_requirements(meta, TARGET)


# --- torch-memory-saver: a build per CUDA major, chosen at import -------------------------------------------------


def test_its_builds_are_recognised_by_their_names_links_and_loader():
    assert TMS_WHEEL["wheel"] == "torch_memory_saver-0.0.10-cp39-abi3-manylinux2014_x86_64.whl"
    majors = {m: _elf.cuda_from_needed({m: n}) for m, n in TMS_WHEEL["needed"].items()}
    assert {m: found[0] for m, found in majors.items()} == {
        "torch_memory_saver_hook_mode_preload.abi3.so": 12,
        "torch_memory_saver_hook_mode_preload_cu12.abi3.so": 12,
        "torch_memory_saver_hook_mode_preload_cu13.abi3.so": 13,
        "torch_memory_saver_hook_mode_torch.abi3.so": 12,
        "torch_memory_saver_hook_mode_torch_cu12.abi3.so": 12,
        "torch_memory_saver_hook_mode_torch_cu13.abi3.so": 13,
    }
    sums = TMS_WHEEL["so_sha256"]
    assert sums["torch_memory_saver_hook_mode_torch.abi3.so"] == sums["torch_memory_saver_hook_mode_torch_cu12.abi3.so"]
    builds = _elf.runtime_builds(TMS_WHEEL["needed"], {"torch_memory_saver/utils.py": TMS_LOADER})
    assert builds["by_major"] == {
        12: ["torch_memory_saver_hook_mode_preload_cu12.abi3.so", "torch_memory_saver_hook_mode_torch_cu12.abi3.so"],
        13: ["torch_memory_saver_hook_mode_preload_cu13.abi3.so", "torch_memory_saver_hook_mode_torch_cu13.abi3.so"],
    }
    assert builds["untagged"] == {
        "torch_memory_saver_hook_mode_preload.abi3.so": 12,
        "torch_memory_saver_hook_mode_torch.abi3.so": 12,
    }
    assert builds["chooser"] == (
        "torch_memory_saver/utils.py: reads getattr(torch.version, 'cuda', None) (line 44),"
        " loads f'{stem}_cu{major}.*.so' (line 91)"
    )


def test_without_code_that_chooses_a_build_two_cuda_majors_are_a_mix():
    assert _elf.runtime_builds(TMS_WHEEL["needed"], {}) is None
    # Reading the CUDA version alone, or naming a build alone, is no choice.
    reads_only = "import torch\nMAJOR = int(torch.version.cuda.split('.')[0])\n"
    names_only = "def path(stem, major):\n    return f'{stem}_cu{major}.so'\n"
    assert _elf.build_chooser({"a.py": reads_only, "b.py": names_only}) is None
    probe = (
        "import ctypes\ndef load(stem, major):\n    ctypes.CDLL(f'libcudart.so.{major}')\n"
        "    return f'{stem}_cu{major}.so'\n"
    )
    assert _elf.build_chooser({"p/load.py": probe}).startswith("p/load.py: reads f'libcudart.so.{major}' (line 3)")


@pytest.mark.parametrize(
    "needed",
    [
        # A tagged build that links another CUDA than its name says.
        {"ops_cu12.so": ["libcudart.so.13"], "ops_cu13.so": ["libcudart.so.13"]},
        # Two libraries that link different majors, neither tagged: a mix.
        {"a.so": ["libcudart.so.12"], "b.so": ["libcudart.so.13"]},
        # A library with a CUDA 13 build only beside one with CUDA 12 and 13 builds.
        {"a_cu12.so": ["libcudart.so.12"], "a_cu13.so": ["libcudart.so.13"], "b_cu13.so": ["libcudart.so.13"]},
        # An untagged library of its own that links CUDA 12, always loaded.
        {"a_cu12.so": ["libcudart.so.12"], "a_cu13.so": ["libcudart.so.13"], "core.so": ["libcudart.so.12"]},
    ],
)
def test_libraries_that_are_no_set_of_builds_are_not_taken_for_one(needed):
    assert _elf.runtime_builds(needed, {"torch_memory_saver/utils.py": TMS_LOADER}) is None


def _gcc(*args):
    subprocess.run([GCC, *args], check=True, capture_output=True)


def shared_object(folder: Path, name: str, sonames: list) -> Path:
    """A shared object linking (DT_NEEDED) stand-ins with the given CUDA and torch sonames; the system libraries of a
    recorded list are left to the toolchain."""
    wanted = [s for s in sonames if s.startswith(("libcud", "libc10", "libtorch", "libnvrtc", "libcublas"))]
    for soname in wanted:
        if not (folder / soname).exists():
            src = folder / "lib.c"
            src.write_text("int lib(void) { return 1; }\n")
            _gcc("-shared", "-fPIC", "-o", str(folder / soname), f"-Wl,-soname,{soname}", str(src))
    src = folder / "op.c"
    src.write_text("int op(void) { return 2; }\n")
    out = folder / name
    _gcc(
        "-shared", "-fPIC", "-o", str(out), str(src), f"-L{folder}", "-Wl,--no-as-needed", *[f"-l:{s}" for s in wanted]
    )
    return out


def tms_wheel(wheelhouse: Path, build: Path, loader: str = TMS_LOADER) -> Path:
    """torch-memory-saver 0.0.10's wheel as recorded: its members, the shared objects rebuilt with their recorded CUDA
    links, ``loader`` as torch_memory_saver/utils.py, the other modules empty."""
    build.mkdir(exist_ok=True)
    path = wheelhouse / TMS_WHEEL["wheel"]
    with zipfile.ZipFile(path, "w") as zf:
        for member in TMS_WHEEL["members"]:
            if member in TMS_WHEEL["needed"]:
                zf.write(shared_object(build, Path(member).name, TMS_WHEEL["needed"][member]), member)
            elif member == "torch_memory_saver/utils.py":
                zf.writestr(member, loader)
            else:
                zf.writestr(member, "")
    return path


def tms_lock():
    return [
        entry("torch-memory-saver", "0.0.10", TMS_WHEEL["wheel"]),
        entry("sglang", "0.5.23", "sglang-0.5.23-cp312-cp312-manylinux_2_34_x86_64.whl"),
    ]


GRAPH = {"torch-memory-saver": ["sglang"], "sglang": [lr.ROOT]}


@needs_gcc
def test_a_wheel_that_chooses_its_cuda_build_at_import_passes_where_it_has_the_profile_s(tmp_path):
    tms_wheel(tmp_path, tmp_path / "build")
    report = lr.judge_lock(tms_lock(), GRAPH, {}, profile(), wheelhouse=str(tmp_path))
    row = report["cuda"]["torch-memory-saver"]
    assert row["cuda"] == [12, 13] and sorted(row["builds"]) == ["12", "13"]
    lines = lr.report_lines(report)
    assert (
        "CUDA builds chosen at import: torch-memory-saver 0.0.10 carries a build for each of CUDA 12, 13 and chooses"
        " one at import (a build per CUDA major, chosen at import by its own code (torch_memory_saver/utils.py: reads"
        " getattr(torch.version, 'cuda', None) (line 44), loads f'{stem}_cu{major}.*.so' (line 91)); CUDA 12:"
        " torch_memory_saver_hook_mode_preload_cu12.abi3.so, torch_memory_saver_hook_mode_torch_cu12.abi3.so;"
        " CUDA 13: torch_memory_saver_hook_mode_preload_cu13.abi3.so, torch_memory_saver_hook_mode_torch_cu13.abi3.so;"
        " untagged copies: torch_memory_saver_hook_mode_preload.abi3.so (CUDA 12),"
        " torch_memory_saver_hook_mode_torch.abi3.so (CUDA 12))"
    ) in lines
    # A CUDA 12 profile takes the same wheel; a CUDA 11 one has no build to choose.
    assert lr.judge_lock(tms_lock(), GRAPH, {}, profile(cuda="12.8"), wheelhouse=str(tmp_path))
    with pytest.raises(lr.LockRefused) as err:
        lr.judge_lock(tms_lock(), GRAPH, {}, profile(cuda="11.8"), wheelhouse=str(tmp_path))
    assert "torch-memory-saver 0.0.10 carries builds for CUDA 12 and 13 only (a build per CUDA major" in str(err.value)
    assert "none for CUDA 11, the profile's CUDA is 11.8; required by sglang 0.5.23" in str(err.value)
    # The same builds without code that chooses among them are a mix, refused as before.
    mix = tmp_path / "mix"
    mix.mkdir()
    tms_wheel(mix, tmp_path / "build", loader="import ctypes\nLIB = ctypes.CDLL('ops_cu12.abi3.so')\n")
    with pytest.raises(
        lr.LockRefused,
        match=r"torch-memory-saver 0\.0\.10 is built for CUDA 12 and 13 \(from libcudart\.so\.12 in"
        r" torch_memory_saver_hook_mode_preload\.abi3\.so, libcudart\.so\.13 in",
    ):
        lr.judge_lock(tms_lock(), GRAPH, {}, profile(), wheelhouse=str(mix))


@needs_gcc
def test_check_mode_says_what_it_did_not_read_and_the_fetch_gives_the_same_verdict(tmp_path):
    """A plan in check mode has no wheelhouse for a dependency: the rules say which wheels they did not read; once
    fetched, the same wheel is read and passes (before: it was refused after the fetch, passed in check mode)."""
    before = lr.judge_lock(tms_lock(), GRAPH, {}, profile(), wheelhouse=str(tmp_path))
    assert before["cuda_not_fetched"] == ["torch-memory-saver 0.0.10", "sglang 0.5.23"]
    line = lr.not_judged_lines(before)[0]
    assert line.startswith(
        "not judged: the CUDA of 2 compiled wheel(s) whose name and version do not tell it, because their wheels are"
        " not in the controller's wheelhouse and their shared objects were not read (a plan in check mode or without"
        " the fetch does not download them; the plan that fetches reads them"
    )
    assert line.endswith(": torch-memory-saver 0.0.10, sglang 0.5.23")
    assert line in lr.report_lines(before)
    tms_wheel(tmp_path, tmp_path / "build")
    lr.judge_after_fetch(tms_lock(), profile(), str(tmp_path), before)
    assert before["cuda_not_fetched"] == ["sglang 0.5.23"]  # its wheel is not in this wheelhouse either
    assert before["cuda"]["torch-memory-saver"]["builds"]
    # The same wheelhouse in check mode (judge_lock reads what the wheelhouse holds): the same verdict.
    again = lr.judge_lock(tms_lock(), GRAPH, {}, profile(), wheelhouse=str(tmp_path))
    assert again["cuda"] == before["cuda"]


# --- companions judged by every requirement ---------------------------------------------------------------------

TV_0292 = "torchvision-0.29.2-py3-none-manylinux_2_28_x86_64.whl"
TV_0260 = "torchvision-0.26.0-cp312-cp312-manylinux_2_28_x86_64.whl"
TA_2110 = "torchaudio-2.11.0-cp312-cp312-manylinux_2_28_x86_64.whl"
SGL_0321 = "sgl_kernel-0.3.21-cp310-abi3-manylinux2014_x86_64.whl"
TORCH = "torch-2.11.0-cp312-cp312-manylinux_2_28_x86_64.whl"
# uv's graph of a plan whose override replaced every requirement on torch: torchvision still requires it.
OVERRIDDEN = {
    "torch": sorted([lr.ROOT, "sglang", "torchvision", lr.OVERRIDE]),
    "torchvision": ["sglang"],
    "torchaudio": [lr.OVERRIDE, "sglang"],
    "sglang": [lr.ROOT],
}


def test_a_torchvision_whose_metadata_requires_a_newer_torch_is_refused_whatever_the_override():
    entries = [
        entry("torch", "2.11.0", TORCH),
        entry("torchvision", "0.29.2", TV_0292),
        entry("sglang", "0.5.9"),
    ]
    assert lr.metadata_wanted(entries, {}, OVERRIDDEN) == ["torchvision"]
    with pytest.raises(lr.LockRefused) as err:
        lr.judge_lock(entries, OVERRIDDEN, {"torchvision": requires_of(TV_0292)}, profile())
    assert (
        "torchvision 0.29.2 does not pair with torch 2.11.0 (its METADATA requires torch>=2.14.0). Fix: choose the"
        " torchvision built for torch 2.11.0"
    ) in str(err.value)


def test_a_bound_that_admits_torch_is_no_pairing():
    entries = [entry("torch", "2.14.1+cu130", TORCH), entry("torchvision", "0.29.2", TV_0292)]
    requires = {"torchvision": requires_of(TV_0292)}
    report = lr.judge_lock(entries, {"torch": ["torchvision"]}, requires, profile())
    assert report["companions"] == []  # a bound that holds pairs nothing
    assert report["unjudged"] == [
        "torchvision 0.29.2 beside torch 2.14.1+cu130: its METADATA admits it (torch>=2.14.0) but pins no torch"
        " release, and wheels.rules.companions has no row for torchvision: which torch it was built against is not"
        " judged (add a companions row to judge it)"
    ]
    row = {"package": "torchvision", "versions": {"2.14": "0.29"}, "reason": "r"}
    paired = lr.judge_lock(entries, {"torch": ["torchvision"]}, requires, profile(companions=[row]))
    assert paired["unjudged"] == []
    assert paired["companions"][0]["by"] == "its METADATA: torch>=2.14.0; the profile: torch 2.14 <-> torchvision 0.29"


def cu130():
    return yaml.safe_load((STACKS / "cu130.yml").read_text())


def test_cu130_pins_pytorch_s_pair_for_torch_2_11():
    overrides = {o["requirement"] for o in cu130()["wheels"]["overrides"]}
    assert {"torchvision==0.26.0", "torchaudio==2.11.0"} <= overrides


@pytest.mark.parametrize(
    ("torchvision", "refused"),
    [(("0.26.0", TV_0260), None), (("0.29.2", TV_0292), "its METADATA requires torch>=2.14.0; the profile pairs")],
)
def test_cu130_s_companions_with_the_real_metadata(torchvision, refused):
    prof = cu130()
    entries = [
        entry("torch", "2.11.0", TORCH),
        entry("torchvision", torchvision[0], torchvision[1]),
        entry("torchaudio", "2.11.0", TA_2110),
        entry("sglang", "0.5.9"),
    ]
    requires = {"torchvision": requires_of(torchvision[1]), "torchaudio": requires_of(TA_2110)}
    pairs, problems, unjudged = lr.judge_companions(
        entries, lr.companions_from_profile(prof["wheels"]["rules"]), requires
    )
    if refused:
        assert len(problems) == 1 and refused in problems[0], problems
        return
    assert problems == [] and unjudged == {}
    assert {p["package"]: p["by"] for p in pairs} == {
        "torchaudio": "the profile: torch 2.11 <-> torchaudio 2.11",
        "torchvision": "its METADATA: torch==2.11.0; the profile: torch 2.11 <-> torchvision 0.26",
    }


# --- what the plan could not judge ------------------------------------------------------------------------------


@needs_gcc
def test_a_kernel_wheel_linking_torch_without_a_pairing_is_listed_as_not_judged(tmp_path):
    """sgl-kernel 0.3.21 from the default index: its METADATA names no torch; its libraries link torch's and CUDA 12's.
    A CUDA 12 profile takes its CUDA, and says that its torch pairing was not judged."""
    assert requires_of(SGL_0321) == []
    so = shared_object(tmp_path, "common_ops.abi3.so", ["libc10.so", "libtorch.so", "libcudart.so.12"])
    with zipfile.ZipFile(tmp_path / SGL_0321, "w") as zf:
        zf.write(so, "sgl_kernel/common_ops.abi3.so")
    entries = [entry("torch", "2.9.1+cu128"), entry("sgl-kernel", "0.3.21", SGL_0321)]
    graph = {"sgl-kernel": [lr.ROOT], "torch": [lr.ROOT]}
    report = lr.judge_lock(entries, graph, {"sgl-kernel": requires_of(SGL_0321)}, profile(cuda="12.8"), str(tmp_path))
    assert report["unjudged"] == [
        "sgl-kernel 0.3.21 links torch's libraries (libc10.so in sgl_kernel/common_ops.abi3.so) but neither its"
        " METADATA nor wheels.rules.companions says which torch it was built against: its pairing with torch"
        " 2.9.1+cu128 is not judged (add a companions row for sgl-kernel to judge it)"
    ]
    assert "not judged: " + report["unjudged"][0] in lr.report_lines(report)
    # A CUDA 13 profile refuses it (the default index's build is CUDA 12's), as docs/profiles.md records.
    with pytest.raises(lr.LockRefused, match=r"sgl-kernel 0\.3\.21 is built for CUDA 12 \(from libcudart\.so\.12"):
        lr.judge_lock(entries, graph, {}, profile(), str(tmp_path))
    # Without its wheel on the controller it is named as not read.
    unread = lr.judge_lock(entries, graph, {}, profile(cuda="12.8"))
    assert unread["cuda_not_fetched"] == ["sgl-kernel 0.3.21"]


@needs_gcc
def test_a_bound_on_torch_from_a_wheel_built_against_no_torch_is_no_gap(tmp_path):
    """xgrammar 0.2.7 requires torch>=1.10.0: where its wheel is read and links none of torch's libraries, it is built
    against no torch release and nothing is left unjudged; where it links them, the gap is listed."""
    filename = "xgrammar-0.2.7-cp312-cp312-manylinux_2_28_x86_64.whl"
    entries = [entry("torch", "2.14.1+cu130"), entry("xgrammar", "0.2.7", filename)]
    graph = {"torch": ["xgrammar", lr.ROOT], "xgrammar": [lr.ROOT]}
    requires = {"xgrammar": ["torch>=1.10.0"]}
    for links, listed in (([], False), (["libc10.so"], True)):
        folder = tmp_path / str(listed)
        folder.mkdir()
        with zipfile.ZipFile(folder / filename, "w") as zf:
            zf.write(shared_object(folder, "ops.so", links), "xgrammar/ops.so")
        report = lr.judge_lock(entries, graph, requires, profile(), wheelhouse=str(folder))
        assert report["torch_links"] == {"xgrammar": "libc10.so in xgrammar/ops.so" if listed else ""}
        assert bool(report["unjudged"]) is listed, report["unjudged"]
    # Not read (check mode without the wheelhouse): the gap is listed.
    assert lr.judge_lock(entries, graph, requires, profile())["unjudged"][0].startswith("xgrammar 0.2.7 beside torch")
