# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Redist manifests: parsing, selection, platform mapping, verification, extraction."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile

import pytest

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
