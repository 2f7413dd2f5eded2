# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Redist manifests: parsing, selection, platform mapping, verification, extraction."""

from __future__ import annotations

import hashlib
import io
import json
import os
import posixpath
import tarfile
from pathlib import Path

import pytest
import yaml

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _redist as rd

# The shape of NVIDIA's redistrib_13.0.2.json, cut down to three components.
MANIFEST = {
    "release_date": "2025-10-09",
    "release_label": "13.0.2",
    "release_product": "cuda",
    "cuda_nvcc": {
        "name": "CUDA NVCC",
        "license": "CUDA Toolkit",
        "version": "13.0.88",
        "linux-x86_64": {
            "relative_path": "cuda_nvcc/linux-x86_64/cuda_nvcc-linux-x86_64-13.0.88-archive.tar.xz",
            "sha256": "A" * 64,
            "md5": "0" * 32,
            "size": "72019340",
        },
        "linux-sbsa": {
            "relative_path": "cuda_nvcc/linux-sbsa/cuda_nvcc-linux-sbsa-13.0.88-archive.tar.xz",
            "sha256": "b" * 64,
            "md5": "0" * 32,
            "size": "65000000",
        },
    },
    "cuda_cudart": {
        "name": "CUDA Runtime (cudart)",
        "license": "CUDA Toolkit",
        "version": "13.0.96",
        "linux-x86_64": {
            "relative_path": "cuda_cudart/linux-x86_64/cuda_cudart-linux-x86_64-13.0.96-archive.tar.xz",
            "sha256": "c" * 64,
            "md5": "0" * 32,
            "size": "1000",
        },
    },
    "cuda_cccl": {
        "name": "CXX Core Compute Libraries",
        "license": "CUDA Toolkit",
        "version": "13.0.85",
        "linux-x86_64": {
            "relative_path": "cuda_cccl/linux-x86_64/cuda_cccl-linux-x86_64-13.0.85-archive.tar.xz",
            "sha256": "d" * 64,
            "md5": "0" * 32,
            "size": "2000",
        },
    },
}


def raw(data=None):
    return json.dumps(MANIFEST if data is None else data).encode()


@pytest.mark.parametrize(
    ("machine", "platform"),
    [("x86_64", "linux-x86_64"), ("amd64", "linux-x86_64"), ("aarch64", "linux-sbsa"), ("arm64", "linux-sbsa")],
)
def test_platform_mapping(machine, platform):
    assert rd.platform_for(machine) == platform


def test_unknown_machine_is_refused():
    with pytest.raises(rd.RedistError) as info:
        rd.platform_for("riscv64")
    assert info.value.kind == "platform"
    assert "riscv64" in str(info.value)


def test_manifest_name_checks_release():
    assert rd.manifest_name("13.0.2") == "redistrib_13.0.2.json"
    assert rd.manifest_url("http://m/redist/", "13.0.2") == "http://m/redist/redistrib_13.0.2.json"
    with pytest.raises(rd.RedistError) as info:
        rd.manifest_name("13.0")
    assert info.value.kind == "unknown_version"


def test_parse_manifest_accepts_nvidia_shape():
    data = rd.parse_manifest(raw(), "m.json")
    assert data["release_label"] == "13.0.2"
    assert rd.components_of(data) == ["cuda_cccl", "cuda_cudart", "cuda_nvcc"]
    assert rd.platforms_of(data, "cuda_nvcc") == ["linux-sbsa", "linux-x86_64"]


@pytest.mark.parametrize(
    ("body", "kind"),
    [
        (b"<!DOCTYPE html><html><body>Not found</body></html>", "html"),
        (b"  <html><head></head></html>", "html"),
        (raw()[:100], "json"),
        (b'{"some": "json"}', "json"),
        (b"[1, 2]", "json"),
    ],
)
def test_parse_manifest_rejects_html_truncated_and_foreign_json(body, kind):
    with pytest.raises(rd.RedistError) as info:
        rd.parse_manifest(body, "http://mirror/redistrib_13.0.2.json")
    assert info.value.kind == kind
    assert "http://mirror/redistrib_13.0.2.json" in str(info.value)


