# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""wheel_plan with lock_file (playbooks/plan.yml) and wheel_lock (applying it): what is written, when, and what is
refused before any host changes. The planner itself is replaced by a fake: these tests are about the lock file."""

from __future__ import annotations

import hashlib
import io
import zipfile
from unittest.mock import MagicMock

import pytest
import yaml

from ansible_collections.gpufleet.upgrade.plugins.action import wheel_lock as lock_action
from ansible_collections.gpufleet.upgrade.plugins.action import wheel_plan as plan_action
from ansible_collections.gpufleet.upgrade.plugins.modules import wheel_lock as lock_module
from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _lock_file as lf

PROFILE = {
    "name": "lab",
    "python": {"version": "3.11"},
    "wheels": {"indexes": [{"name": "lab-main", "url": "http://127.0.0.1:1/simple"}], "packages": [], "rules": {}},
}


def wheel(version="0.3.21+cu130", name="lab-sgl-kernel", payload="x"):
    """A wheel's bytes: one module and its METADATA."""
    body = io.BytesIO()
    with zipfile.ZipFile(body, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("kernel/__init__.py", payload)
        archive.writestr(f"lab_sgl_kernel-{version}.dist-info/METADATA", f"Name: {name}\nVersion: {version}\n")
    return body.getvalue()


def fake_lock(target, kernel="0.3.21+cu130", content=None):
    content = wheel(kernel) if content is None else content
    filename = f"lab_sgl_kernel-{kernel}-py3-none-any.whl"
    sha = hashlib.sha256(content).hexdigest()
    digest = hashlib.sha256(f"{target.platform}{target.python_version}{sha}".encode()).hexdigest()
    return {
        "profile": "lab",
        "python": target.python_version,
        "platform": target.platform,
        "hash": digest,
        "hash12": digest[:12],
        "venv_name": f"lab-{digest[:12]}",
        "packages": [
            {
                "name": "lab-sgl-kernel",
                "version": kernel,
                "filename": filename,
                "url": f"http://127.0.0.1:1/{filename}",
                "sha256": sha,
                "size": len(content),
                "role": "profile",
            }
        ],
        "tools": [],
        "overrides": [],
        "report": {"lab-sgl-kernel": {"why": "newest", "sources": {}, "candidates": []}},
        "lock_rules": {},
    }


def make(action_module, name, args, check_mode=False, diff=False):
    task = MagicMock()
    task.args = args
    task.check_mode = check_mode
    task.diff = diff
    task.async_val = 0
    task.action = f"gpufleet.upgrade.{name}"
    plugin = action_module.ActionModule(task, MagicMock(), MagicMock(), MagicMock(), MagicMock(), MagicMock())
    plugin._templar.template = lambda value: value
    return plugin


@pytest.fixture
def index(monkeypatch):
    """A fake planner over an index whose kernel build the test can change; fills the wheelhouse like the real one."""
    state = {"kernel": "0.3.21+cu130", "content": wheel(), "targets": []}

    def make_lock(profile, target, fetcher, uv, tools, today, wheelhouse, cache_dir, reuse_wheelhouse):
        state["targets"].append((target.platform, target.python_version))
        return fake_lock(target, state["kernel"], state["content"])

    def fetch_wheelhouse(fetcher, lock, wheelhouse, profile=None):
        import os

        os.makedirs(wheelhouse, exist_ok=True)
        for entry in lock["packages"]:
            with open(os.path.join(wheelhouse, entry["filename"]), "wb") as handle:
                handle.write(state["content"])
        return {}

    monkeypatch.setattr(plan_action, "make_lock", make_lock)
    monkeypatch.setattr(plan_action, "find_uv", lambda path: "/usr/bin/uv")
    monkeypatch.setattr(plan_action, "fetch_wheelhouse", fetch_wheelhouse)
    return state


def plan(tmp_path, check_mode=False, hosts=None):
    args = {
        "profile": PROFILE,
        "controller_dir": str(tmp_path / "c"),
        "lock_file": str(tmp_path / "fleet.lock.yml"),
        "hosts": hosts or {"node1": "x86_64-manylinux_2_36", "node2": "x86_64-manylinux_2_39"},
    }
    return make(plan_action, "wheel_plan", args, check_mode=check_mode, diff=True).run(task_vars={})


def apply(tmp_path, **extra):
    args = {"path": str(tmp_path / "fleet.lock.yml"), "profile": PROFILE, "controller_dir": str(tmp_path / "c")}
    return make(lock_action, "wheel_lock", {**args, **extra}).run(task_vars={"inventory_hostname": "node1"})


def test_module_documentation_matches_its_argument_spec():
    doc = yaml.safe_load(lock_module.DOCUMENTATION)
    assert set(doc["options"]) == set(lock_module.ARGUMENT_SPEC)
    for name, spec in lock_module.ARGUMENT_SPEC.items():
        assert doc["options"][name]["type"] == spec["type"], name


def test_check_mode_shows_the_diff_and_writes_nothing(index, tmp_path):
    result = plan(tmp_path, check_mode=True)
    assert not result.get("failed"), result
    assert result["changed"] is True
    assert result["diff_lines"][0] == "no previous lock file: every package below is new"
    assert not (tmp_path / "fleet.lock.yml").exists() and not (tmp_path / "fleet.lock.report.txt").exists()
    assert "lab-sgl-kernel" in result["diff"]["after"] and result["diff"]["before"] == ""


def test_one_entry_per_group_at_its_lowest_glibc_then_a_plan_without_news_changes_nothing(index, tmp_path):
    first = plan(tmp_path, hosts={"n1": "x86_64-manylinux_2_39", "n2": "x86_64-manylinux_2_36", "g": "aarch64-linux"})
    assert index["targets"] == [("aarch64-linux", "3.11"), ("x86_64-manylinux_2_36", "3.11")]
    assert first["group_lines"] == [
        "group aarch64-linux Python 3.11: g",
        "group x86_64-manylinux_2_36 Python 3.11: n1, n2",
    ]
    text = (tmp_path / "fleet.lock.yml").read_text()
    report = (tmp_path / "fleet.lock.report.txt").read_text()
    assert report.startswith("plan diff against the previous lock file:") and "lab-sgl-kernel: newest" in report
    second = plan(tmp_path, hosts={"n1": "x86_64-manylinux_2_39", "n2": "x86_64-manylinux_2_36", "g": "aarch64-linux"})
    assert second["changed"] is False and second["diff_lines"] == ["no change against the previous lock file"]
    assert (tmp_path / "fleet.lock.yml").read_text() == text  # not even its date moved


def test_a_new_build_is_the_diff_and_the_apply_takes_it(index, tmp_path):
    plan(tmp_path)
    old = lf.read(str(tmp_path / "fleet.lock.yml"))["entries"][0]["venv_name"]
    index.update(kernel="0.3.22+cu130", content=wheel("0.3.22+cu130"))
    result = plan(tmp_path)
    assert result["changed"] is True
    assert result["diff_lines"][1].startswith("  ~ lab-sgl-kernel 0.3.21+cu130 (sha256 ")
    assert "-> 0.3.22+cu130 (sha256 " in result["diff_lines"][1] and len(result["diff_lines"]) == 2
    taken = apply(tmp_path)
    assert not taken.get("failed"), taken
    (entry,) = taken["entries"]
    assert entry["venv_name"] != old and entry["packages"][0]["version"] == "0.3.22+cu130"
    assert entry["path"] == str(tmp_path / "fleet.lock.yml") and entry["wheelhouse"] == str(tmp_path / "c/wheelhouse")
    assert entry["origin"] == f"from lock file {tmp_path / 'fleet.lock.yml'}"


def test_apply_refuses_another_profile_and_missing_or_changed_wheels_naming_them(index, tmp_path):
    plan(tmp_path)
    other = dict(PROFILE, python={"version": "3.12"})
    refused = apply(tmp_path, profile=other)
    assert refused["failed"] and "the profile changed since the plan" in refused["msg"]
    wheel = tmp_path / "c/wheelhouse/lab_sgl_kernel-0.3.21+cu130-py3-none-any.whl"
    wheel.write_bytes(b"republished")
    refused = apply(tmp_path)
    assert refused["failed"] and "no longer holds every wheel" in refused["msg"]
    assert "lab_sgl_kernel-0.3.21+cu130-py3-none-any.whl" in refused["msg"] and "No host was changed" in refused["msg"]
    wheel.unlink()
    assert "lab_sgl_kernel-0.3.21+cu130" in apply(tmp_path)["msg"]


def test_apply_of_a_file_that_is_not_there_names_it(tmp_path):
    result = apply(tmp_path)
    assert result["failed"] and "cannot be read" in result["msg"] and "fleet.lock.yml" in result["msg"]


def test_the_applied_entries_carry_each_wheel_installed_size_read_from_the_wheelhouse(index, tmp_path):
    index.update(content=wheel(payload="x" * 5000))
    plan(tmp_path)
    result = apply(tmp_path)
    assert not result.get("failed"), result.get("msg")
    package = result["entries"][0]["packages"][0]
    assert package["installed_size"] == 5000 + len("Name: lab-sgl-kernel\nVersion: 0.3.21+cu130\n") > package["size"]


# ---------------------------------------------------------------------------------------------------- issue 42


def put_in_place(source, dest):
    """cp -p over the wheel: other bytes, with the size and mtime the wheel had."""
    import os
    import shutil

    stat = os.stat(dest)
    shutil.copy2(source, dest)
    os.utime(dest, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def test_a_tampered_wheel_of_the_same_size_and_mtime_is_refused_and_the_right_one_put_back_is_taken(index, tmp_path):
    plan(tmp_path)
    assert not apply(tmp_path).get("failed")  # the wheelhouse's record now holds the wheel's hash
    held = tmp_path / "c/wheelhouse/lab_sgl_kernel-0.3.21+cu130-py3-none-any.whl"
    locked = hashlib.sha256(held.read_bytes()).hexdigest()
    (tmp_path / "kept.whl").write_bytes(held.read_bytes())
    forged = wheel(payload="y")
    assert len(forged) == held.stat().st_size
    (tmp_path / "forged.whl").write_bytes(forged)
    put_in_place(tmp_path / "forged.whl", held)
    refused = apply(tmp_path)
    assert refused.get("failed"), refused
    assert (
        f"lab_sgl_kernel-0.3.21+cu130-py3-none-any.whl (locked sha256 {locked}, the file there has"
        f" {hashlib.sha256(forged).hexdigest()})" in refused["msg"]
    ), refused["msg"]
    put_in_place(tmp_path / "kept.whl", held)
    taken = apply(tmp_path)
    assert not taken.get("failed"), taken["msg"]


def test_a_hand_edited_lock_file_is_refused_and_plan_yml_writes_it_anew(index, tmp_path):
    plan(tmp_path)
    path = tmp_path / "fleet.lock.yml"
    path.write_text(path.read_text().replace("version: 0.3.21+cu130", "version: 0.3.21.1+cu130"))
    refused = apply(tmp_path)
    assert refused["failed"] and "package lab-sgl-kernel: version 0.3.21.1+cu130, but its file" in refused["msg"]
    again = plan(tmp_path)
    assert not again.get("failed"), again["msg"]
    assert again["diff_lines"][0].startswith("the previous lock file is written anew: it does not agree with itself")
    assert not apply(tmp_path).get("failed")


def forged_lock(tmp_path, url):
    """A lock file sealed with a digest (as anyone with the collection can), naming ``url`` for its wheel."""
    doc = lf.read(str(tmp_path / "fleet.lock.yml"))
    doc["entries"][0]["packages"][0]["url"] = url
    lf.write(str(tmp_path / "fleet.lock.yml"), lf.dumps(lf.seal(doc)))


@pytest.mark.parametrize("url", ["file:///etc/shadow", "https://evil.example/lab_sgl_kernel.whl"])
def test_a_wheel_url_off_the_profile_s_indexes_is_refused_before_anything_is_fetched(index, tmp_path, monkeypatch, url):
    plan(tmp_path)
    (tmp_path / "c/wheelhouse/lab_sgl_kernel-0.3.21+cu130-py3-none-any.whl").unlink()
    forged_lock(tmp_path, url)
    fetched = []

    class Recorder:
        def __init__(self, **kwargs):
            pass

        def download(self, url, *args, **kwargs):
            fetched.append(url)
            raise AssertionError("fetched")

    monkeypatch.setattr(lock_action, "Fetcher", Recorder)
    monkeypatch.setattr(
        lock_action, "fetch_wheelhouse", lambda f, lock, wh: [f.download(e["url"]) for e in lock["packages"]]
    )
    for fetch in (False, True):
        refused = apply(tmp_path, fetch=fetch)
        assert refused.get("failed"), refused
        assert f"entry x86_64-manylinux_2_36 Python 3.11, package lab-sgl-kernel: {url}" in refused["msg"]
        assert "allowed: http(s) under http://127.0.0.1:1/" in refused["msg"]
    assert fetched == []
