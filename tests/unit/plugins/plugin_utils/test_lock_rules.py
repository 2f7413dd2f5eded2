# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The lock rules on their own: companions paired with the torch the plan chose, one CUDA major in a lock."""

from __future__ import annotations

from pathlib import Path

import pytest
from packaging.metadata import Metadata
from packaging.utils import canonicalize_name

from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _lock_rules as lr
from ansible_collections.gpufleet.upgrade.plugins.plugin_utils._wheels import Target, declared_requirements

# uv pip compile --annotation-style line, as uv 0.13 writes it for the plan's pyproject and overrides file.
UV_OUTPUT = """\
sglang @ file:///wh/sglang-0.5.9-py3-none-any.whl  # via gpufleet-plan (pyproject.toml)
nvidia-cublas==13.1.0.3   # via torch
nvidia-cublas-cu12==12.8.4.1  # via old-kernel
nvidia-cuda-runtime==13.0.96  # via torch
old-kernel==1.0           # via sglang
torch @ file:///wh/torch-2.11.0-cp312-cp312-manylinux_2_28_x86_64.whl  # via gpufleet-plan (pyproject.toml), sglang, \
torchvision, --override overrides.txt
torchvision==0.24.1       # via sglang
flashinfer-python==0.6.4  # via flashinfer-jit-cache, gpufleet-plan (pyproject.toml), sglang[srt]
"""


def entry(name, version, filename=None):
    return {
        "name": name,
        "version": version,
        "filename": filename or f"{name.replace('-', '_')}-{version}-py3-none-any.whl",
    }


def lock_of(*pairs):
    return [entry(*p) for p in pairs]


def profile(cuda="13.0", companions=(), exceptions=()):
    return {
        "name": "p",
        "cuda": {"version": cuda},
        "wheels": {"rules": {"companions": list(companions), "cuda_exceptions": list(exceptions)}},
    }


def test_uv_annotations_become_the_graph_with_roots_and_overrides():
    graph = lr.parse_uv_graph(UV_OUTPUT)
    assert graph["torch"] == sorted([lr.ROOT, "sglang", "torchvision", lr.OVERRIDE])
    assert graph["sglang"] == [lr.ROOT]
    assert graph["nvidia-cublas-cu12"] == ["old-kernel"]
    assert graph["flashinfer-python"] == sorted(["flashinfer-jit-cache", lr.ROOT, "sglang"])
    assert lr.requirements_of(graph)["torch"] == ["nvidia-cublas", "nvidia-cuda-runtime"]


@pytest.mark.parametrize(
    ("name", "version", "major", "how"),
    [
        ("torch", "2.11.0+cu130", 13, "local tag cu130"),
        ("torchvision", "0.24.1+cu128", 12, "local tag cu128"),
        ("sgl-kernel", "0.3.21+cu130.post1", 13, "local tag cu130"),
        ("nvidia-cublas-cu12", "12.8.4.1", 12, "name suffix -cu12"),
        ("nvidia_nccl_cu13", "2.28.3", 13, "name suffix -cu13"),
        ("cupy-cuda12x", "13.6.0", 12, "name suffix -cuda12x"),
        ("nvidia-cuda-runtime", "13.0.96", 13, "version 13.0.96"),
        ("nvidia-cuda-runtime", "12.9.79", 12, "version 12.9.79"),
        ("cuda-python", "13.0.3", 13, "version 13.0.3"),
        ("cuda-bindings", "12.9.4", 12, "version 12.9.4"),
        ("nvidia-cufft", "12.0.0.61", 13, "unsuffixed NVIDIA library"),
        ("nvidia-curand", "10.4.0.35", 13, "unsuffixed NVIDIA library"),
    ],
)
def test_a_package_s_own_cuda(name, version, major, how):
    found = lr.own_cuda(name, version)
    assert found is not None and found[0] == major and found[1].startswith(how), found


@pytest.mark.parametrize(
    ("name", "version"),
    [("nvidia-ml-py", "13.580.82"), ("six", "1.17.0"), ("torch", "2.11.0+cpu"), ("cuda-core", "0.3.2"), ("x", "bad")],
)
def test_packages_not_built_for_a_cuda_release_have_none(name, version):
    assert lr.own_cuda(name, version) is None