def test_select_keeps_the_requested_order_and_normalises():
    archives = rd.select(MANIFEST, ["cuda_nvcc", "cuda_cudart"], "linux-x86_64")
    assert [a["component"] for a in archives] == ["cuda_nvcc", "cuda_cudart"]
    nvcc = archives[0]
    assert nvcc["size"] == 72019340
    assert nvcc["sha256"] == "a" * 64
    assert nvcc["top_dir"] == "cuda_nvcc-linux-x86_64-13.0.88-archive"
    assert nvcc["version"] == "13.0.88"


def test_select_unknown_component_names_it_and_what_exists():
    with pytest.raises(rd.RedistError) as info:
        rd.select(MANIFEST, ["cuda_nvcc", "cuda_nvfoo"], "linux-x86_64", "redistrib_13.0.2.json")
    assert info.value.kind == "unknown_component"
    msg = str(info.value)
    assert "cuda_nvfoo" in msg and "cuda_cccl" in msg and "cuda_toolkit_components" in msg


def test_select_platform_missing_names_platform_and_offer():
    with pytest.raises(rd.RedistError) as info:
        rd.select(MANIFEST, ["cuda_nvcc", "cuda_cudart"], "linux-sbsa")
    assert info.value.kind == "platform"
    assert "linux-sbsa" in str(info.value) and "cuda_cudart" in str(info.value)
    assert "cuda_nvcc" not in str(info.value).split("offers", maxsplit=1)[0].split("for ")[1]


def test_select_refuses_unsafe_relative_path():
    bad = json.loads(json.dumps(MANIFEST))
    bad["cuda_cccl"]["linux-x86_64"]["relative_path"] = "../../etc/passwd.tar.xz"
    with pytest.raises(rd.RedistError):
        rd.select(bad, ["cuda_cccl"], "linux-x86_64")


def test_plan_and_unique_archives_across_platforms():
    per = rd.plan(MANIFEST, ["cuda_nvcc"], ["linux-x86_64", "linux-sbsa", "linux-x86_64"])
    assert sorted(per) == ["linux-sbsa", "linux-x86_64"]
    assert len(rd.unique_archives(per)) == 2
    assert len(rd.unique_archives({"a": per["linux-x86_64"], "b": per["linux-x86_64"]})) == 1


def test_required_bytes():
    archives = rd.select(MANIFEST, ["cuda_cudart", "cuda_cccl"], "linux-x86_64")
    assert rd.required_bytes(archives, 3.0) == 12000


def test_top_dir_suffixes():
    assert rd.top_dir("x/y/cuda_crt-linux-x86_64-13.0.88-archive.tar.xz") == "cuda_crt-linux-x86_64-13.0.88-archive"
    assert rd.top_dir("a.tar.gz") == "a"


def test_releases_in_listing():
    html = '<a href="redistrib_13.0.2.json">x</a><a href="redistrib_12.10.1.json"></a><a href="redistrib_12.8.1.json">'
    assert rd.releases_in_listing(html) == ["12.8.1", "12.10.1", "13.0.2"]


def test_version_json_format():
    archives = rd.select(MANIFEST, ["cuda_nvcc"], "linux-x86_64")
    assert rd.version_json(archives, "13.0.2") == {
        "cuda": {"name": "CUDA SDK", "version": "13.0.2"},
        "cuda_nvcc": {"name": "CUDA NVCC", "version": "13.0.88"},
    }


def test_verify_file_good_truncated_and_tampered(tmp_path):
    data = b"x" * 1000
    path = tmp_path / "a.tar.xz"
    path.write_bytes(data)
    good = hashlib.sha256(data).hexdigest()
    rd.verify_file(str(path), good.upper(), 1000)
    path.write_bytes(data[:400])
    with pytest.raises(rd.RedistError) as info:
        rd.verify_file(str(path), good, 1000)
    assert info.value.kind == "truncated" and "400 of 1000" in str(info.value)
    path.write_bytes(b"y" + data[1:])
    with pytest.raises(rd.RedistError) as info:
        rd.verify_file(str(path), good, 1000)
    assert info.value.kind == "sha256" and good in str(info.value)


