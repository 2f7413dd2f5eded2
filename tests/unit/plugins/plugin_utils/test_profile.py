"""Stack profiles: every shipped profile validates; bad ones fail with the field's path and a fix."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import yaml

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _server
from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _profile as prof

STACKS = Path(prof.STACKS_DIR)
SHIPPED = sorted(p.stem for p in STACKS.glob("*.yml"))


def load(name):
    return yaml.safe_load((STACKS / f"{name}.yml").read_text())


def test_the_four_profiles_ship():
    assert {"cu128", "cu130", "lab", "lab-cu128"} <= set(SHIPPED)


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_profile_is_valid(name):
    assert prof.validate(load(name)) == []


def test_cu130_targets_cuda_13_with_the_flashinfer_trio():
    profile = load("cu130")
    assert profile["cuda"]["version"] == "13.0"
    names = {p["name"]: p for p in profile["wheels"]["packages"]}
    assert names["flashinfer-jit-cache"]["local_tag"] == "cu130"
    trio = ["flashinfer-python", "flashinfer-cubin", "flashinfer-jit-cache"]
    assert trio in profile["wheels"]["rules"]["same_version"]


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda p: p["cuda"].__setitem__("version", "13"), "cuda.version"),
        (lambda p: p["wheels"]["packages"][2].__setitem__("spec", 7), "wheels.packages[2].spec"),
        (lambda p: p["cuda"].__setitem__("install_method", "curl"), "cuda.install_method"),
        (lambda p: p.__setitem__("colour", "blue"), "(top level): Additional properties"),
        (lambda p: p["serving"]["speculative"].pop("eagle_topk"), "serving.speculative"),
        (lambda p: p["wheels"]["packages"][0].__setitem__("local_tag", "cuda130"), "wheels.packages[0].local_tag"),
        (lambda p: p["wheels"]["packages"][0]["indexes"].append("nowhere"), "index 'nowhere'"),
        (lambda p: p["wheels"]["rules"]["same_version"].append(["torch", "ghost"]), "same_version[1]: 'ghost'"),
        (lambda p: p["cuda"]["sources"].pop("redist"), "cuda.sources.redist is missing"),
    ],
)
def test_bad_profile_names_the_field(mutate, expected):
    profile = copy.deepcopy(load("cu130"))
    mutate(profile)
    errors = prof.validate(profile)
    assert errors, "the broken profile validated"
    assert any(expected in e for e in errors), errors


def test_load_by_name_records_source_and_hash():
    profile = prof.load_profile(name="lab")
    assert profile["source"]["path"].endswith("stacks/lab.yml")
    assert len(profile["source"]["sha256"]) == 64


def test_unknown_profile_lists_known_ones():
    with pytest.raises(prof.ProfileError) as err:
        prof.load_profile(name="cu999")
    assert "cu999" in str(err.value) and "cu130" in str(err.value)


def test_search_dirs_come_first(tmp_path):
    site = copy.deepcopy(load("lab"))
    site["description"] = "site copy"
    (tmp_path / "lab.yml").write_text(yaml.safe_dump(site))
    assert prof.load_profile(name="lab", search_dirs=[str(tmp_path)])["description"] == "site copy"


def test_invalid_file_fails_with_path(tmp_path):
    bad = copy.deepcopy(load("lab"))
    bad["python"]["version"] = 3.11
    path = tmp_path / "bad.yml"
    path.write_text(yaml.safe_dump(bad))
    with pytest.raises(prof.ProfileError) as err:
        prof.load_profile(path=str(path))
    assert "python.version" in str(err.value) and str(path) in str(err.value)


def test_index_override_replaces_url_and_rejects_unknown_names():
    profile = prof.load_profile(name="lab", index_urls={"lab-main": "http://127.0.0.1:9/simple"})
    urls = {i["name"]: i["url"] for i in profile["wheels"]["indexes"]}
    assert urls["lab-main"] == "http://127.0.0.1:9/simple"
    with pytest.raises(prof.ProfileError, match="unknown index"):
        prof.load_profile(name="lab", index_urls={"nope": "http://127.0.0.1:9/simple"})


def test_default_index_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/mirror/simple")
    profile = prof.load_profile(name="cu130")
    default = next(i for i in profile["wheels"]["indexes"] if i["name"] == "default")
    assert default["url"] == "http://127.0.0.1:9/mirror/simple" and default["is_default"] is True


def test_redist_override():
    profile = prof.load_profile(name="lab", redist_url="http://127.0.0.1:9/redist")
    assert profile["cuda"]["sources"]["redist"]["url"] == "http://127.0.0.1:9/redist"


# ---------------------------------------------------------------- the host's settings (action stack_profile)


def test_a_host_without_its_own_settings_gets_the_profile_s():
    profile = load("cu130")
    got = prof.host_settings(profile)
    assert got == {
        "gpufleet_serving_port": profile["serving"]["port"],
        "gpufleet_gpu_required": profile["gpu"]["required"],
    }


@pytest.mark.parametrize(("port", "required"), [("31001", "no"), (31001, False), ("31001", "false")])
def test_the_inventory_s_settings_win_and_are_typed(port, required):
    got = prof.host_settings(load("cu130"), port, required)
    assert got == {"gpufleet_serving_port": 31001, "gpufleet_gpu_required": False}


@pytest.mark.parametrize("port", ["http", "0", 70000, "30000.5"])
def test_a_bad_port_names_the_variable_the_value_and_the_fix(port):
    with pytest.raises(
        ValueError, match=r"gpufleet_serving_port=.* is not a TCP port; set it to a number from 1 to 65535"
    ):
        prof.host_settings(load("cu130"), port)


def test_a_bad_gpu_required_names_the_variable_the_value_and_the_fix():
    with pytest.raises(
        ValueError, match=r"gpufleet_gpu_required='sometimes' is not a boolean; set it to true or false"
    ):
        prof.host_settings(load("cu130"), None, "sometimes")


def _rules(p):
    return p["wheels"]["rules"]


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (
            lambda p: p["wheels"].__setitem__("dependency_indexes", {"torchao": "nowhere"}),
            "wheels.dependency_indexes.torchao: index 'nowhere' is not declared",
        ),
        (
            lambda p: p["wheels"].__setitem__("dependency_indexes", {"torch": "pytorch-cu130"}),
            "wheels.dependency_indexes.torch: 'torch' is a profile package",
        ),
        (
            lambda p: _rules(p).__setitem__("companions", [{"package": "torchvision", "versions": {"2.11": "0.26"}}]),
            "wheels.rules.companions[0]: 'reason' is a required property",
        ),
        (
            lambda p: _rules(p).__setitem__(
                "companions", [{"package": "torchvision", "versions": {"2.11": "0.26.x"}, "reason": "r"}]
            ),
            "wheels.rules.companions[0].versions.2.11",
        ),
        (
            lambda p: _rules(p).__setitem__(
                "companions", [{"package": "torch_vision", "reason": "r"}, {"package": "Torch-Vision", "reason": "r"}]
            ),
            "wheels.rules.companions[1]: a second entry for 'Torch-Vision'",
        ),
        (
            lambda p: _rules(p).__setitem__("companions", [{"package": "torch", "reason": "r"}]),
            "wheels.rules.companions[0]: 'torch' cannot pair with itself",
        ),
        (lambda p: _rules(p).__setitem__("cuda_exceptions", [{"package": "cupy-cuda12x"}]), "cuda_exceptions[0]"),
    ],
)
def test_bad_lock_rules_name_the_field(mutate, expected):
    profile = copy.deepcopy(load("cu130"))
    mutate(profile)
    errors = prof.validate(profile)
    assert any(expected in e for e in errors), errors


def test_lock_rules_validate_when_well_formed():
    profile = copy.deepcopy(load("cu130"))
    profile["wheels"]["dependency_indexes"] = {"torchao": "default"}
    profile["wheels"]["rules"]["companions"] = [
        {"package": "torchvision", "versions": {"2.11": "0.26", "2.10": "0.25"}, "reason": "built against one torch"},
        {"package": "sgl-kernel", "reason": "pins torch exactly"},
    ]
    profile["wheels"]["rules"]["cuda_exceptions"] = [{"package": "nvidia-nvshmem-cu12", "reason": "unused"}]
    assert prof.validate(profile) == []


@pytest.mark.parametrize("value", ["0", "1", "false", ""])
def test_a_serving_env_variable_that_acts_by_its_presence_is_refused_with_the_reason(value):
    profile = copy.deepcopy(load("cu130"))
    profile["serving"]["env"] = {"FLASHINFER_DISABLE_JIT": value, "NCCL_P2P_DISABLE": "1"}
    errors = prof.validate(profile)
    assert len(errors) == 1, errors
    assert errors[0].startswith(f"serving.env.FLASHINFER_DISABLE_JIT: profile 'cu130' sets it to {value!r}")
    assert "whatever its value" in errors[0] and "flashinfer/jit/core.py" in errors[0]
    assert "fix: remove FLASHINFER_DISABLE_JIT from serving.env" in errors[0]


def test_a_profile_file_with_it_fails_to_load_naming_the_file(tmp_path):
    text = (prof.STACKS_DIR / "cu130.yml").read_text()
    bad = tmp_path / "mine.yml"
    bad.write_text(text.replace("  env: {}\n", '  env:\n    FLASHINFER_DISABLE_JIT: "0"\n', 1))
    with pytest.raises(prof.ProfileError, match=r"mine\.yml is invalid: serving\.env\.FLASHINFER_DISABLE_JIT"):
        prof.load_profile(path=str(bad))


@pytest.mark.parametrize("name", SHIPPED)
def test_no_shipped_profile_sets_a_presence_flag(name):
    assert set(load(name)["serving"].get("env") or {}).isdisjoint(_server.PRESENCE_FLAGS)


def test_a_site_mirror_replaces_an_index_s_url_and_where_its_files_are_unless_the_site_says_where():
    shipped = prof.load_profile(name="cu130")
    (sgl,) = [i for i in shipped["wheels"]["indexes"] if i["name"] == "sgl-kernel-cu130"]
    assert sgl["files"] == ["https://github.com/sgl-project/whl/releases/download/"] and "site_mirror" not in sgl
    mirror = "https://mirror.site.example/sgl/cu130"
    profile = prof.load_profile(name="cu130", index_urls={"sgl-kernel-cu130": mirror})
    (sgl,) = [i for i in profile["wheels"]["indexes"] if i["name"] == "sgl-kernel-cu130"]
    assert sgl == {"name": "sgl-kernel-cu130", "url": mirror, "site_mirror": True}
    files = ["https://assets.site.example/sgl/"]
    profile = prof.load_profile(name="cu130", index_urls={"sgl-kernel-cu130": {"url": mirror, "files": files}})
    (sgl,) = [i for i in profile["wheels"]["indexes"] if i["name"] == "sgl-kernel-cu130"]
    assert sgl == {"name": "sgl-kernel-cu130", "url": mirror, "site_mirror": True, "files": files}


@pytest.mark.parametrize(
    "mirror, said",
    [
        ({"url": "https://m.example/simple", "files": ["file:///srv/wheels/"]}, ".files is ['file:///srv/wheels/']"),
        ({"url": "https://m.example/simple", "files": "https://m.example/"}, ".files is 'https://m.example/'"),
        ({"files": ["https://m.example/"]}, "not a URL nor {url, files}"),
        ({"url": "https://m.example/simple", "file": ["https://m.example/"]}, "not a URL nor {url, files}"),
    ],
)
def test_a_site_mirror_that_is_not_a_url_nor_url_and_files_is_refused_with_the_fix(mirror, said):
    with pytest.raises(prof.ProfileError) as refused:
        prof.load_profile(name="cu130", index_urls={"sgl-kernel-cu130": mirror})
    assert "gpufleet_index_urls.sgl-kernel-cu130" in str(refused.value) and said in str(refused.value)
    assert "fix: set gpufleet_index_urls.sgl-kernel-cu130 to the mirror's URL, or to {url:" in str(refused.value)


def test_an_index_s_files_are_http_url_prefixes(tmp_path):
    text = (STACKS / "lab.yml").read_text()
    bad = tmp_path / "bad.yml"
    index = "url: http://127.0.0.1:38100/simple\n"
    bad.write_text(text.replace(index, index + "      files: [file:///srv/]\n", 1))
    with pytest.raises(prof.ProfileError, match=re.escape("wheels.indexes[0].files[0]")):
        prof.load_profile(path=str(bad))