def test_a_plain_torch_is_built_for_the_cuda_of_the_nvidia_libraries_it_requires():
    graph = lr.parse_uv_graph(UV_OUTPUT)
    entries = lock_of(
        ("torch", "2.11.0"), ("nvidia-cublas", "13.1.0.3"), ("nvidia-cuda-runtime", "13.0.96"), ("sglang", "0.5.9")
    )
    table = lr.cuda_table(entries, graph)
    assert table["torch"]["cuda"] == 13
    assert table["torch"]["from"] == (
        "the CUDA libraries it requires (nvidia-cublas 13.1.0.3, nvidia-cuda-runtime 13.0.96)"
    )
    assert "sglang" not in table


def test_a_cuda_12_library_in_a_cuda_13_lock_is_refused_naming_who_required_it():
    graph = lr.parse_uv_graph(UV_OUTPUT)
    entries = lock_of(
        ("sglang", "0.5.9"),
        ("old-kernel", "1.0"),
        ("nvidia-cublas-cu12", "12.8.4.1"),
        ("torch", "2.11.0+cu130"),
        ("nvidia-cuda-runtime", "13.0.96"),
    )
    with pytest.raises(lr.LockRefused) as err:
        lr.judge_lock(entries, graph, {}, profile())
    msg = str(err.value)
    assert msg.startswith("the lock for profile 'p' was refused, nothing was written: ")
    assert (
        "nvidia-cublas-cu12 12.8.4.1 is built for CUDA 12 (name suffix -cu12), the profile's CUDA is 13.0; required by"
        " old-kernel 1.0 (chain: nvidia-cublas-cu12 <- old-kernel 1.0 <- sglang 0.5.9 <- the plan's requirements)"
    ) in msg
    assert "wheels.rules.cuda_exceptions: [{package: nvidia-cublas-cu12, reason: ...}]" in msg
    assert "torch" not in msg.split("Fix:", maxsplit=1)[0].split("required by")[0]

    allowed = lr.judge_lock(
        entries, graph, {}, profile(exceptions=[{"package": "nvidia_cublas_cu12", "reason": "old-kernel's CPU path"}])
    )
    assert allowed["cuda_allowed"] == [
        "nvidia-cublas-cu12 12.8.4.1 is built for CUDA 12 (name suffix -cu12): allowed by"
        " wheels.rules.cuda_exceptions: old-kernel's CPU path"
    ]
    assert allowed["cuda"]["torch"] == {"version": "2.11.0+cu130", "cuda": 13, "from": "local tag cu130"}


def test_the_same_lock_passes_a_cuda_12_profile_only_where_torch_is_cuda_12():
    graph = lr.parse_uv_graph(UV_OUTPUT)
    entries = lock_of(("torch", "2.9.1+cu128"), ("old-kernel", "1.0"), ("nvidia-cublas-cu12", "12.8.4.1"))
    assert set(lr.judge_lock(entries, graph, {}, profile(cuda="12.8"))["cuda"]) == {"torch", "nvidia-cublas-cu12"}
    with pytest.raises(lr.LockRefused, match=r"torch 2\.9\.1\+cu128 is built for CUDA 12 \(local tag cu128\)"):
        lr.judge_lock(entries, graph, {}, profile(cuda="13.0"))


TORCHVISION = {"package": "torchvision", "versions": {"2.9": "0.24", "2.11": "0.26"}, "reason": "C++ ops per torch"}


def test_a_companion_on_another_torch_is_refused_with_both_packages_and_the_fix():
    entries = lock_of(("torch", "2.11.0+cu130"), ("torchvision", "0.24.1"))
    with pytest.raises(lr.LockRefused) as err:
        lr.judge_lock(entries, {}, {}, profile(companions=[TORCHVISION]))
    msg = str(err.value)
    assert (
        "torchvision 0.24.1 does not pair with torch 2.11.0+cu130 (the profile pairs torch 2.11 <-> torchvision 0.26)"
        " [C++ ops per torch]. Fix: choose the torchvision built for torch 2.11.0+cu130"
    ) in msg
    ok = lr.judge_lock(
        lock_of(("torch", "2.11.0+cu130"), ("torchvision", "0.26.0+cu130")), {}, {}, profile(companions=[TORCHVISION])
    )
    assert ok["companions"] == [
        {
            "package": "torchvision",
            "version": "0.26.0+cu130",
            "with": "torch",
            "with_version": "2.11.0+cu130",
            "by": "the profile: torch 2.11 <-> torchvision 0.26",
            "ok": True,
        }
    ]


def test_the_longest_release_prefix_of_the_table_decides():
    rule = dict(TORCHVISION, versions={"2": "0.2", "2.11": "0.26"})
    entries = lock_of(("torch", "2.11.0+cu130"), ("torchvision", "0.26.1"))
    assert lr.judge_lock(entries, {}, {}, profile(companions=[rule]))["companions"][0]["ok"]