def test_verify_file_tells_a_wrong_manifest_size_from_a_bad_download(tmp_path):
    data = b"x" * 1000
    path = tmp_path / "cuda_nvcc.tar.xz"
    path.write_bytes(data)
    good = hashlib.sha256(data).hexdigest()
    # Same sha256, other size: the manifest is wrong, and another run would fail the same way.
    for listed in (900, 1100):
        with pytest.raises(rd.RedistError) as info:
            rd.verify_file(str(path), good, listed, component="cuda_nvcc", manifest="redistrib_13.0.2.json")
        msg = str(info.value)
        assert (
            info.value.kind == "manifest_size" and "is 1000 bytes, while the size field in redistrib_13.0.2.json" in msg
        )
        assert f"says {listed}" in msg and "running again will not help" in msg
    # Another sha256 and larger than listed: another file under this name, not a cut download.
    path.write_bytes(data + b"extra")
    with pytest.raises(rd.RedistError) as info:
        rd.verify_file(str(path), good, 1000, component="cuda_nvcc")
    assert info.value.kind == "size" and "1005 bytes, larger than the 1000 bytes" in str(info.value)
    assert "serves another file" in str(info.value)


def make_archive(path, top, files, extra_members=()):
    with tarfile.open(path, "w:xz") as tar:
        for name, content in files.items():
            info = tarfile.TarInfo(f"{top}/{name}")
            info.size = len(content)
            info.mode = 0o755
            info.uid, info.uname = 4242, "builder"
            tar.addfile(info, io.BytesIO(content))
        for member in extra_members:
            tar.addfile(member)
    return str(path)


def test_extract_merges_top_folder_into_dest(tmp_path):
    dest = tmp_path / "staging"
    dest.mkdir()
    a = make_archive(tmp_path / "a.tar.xz", "a-archive", {"bin/nvcc": b"n", "LICENSE": b"1", "include/a.h": b"a"})
    b = make_archive(tmp_path / "b.tar.xz", "b-archive", {"include/b.h": b"b", "LICENSE": b"2"})
    written = rd.extract_archive(a, "a-archive", str(dest)) + rd.extract_archive(b, "b-archive", str(dest))
    assert sorted(os.listdir(dest)) == ["LICENSE", "bin", "include"]
    assert (dest / "include" / "a.h").read_bytes() == b"a"
    assert (dest / "include" / "b.h").read_bytes() == b"b"
    assert (dest / "LICENSE").read_bytes() == b"2"
    assert "bin/nvcc" in written
    assert os.stat(dest / "bin" / "nvcc").st_mode & 0o111


def test_extract_keeps_relative_symlinks(tmp_path):
    dest = tmp_path / "staging"
    dest.mkdir()
    link = tarfile.TarInfo("c-archive/lib/libcudart.so")
    link.type, link.linkname = tarfile.SYMTYPE, "libcudart.so.13"
    path = make_archive(tmp_path / "c.tar.xz", "c-archive", {"lib/libcudart.so.13": b"elf"}, [link])
    rd.extract_archive(path, "c-archive", str(dest))
    assert os.readlink(dest / "lib" / "libcudart.so") == "libcudart.so.13"


@pytest.mark.parametrize(
    ("name", "linkname"),
    [
        ("d-archive/../../evil", None),
        ("/abs/evil", None),
        ("d-archive/lib/x", "/etc/shadow"),
        ("d-archive/x", "../../../y"),
    ],
)
def test_extract_refuses_unsafe_members(tmp_path, name, linkname):
    member = tarfile.TarInfo(name)
    if linkname:
        member.type, member.linkname = tarfile.SYMTYPE, linkname
    path = make_archive(tmp_path / "d.tar.xz", "d-archive", {"ok": b"1"}, [member])
    dest = tmp_path / "staging"
    dest.mkdir()
    with pytest.raises(rd.RedistError) as info:
        rd.extract_archive(path, "d-archive", str(dest))
    assert info.value.kind == "unsafe"
    assert not (tmp_path / "evil").exists()


