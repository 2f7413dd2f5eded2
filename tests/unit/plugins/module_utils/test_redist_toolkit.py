# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Toolkits on a host: nvcc output, version.json, target judgement, alternatives, link plan."""

from __future__ import annotations

import json

import pytest

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _toolkit as tk

NVCC_13 = """nvcc: NVIDIA (R) Cuda compiler driver
Copyright (c) 2005-2025 NVIDIA Corporation
Built on Wed_Aug_20_01:58:59_PM_PDT_2025
Cuda compilation tools, release 13.0, V13.0.88
Build cuda_13.0.r13.0/compiler.36424714_0
"""

QUERY = """Name: cuda
Link: /usr/local/cuda
Status: auto
Best: /usr/local/cuda-13.0
Value: /usr/local/cuda-13.0

Alternative: /usr/local/cuda-12.8
Priority: 128

Alternative: /usr/local/cuda-13.0
Priority: 130
"""


def toolkit(path, release, components, managed=False):
    path.mkdir(parents=True)
    data = {"cuda": {"name": "CUDA SDK", "version": release}}
    data.update({c: {"name": c, "version": "1"} for c in components})
    (path / "version.json").write_text(json.dumps(data))
    if managed:
        (path / tk.MARKER).write_text("{}")
    return str(path)


def test_parse_nvcc_version():
    assert tk.parse_nvcc_version(NVCC_13) == {"release": "13.0", "version": "13.0.88"}
    assert tk.parse_nvcc_version("bash: nvcc: command not found") is None
    assert tk.parse_nvcc_version("") is None


def test_summarize_version_json():
    release, comps = tk.summarize_version_json(
        {"cuda": {"name": "CUDA SDK", "version": "12.8.1"}, "cuda_nvcc": {"name": "n", "version": "12.8.93"}}
    )
    assert release == "12.8.1"
    assert comps == {"cuda_nvcc": "12.8.93"}
    assert tk.summarize_version_json(None) == (None, {})


def test_find_toolkits_skips_links_and_others(tmp_path):
    toolkit(tmp_path / "cuda-12.8", "12.8.1", ["cuda_nvcc"])
    toolkit(tmp_path / "cuda-13.0", "13.0.2", ["cuda_nvcc"])
    (tmp_path / "cuda").symlink_to("cuda-12.8")
    (tmp_path / "cuda-13.0.bak").mkdir()
    (tmp_path / "lib").mkdir()
    assert tk.find_toolkits(str(tmp_path)) == [str(tmp_path / "cuda-12.8"), str(tmp_path / "cuda-13.0")]
    assert tk.find_toolkits(str(tmp_path / "missing")) == []


@pytest.mark.parametrize(
    ("setup", "status", "missing"),
    [
        (lambda p: None, "absent", ["cuda_nvcc", "cuda_cudart"]),
        (lambda p: p.mkdir(), "absent", ["cuda_nvcc", "cuda_cudart"]),
        (lambda p: toolkit(p, "13.0.2", ["cuda_nvcc", "cuda_cudart", "cuda_cccl"]), "present", []),
        (lambda p: toolkit(p, "13.0.2", ["cuda_nvcc"], managed=True), "incomplete", ["cuda_cudart"]),
        (lambda p: toolkit(p, "13.0.2", ["cuda_nvcc"]), "foreign", ["cuda_cudart"]),
        (lambda p: toolkit(p, "13.0.1", ["cuda_nvcc", "cuda_cudart"], managed=True), "other_release", []),
        (lambda p: toolkit(p, "13.0.1", ["cuda_nvcc", "cuda_cudart"]), "foreign", []),
    ],
)
def test_target_status(tmp_path, setup, status, missing):
    path = tmp_path / "cuda-13.0"
    setup(path)
    judged = tk.target_status(str(path), "13.0.2", ["cuda_nvcc", "cuda_cudart"])
    assert judged["status"] == status
    assert judged["missing"] == missing


def test_target_status_not_a_toolkit(tmp_path):
    path = tmp_path / "cuda-13.0"
    path.mkdir()
    (path / "notes.txt").write_text("hello")
    judged = tk.target_status(str(path), "13.0.2", ["cuda_nvcc"])
    assert judged["status"] == "not_a_toolkit"
    assert "no toolkit" in judged["reason"]
    (tmp_path / "cuda-13.1").write_text("a file")
    assert tk.target_status(str(tmp_path / "cuda-13.1"), "13.1.0", [])["status"] == "not_a_toolkit"
    (tmp_path / "cuda-13.2").symlink_to("cuda-13.0")
    assert tk.target_status(str(tmp_path / "cuda-13.2"), "13.2.0", [])["status"] == "not_a_toolkit"


def test_parse_alternatives():
    q = tk.parse_alternatives(QUERY)
    assert q["mode"] == "auto"
    assert q["value"] == "/usr/local/cuda-13.0"
    assert q["link"] == "/usr/local/cuda"
    assert q["choices"] == [
        {"path": "/usr/local/cuda-12.8", "priority": 128},
        {"path": "/usr/local/cuda-13.0", "priority": 130},
    ]
    assert tk.parse_alternatives("update-alternatives: error: no alternatives for cuda") is None
    assert tk.parse_alternatives(QUERY.replace("Value: /usr/local/cuda-13.0", "Value: none"))["value"] is None


def test_link_state_and_resolve_home(tmp_path):
    old = toolkit(tmp_path / "cuda-12.8", "12.8.1", ["cuda_nvcc"])
    link = tmp_path / "cuda"
    assert tk.link_state(str(link))["exists"] is False
    link.symlink_to("cuda-12.8")
    state = tk.link_state(str(link))
    assert state["target"] == "cuda-12.8"
    assert state["resolved"] == old
    assert tk.resolve_home(str(link), [old]) == old
    assert tk.resolve_home(str(tmp_path / "nowhere"), [old]) is None


def test_link_plan():
    assert tk.link_plan("keep", "/usr/local/cuda-12.8", "/usr/local/cuda-13.0") == "/usr/local/cuda-12.8"
    assert tk.link_plan("keep", None, "/usr/local/cuda-13.0") is None
    assert tk.link_plan("target", "/usr/local/cuda-12.8", "/usr/local/cuda-13.0") == "/usr/local/cuda-13.0"
    with pytest.raises(ValueError):
        tk.link_plan("sometimes", None, "/x")