def test_a_metadata_pin_pairs_a_compiled_wheel_the_profile_does_not_name():
    entries = [
        entry("torch", "2.11.0+cu130"),
        entry("sglang-kernel", "0.4.6.post1", "sglang_kernel-0.4.6.post1-cp310-abi3-manylinux2014_x86_64.whl"),
    ]
    graph = {"torch": ["sglang-kernel", lr.ROOT], "sglang-kernel": [lr.ROOT]}
    assert lr.metadata_wanted(entries, {}, graph) == ["sglang-kernel"]
    requires = {"sglang-kernel": ["torch==2.13.0", "numpy"]}
    with pytest.raises(lr.LockRefused) as err:
        lr.judge_lock(entries, graph, requires, profile())
    assert "sglang-kernel 0.4.6.post1 does not pair with torch 2.11.0+cu130 (its METADATA pairs torch==2.13.0)" in str(
        err.value
    )
    entries[0]["version"] = "2.13.0+cu130"  # == without a local label matches any local label (PEP 440)
    pairs = lr.judge_lock(entries, graph, requires, profile())["companions"]
    assert pairs[0]["ok"] and pairs[0]["by"] == "its METADATA: torch==2.13.0"


def test_a_pure_python_package_pinning_torch_is_no_companion():
    """sglang 0.5.9 (py3-none-any) pins torch==2.9.1; the profile's override replaces that pin on purpose."""
    entries = [entry("torch", "2.11.0+cu130"), entry("sglang", "0.5.9")]
    graph = {"torch": ["sglang"], "sglang": [lr.ROOT]}
    assert lr.metadata_wanted(entries, {}, graph) == []
    assert lr.judge_lock(entries, graph, {}, profile())["companions"] == []


def test_a_profile_companion_nothing_pairs_is_refused_and_the_table_row_is_asked_for():
    entries = lock_of(("torch", "2.14.1"), ("torchvision", "0.29.0"))
    with pytest.raises(lr.LockRefused) as err:
        lr.judge_lock(entries, {}, {"torchvision": ["torch"]}, profile(companions=[TORCHVISION]))
    assert (
        "torchvision 0.29.0 beside torch 2.14.1: neither the profile's companions rule (torch 2.9 <-> torchvision 0.24,"
        " torch 2.11 <-> torchvision 0.26) nor torchvision's METADATA says which torchvision pairs with torch 2.14.1."
        " Fix: add the torchvision release built for torch 2.14 to wheels.rules.companions (torchvision) versions"
    ) in str(err.value)


def test_a_metadata_pin_and_the_table_must_both_hold():
    entries = lock_of(("torch", "2.11.0"), ("torchvision", "0.26.0"))
    with pytest.raises(lr.LockRefused, match=r"its METADATA pairs torch==2\.11\.1"):
        lr.judge_lock(entries, {}, {"torchvision": ["torch==2.11.1"]}, profile(companions=[TORCHVISION]))


def test_another_with_than_torch():
    rule = {"package": "flashinfer-jit-cache", "with": "flashinfer-python", "reason": "same build"}
    entries = lock_of(("flashinfer-python", "0.6.4"), ("flashinfer-jit-cache", "0.6.3+cu130"))
    requires = {"flashinfer-jit-cache": ["flashinfer-python==0.6.3", "torch==2.9.1"]}
    with pytest.raises(
        lr.LockRefused, match=r"flashinfer-jit-cache 0\.6\.3\+cu130 does not pair with flashinfer-python"
    ):
        lr.judge_lock(entries, {}, requires, profile(companions=[rule]))


def test_report_lines_list_the_cuda_of_each_package_and_the_pairs():
    graph = lr.parse_uv_graph(UV_OUTPUT)
    rep = lr.judge_lock(
        lock_of(("torch", "2.11.0+cu130"), ("torchvision", "0.26.0+cu130")),
        graph,
        {},
        profile(companions=[TORCHVISION]),
    )
    lines = lr.report_lines(rep)
    assert lines[0] == (
        "CUDA builds: torch 2.11.0+cu130 (CUDA 13, local tag cu130),"
        " torchvision 0.26.0+cu130 (CUDA 13, local tag cu130)"
    )
    assert lines[1].startswith("companion torchvision 0.26.0+cu130 pairs with torch 2.11.0+cu130 (the profile:")


# --- on the real wheels' METADATA (tests/data/lock_rules, recorded from the default index) ------------------------

REAL = Path(__file__).resolve().parents[3] / "data" / "lock_rules"
TARGET = Target("3.12", "x86_64-manylinux_2_28")