def test_extract_refuses_wrong_layout(tmp_path):
    path = make_archive(tmp_path / "e.tar.xz", "other-top", {"bin/x": b"1"})
    dest = tmp_path / "staging"
    dest.mkdir()
    with pytest.raises(rd.RedistError) as info:
        rd.extract_archive(path, "e-archive", str(dest))
    assert info.value.kind == "layout"


# --- NVIDIA's real manifests (tests/data/redist, see its README) and the shipped profiles ---

REPO = Path(__file__).resolve().parents[4]
REDIST_DATA = REPO / "tests" / "data" / "redist"
PLATFORMS = ("linux-x86_64", "linux-sbsa")


def real(release):
    """A recorded manifest, parsed as the modules parse it; a fresh copy each call, so tests may break it."""
    name = f"redistrib_{release}.json"
    return rd.parse_manifest((REDIST_DATA / name).read_bytes(), name)


def profile_cuda(profile):
    return yaml.safe_load((REPO / "stacks" / f"{profile}.yml").read_text())["cuda"]


def recorded_release(cuda):
    """The profile's release when it is recorded, else the one recorded release of its CUDA version."""
    if (REDIST_DATA / f"redistrib_{cuda['release']}.json").is_file():
        return cuda["release"]
    same = [p.stem.split("_", 1)[1] for p in REDIST_DATA.glob(f"redistrib_{cuda['version']}.*.json")]
    assert len(same) == 1, f"record one manifest of CUDA {cuda['version']} in {REDIST_DATA}"
    return same[0]


@pytest.mark.parametrize("profile", ["cu130", "cu128"])
def test_real_manifest_plans_the_profile_components_with_nvidia_fields(profile):
    cuda = profile_cuda(profile)
    manifest = real(recorded_release(cuda))
    per_platform = rd.plan(manifest, cuda["components"], PLATFORMS)
    assert sorted(per_platform) == sorted(PLATFORMS)
    for platform, archives in per_platform.items():
        assert [a["component"] for a in archives] == cuda["components"]
        for archive in archives:
            entry = manifest[archive["component"]]
            item = entry[platform]
            assert archive["version"] == entry["version"]
            assert archive["name"] == entry["name"]
            assert archive["relative_path"] == item["relative_path"]
            assert archive["relative_path"].startswith(f"{archive['component']}/{platform}/")
            assert archive["sha256"] == item["sha256"]  # NVIDIA writes lower case: nothing to normalise
            assert archive["size"] == int(item["size"])
            assert archive["variant"] is None
            assert archive["top_dir"] + ".tar.xz" == posixpath.basename(item["relative_path"])


def test_real_13_0_2_totals_match_the_recorded_figures():
    # The sums recorded when the manifest was first read (shared stack notes), for the nine components the cu130
    # profile had then: a check of the data, so the list is fixed here rather than read from the profile.
    nine = ["cuda_nvcc", "cuda_crt", "libnvvm", "cuda_cudart", "cuda_cccl", "cuda_nvrtc", "cuda_cupti"]
    nine += ["cuda_nvml_dev", "libcublas"]
    per_platform = rd.plan(real("13.0.2"), nine, PLATFORMS)
    assert {p: sum(a["size"] for a in archives) for p, archives in per_platform.items()} == {
        "linux-x86_64": 1_044_987_836,
        "linux-sbsa": 1_213_413_272,
    }


def test_real_13_3_renamed_cccl_gives_the_hint_naming_both_names():
    cuda = profile_cuda("cu130")
    assert "cuda_cccl" in cuda["components"]
    # The profile's components that the 13.3.0 recording carries (it keeps no cuobjdump or nvdisasm), and CCCL.
    recorded = rd.components_of(real("13.3.0"))
    cuda["components"] = [c for c in cuda["components"] if c in recorded or c == "cuda_cccl"]
    with pytest.raises(rd.RedistError) as info:
        rd.select(real("13.3.0"), cuda["components"], "linux-x86_64")
    msg = str(info.value)
    assert info.value.kind == "unknown_component"
    assert "cuda_cccl is not in redistrib_13.3.0.json" in msg and "calls it 'cccl'" in msg
    assert "cuda.components" in msg
    assert "Components it offers" not in msg  # every unknown name had a hint
    renamed = ["cccl" if c == "cuda_cccl" else c for c in cuda["components"]]
    archives = rd.select(real("13.3.0"), renamed, "linux-sbsa")
    assert [a["component"] for a in archives] == renamed
    with pytest.raises(rd.RedistError) as info:
        rd.select(real("13.0.2"), renamed, "linux-x86_64")
    assert "cccl is not in redistrib_13.0.2.json" in str(info.value) and "'cuda_cccl'" in str(info.value)


