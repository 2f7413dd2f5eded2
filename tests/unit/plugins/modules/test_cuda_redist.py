# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""cuda_redist_fetch and cuda_redist on NVIDIA's real manifests (tests/data/redist): planning, release checks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from ansible.module_utils.testing import patch_module_args
from module_harness import Exit, Fail

from ansible_collections.gpufleet.upgrade.plugins.modules import cuda_redist, cuda_redist_fetch

REPO = Path(__file__).resolve().parents[4]
REDIST_DATA = REPO / "tests" / "data" / "redist"
HOSTS = {"h200-1": "x86_64", "gh200-1": "aarch64"}


def call(module, args, check=False):
    with patch_module_args(dict(args, _ansible_check_mode=check)), pytest.raises((Exit, Fail)) as info:
        module.main()
    return info.type is Exit, info.value.args[0]


def recorded(release):
    return json.loads((REDIST_DATA / f"redistrib_{release}.json").read_text())


def mirror_of(tmp_path, release, edit=None):
    """A file:// redist tree holding one recorded manifest (archives absent: download=false never reads them)."""
    manifest = recorded(release)
    if edit:
        edit(manifest)
    root = tmp_path / "mirror"
    root.mkdir()
    (root / f"redistrib_{release}.json").write_text(json.dumps(manifest, indent=4))
    return root


def fetch_args(root, tmp_path, release, components):
    return {
        "base_url": root.as_uri(),
        "release": release,
        "components": components,
        "hosts": HOSTS,
        "cache_dir": str(tmp_path / "cache"),
        "download": False,
    }


def test_fetch_plans_the_cu130_profile_from_the_real_manifest_for_both_platforms(tmp_path):
    cuda = yaml.safe_load((REPO / "stacks" / "cu130.yml").read_text())["cuda"]
    root, manifest = mirror_of(tmp_path, cuda["release"]), recorded(cuda["release"])
    ok, res = call(cuda_redist_fetch, fetch_args(root, tmp_path, cuda["release"], cuda["components"]))
    assert ok, res
    assert res["platforms"] == {"h200-1": "linux-x86_64", "gh200-1": "linux-sbsa"}
    for platform, archives in res["plan"].items():
        assert [(a["component"], a["sha256"], a["size"]) for a in archives] == [
            (c, manifest[c][platform]["sha256"], int(manifest[c][platform]["size"])) for c in cuda["components"]
        ]
    assert (tmp_path / "cache" / f"redistrib_{cuda['release']}.json").read_bytes() == (
        root / f"redistrib_{cuda['release']}.json"
    ).read_bytes()


def test_fetch_picks_cuda_compat_variant_of_the_release(tmp_path):
    root, manifest = mirror_of(tmp_path, "13.1.1"), recorded("13.1.1")
    ok, res = call(cuda_redist_fetch, fetch_args(root, tmp_path, "13.1.1", ["cuda_nvcc", "cuda_compat"]))
    assert ok, res
    compat = res["plan"]["linux-sbsa"][1]
    assert compat["variant"] == "cuda13.1"
    assert compat["relative_path"] == manifest["cuda_compat"]["linux-sbsa"]["cuda13.1"]["relative_path"]


def test_fetch_refuses_another_releases_manifest_under_the_name_and_caches_nothing(tmp_path):
    root = mirror_of(tmp_path, "13.0.2", edit=lambda m: m.update(release_label="13.0.1"))
    ok, res = call(cuda_redist_fetch, fetch_args(root, tmp_path, "13.0.2", ["cuda_nvcc"]))
    assert not ok and res["kind"] == "release_mismatch"
    assert "release_label is '13.0.1', not '13.0.2'" in res["msg"] and root.as_uri() in res["msg"]
    assert not (tmp_path / "cache").exists()


def test_fetch_bad_entry_of_the_real_manifest_names_the_host_and_caches_nothing(tmp_path):
    def break_sbsa_size(manifest):
        manifest["cuda_nvcc"]["linux-sbsa"]["size"] = "-1"

    root = mirror_of(tmp_path, "13.0.2", edit=break_sbsa_size)
    ok, res = call(cuda_redist_fetch, fetch_args(root, tmp_path, "13.0.2", ["cuda_nvcc"]))
    assert not ok and res["kind"] == "bad_entry"
    assert res["msg"].startswith("host(s) gh200-1 (linux-sbsa):")
    assert "cuda_nvcc linux-sbsa field 'size' is '-1' (a negative byte count)" in res["msg"]
    assert not (tmp_path / "cache").exists()


def test_fetch_cccl_rename_hint_on_the_real_13_3_manifest(tmp_path):
    root = mirror_of(tmp_path, "13.3.0")
    ok, res = call(cuda_redist_fetch, fetch_args(root, tmp_path, "13.3.0", ["cuda_nvcc", "cuda_cccl"]))
    assert not ok and res["kind"] == "unknown_component"
    assert "cuda_cccl is not in" in res["msg"] and "calls it 'cccl'" in res["msg"]


def planned_archive(release="13.0.2", component="cuda_nvcc", platform="linux-x86_64"):
    """One archive as cuda_redist_fetch plans it, from the recorded manifest."""
    manifest = recorded(release)
    item = manifest[component][platform]
    return {
        "component": component,
        "name": manifest[component]["name"],
        "version": manifest[component]["version"],
        "platform": platform,
        "relative_path": item["relative_path"],
        "sha256": item["sha256"],
        "size": int(item["size"]),
        "top_dir": item["relative_path"].rsplit("/", 1)[1].removesuffix(".tar.xz"),
    }


@pytest.mark.parametrize("check", [True, False])
def test_redist_refuses_a_release_not_of_the_form_xyz_even_in_check_mode(tmp_path, check):
    args = {"dest": str(tmp_path / "cuda-13.0"), "release": "13.0", "archives": [planned_archive()]}
    ok, res = call(cuda_redist, args, check=check)
    assert not ok and res["kind"] == "unknown_version"
    assert "'13.0'" in res["msg"] and "X.Y.Z" in res["msg"] and "Nothing was installed" in res["msg"]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("field", "value", "problem"),
    [
        ("sha256", None, "the archive cannot be verified without it"),
        ("sha256", "x" * 64, "not 64 hexadecimal digits"),
        ("size", "-1", "a negative byte count"),
        ("size", True, "not a whole number of bytes"),
    ],
)
def test_redist_refuses_a_hand_edited_plan_entry(tmp_path, field, value, problem):
    archive = dict(planned_archive(), **{field: value})
    args = {"dest": str(tmp_path / "cuda-13.0"), "release": "13.0.2", "archives": [archive]}
    ok, res = call(cuda_redist, args, check=True)
    assert not ok and res["kind"] == "archives"
    assert f"archives[0] (cuda_nvcc) has {field} {value!r} ({problem}" in res["msg"]
    assert "Nothing was installed" in res["msg"]