def real(filename):
    meta = Metadata.from_email((REAL / f"{filename}.metadata").read_bytes(), validate=False)
    return filename, declared_requirements(meta, TARGET)


def torch_lock(filename):
    """A lock of torch and what its real METADATA requires on the target, at the pinned (or lowest allowed)
    versions, with the graph uv would annotate (each required by torch)."""
    filename, requires = real(filename)
    version = filename.split("-")[1]
    entries, graph = [entry("torch", version, filename)], {"torch": [lr.ROOT]}
    for req in requires:
        floors = [str(s.version) for s in req.specifier if s.operator in ("==", ">=")]
        pinned = min(floors) if floors else "1.0"
        entries.append(entry(canonicalize_name(req.name), pinned))
        graph[canonicalize_name(req.name)] = ["torch"]
    return entries, graph


def test_the_default_index_s_torch_2_11_is_cuda_13_by_the_libraries_it_requires():
    entries, graph = torch_lock("torch-2.11.0-cp312-cp312-manylinux_2_28_x86_64.whl")
    verdict = lr.judge_lock(entries, graph, {}, profile())
    cuda = verdict["cuda"]
    assert cuda["torch"]["cuda"] == 13 and cuda["torch"]["from"].startswith("the CUDA libraries it requires (cuda-")
    assert {n: r["cuda"] for n, r in cuda.items() if n != "torch"} == {
        "cuda-bindings": 13,
        "cuda-toolkit": 13,
        "nvidia-cudnn-cu13": 13,
        "nvidia-cusparselt-cu13": 13,
        "nvidia-nccl-cu13": 13,
        "nvidia-nvshmem-cu13": 13,
    }


def test_the_default_index_s_torch_2_9_1_is_refused_by_a_cuda_13_profile_with_each_cu12_library_named():
    entries, graph = torch_lock("torch-2.9.1-cp312-cp312-manylinux_2_28_x86_64.whl")
    with pytest.raises(lr.LockRefused) as err:
        lr.judge_lock(entries, graph, {}, profile())
    problems = str(err.value).split(" | ")
    cu12 = [e["name"] for e in entries if e["name"].endswith("-cu12")]
    assert len(cu12) == 15
    assert len(problems) == len(cu12) + 1  # each library, and torch itself
    assert any(p.startswith("torch 2.9.1 is built for CUDA 12 (the CUDA libraries it requires (") for p in problems[1:])
    assert (
        "nvidia-cublas-cu12 12.8.4.1 is built for CUDA 12 (name suffix -cu12), the profile's CUDA is 13.0;"
        " required by torch 2.9.1" in str(err.value)
    )


@pytest.mark.parametrize(("torchvision", "ok"), [("0.26.0", True), ("0.24.1", False)])
def test_the_real_torchvision_pairs_by_its_metadata_pin(torchvision, ok):
    tv_file, tv_requires = real(f"torchvision-{torchvision}-cp312-cp312-manylinux_2_28_x86_64.whl")
    entries, graph = torch_lock("torch-2.11.0-cp312-cp312-manylinux_2_28_x86_64.whl")
    entries.append(entry("torchvision", torchvision, tv_file))
    graph["torch"].append("torchvision")
    assert lr.metadata_wanted(entries, {}, graph) == ["torchvision"]
    if ok:
        pair = lr.judge_lock(entries, graph, {"torchvision": tv_requires}, profile())["companions"]
        assert pair[0]["by"] == "its METADATA: torch==2.11.0" and pair[0]["ok"]
    else:
        with pytest.raises(
            lr.LockRefused,
            match=r"torchvision 0\.24\.1 does not pair with torch 2\.11\.0 \(its METADATA pairs torch==2\.9\.1\)",
        ):
            lr.judge_lock(entries, graph, {"torchvision": tv_requires}, profile())


@pytest.mark.parametrize("version", ["2.11.0+cpu", "2.11.0"])
def test_a_torch_built_without_cuda_is_refused_in_a_cuda_stack(version):
    entries = lock_of(("torch", version), ("sglang", "0.5.9"))
    graph = {"torch": ["sglang", lr.ROOT], "sglang": [lr.ROOT]}
    with pytest.raises(lr.LockRefused) as err:
        lr.judge_lock(entries, graph, {}, profile())
    assert (
        f"torch {version} is built for no CUDA (no local tag cuNNN and no CUDA library among what it requires: a build"
        " without CUDA), the profile's CUDA is 13.0; required by sglang 0.5.9, the plan's requirements. Fix: choose a"
        " CUDA 13 build of torch in wheels.packages (its local_tag, or an index of such builds)"
    ) in str(err.value)