@pytest.mark.parametrize(("release", "variant"), [("13.1.1", "cuda13.1"), ("13.3.0", "cuda13.3")])
@pytest.mark.parametrize("platform", PLATFORMS)
def test_real_cuda_compat_variant_is_picked_for_the_release(release, variant, platform):
    manifest = real(release)
    assert f"cuda{manifest['cuda_compat']['cuda_variant'][0]}" == variant
    (archive,) = rd.select(manifest, ["cuda_compat"], platform)
    item = manifest["cuda_compat"][platform][variant]
    assert archive["variant"] == variant
    assert (archive["relative_path"], archive["sha256"], archive["size"]) == (
        item["relative_path"],
        item["sha256"],
        int(item["size"]),
    )
    assert archive["version"] == manifest["cuda_compat"]["version"]
    assert rd.select(manifest, ["cuda_compat"], platform, release=release) == [archive]


def test_real_cuda_compat_without_a_fitting_variant_is_a_clear_error():
    with pytest.raises(rd.RedistError) as info:
        rd.select(real("13.1.1"), ["cuda_compat"], "linux-x86_64", release="12.8.2")
    msg = str(info.value)
    assert info.value.kind == "variant"
    for words in ("redistrib_13.1.1.json", "cuda_compat", "linux-x86_64", "cuda13.1", "cuda12.8 or cuda12", "'12.8.2'"):
        assert words in msg
    assert "cuda.components" in msg and "cuda.release" in msg


def test_cuda_variant_two_of_the_major_and_none_exact_is_not_guessed():
    manifest = real("13.1.1")
    variants = manifest["cuda_compat"]["linux-sbsa"]
    item = variants.pop("cuda13.1")
    variants["cuda13.0"], variants["cuda13.2"] = dict(item), dict(item)
    with pytest.raises(rd.RedistError) as info:
        rd.select(manifest, ["cuda_compat"], "linux-sbsa")
    assert info.value.kind == "variant"
    assert "cuda13.0, cuda13.2" in str(info.value) and "cuda13.1 or cuda13" in str(info.value)


def test_real_component_without_the_platform_names_what_it_offers():
    # 12.8's cuda_compat is the Jetson (L4T) package: linux-aarch64 only.
    with pytest.raises(rd.RedistError) as info:
        rd.select(real("12.8.2"), ["cuda_nvcc", "cuda_compat"], "linux-sbsa")
    assert info.value.kind == "platform"
    assert "no linux-sbsa archive for cuda_compat (it offers linux-aarch64)" in str(info.value)


def test_real_linux_all_archive_serves_every_platform_once():
    manifest = real("13.0.2")
    per_platform = rd.plan(manifest, ["driver_assistant", "cuda_nvcc"], PLATFORMS)
    shared = {p: archives[0] for p, archives in per_platform.items()}
    assert {a["relative_path"] for a in shared.values()} == {manifest["driver_assistant"]["linux-all"]["relative_path"]}
    assert {p: a["platform"] for p, a in shared.items()} == {p: p for p in PLATFORMS}
    assert len(rd.unique_archives(per_platform)) == 3  # one driver_assistant, two cuda_nvcc


def test_real_manifest_release_label_is_checked():
    rd.check_release(real("13.0.2"), "13.0.2")
    manifest = real("13.0.2")
    manifest["release_label"] = "13.0.1"
    with pytest.raises(rd.RedistError) as info:
        rd.check_release(manifest, "13.0.2", "http://mirror/redist/redistrib_13.0.2.json")
    msg = str(info.value)
    assert info.value.kind == "release_mismatch"
    assert "http://mirror/redist/redistrib_13.0.2.json" in msg and "'13.0.1'" in msg and "'13.0.2'" in msg
    assert "copy redistrib_13.0.2.json again" in msg


BAD_ENTRY_FIX = "copy redistrib_13.0.2.json again from the profile's redist source (cuda.sources.redist)"


MISSING = object()


@pytest.mark.parametrize(
    ("field", "broken", "problem"),
    [
        ("sha256", lambda sha: MISSING, "the archive cannot be verified without it"),
        ("sha256", lambda sha: sha[:63], "not 64 hexadecimal digits"),
        ("sha256", lambda sha: sha + "\n", "not 64 hexadecimal digits"),
        ("size", lambda size: "-1", "a negative byte count"),
        ("size", lambda size: "12a", "not a whole number of bytes"),
        ("size", lambda size: True, "not a whole number of bytes"),
        ("relative_path", lambda rel: "../x", "it points outside the redist tree"),
        ("relative_path", lambda rel: MISSING, "no archive path"),
    ],
)
@pytest.mark.parametrize("platform", PLATFORMS)
def test_real_entry_broken_in_one_field_names_label_component_platform_field_value_fix(
    platform, field, broken, problem
):
    manifest = real("13.0.2")
    item = manifest["cuda_nvcc"][platform]
    value = broken(item.pop(field))
    if value is not MISSING:
        item[field] = value
    with pytest.raises(rd.RedistError) as info:
        rd.plan(manifest, profile_cuda("cu130")["components"], [platform])
    msg = str(info.value)
    shown = "missing" if value is MISSING else repr(value)
    assert info.value.kind == "bad_entry"
    assert f"redistrib_13.0.2.json: cuda_nvcc {platform} field {field!r} is {shown} ({problem})" in msg
    assert BAD_ENTRY_FIX in msg
    assert msg.count("field ") == 1  # only the broken entry is reported; the other components plan


def test_real_entry_without_version_names_the_field():
    manifest = real("13.0.2")
    del manifest["libnvvm"]["version"]
    with pytest.raises(rd.RedistError) as info:
        rd.select(manifest, profile_cuda("cu130")["components"], "linux-sbsa")
    msg = str(info.value)
    assert info.value.kind == "bad_entry"
    assert "redistrib_13.0.2.json: libnvvm linux-sbsa field 'version' is missing" in msg and BAD_ENTRY_FIX in msg


def test_real_entry_not_an_object_is_a_damaged_entry():
    manifest = real("13.0.2")
    manifest["cuda_nvcc"] = manifest["cuda_nvcc"]["version"]
    with pytest.raises(rd.RedistError) as info:
        rd.select(manifest, ["cuda_nvcc"], "linux-x86_64")
    assert info.value.kind == "bad_entry"
    assert "cuda_nvcc is '13.0.88', not a component entry" in str(info.value) and BAD_ENTRY_FIX in str(info.value)


def test_real_upper_case_sha256_is_accepted_and_lower_cased():
    manifest = real("13.0.2")
    nvidia = manifest["cuda_cudart"]["linux-x86_64"]["sha256"]
    manifest["cuda_cudart"]["linux-x86_64"]["sha256"] = nvidia.upper()
    (archive,) = rd.select(manifest, ["cuda_cudart"], "linux-x86_64")
    assert archive["sha256"] == nvidia and nvidia != nvidia.upper()


def test_real_broken_linux_all_and_variant_entries_say_where():
    manifest = real("13.1.1")
    del manifest["driver_assistant"]["linux-all"]["sha256"]
    del manifest["cuda_compat"]["linux-sbsa"]["cuda13.1"]["size"]
    with pytest.raises(rd.RedistError) as info:
        rd.select(manifest, ["driver_assistant", "cuda_compat"], "linux-sbsa")
    msg = str(info.value)
    assert "driver_assistant linux-all (for linux-sbsa) field 'sha256' is missing" in msg
    assert "cuda_compat linux-sbsa/cuda13.1 field 'size' is missing" in msg
