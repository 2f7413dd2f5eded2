# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""plan.yml (action wheel_plan with lock_file) and the audit (action wheel_lock) over an index whose page links its
wheel files on another host, as SGLang's and FlashInfer's indexes link GitHub release assets: the lock is written and
audited when the profile declares where the index's files are (``wheels.indexes[].files``) or the operator allows
them (``gpufleet_lock_allowed_urls``), and refused at plan time otherwise, naming the index and the field."""

from __future__ import annotations

import copy

import pytest
from test_wheel_lock_file import PROFILE, fake_lock, make

from ansible_collections.gpufleet.upgrade.plugins.action import wheel_lock as lock_action
from ansible_collections.gpufleet.upgrade.plugins.action import wheel_plan as plan_action
from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _lock_file as lf

ASSETS = "http://127.0.0.1:2/org/whl/releases/download/"


@pytest.fixture
def page(monkeypatch):
    """A fake planner whose index page (lab-main, on 127.0.0.1:1) links the kernel on another origin."""

    def make_lock(profile, target, *args, **kwargs):
        lock = fake_lock(target)
        for entry in lock["packages"]:
            entry["url"] = f"{ASSETS}v0.3.21/{entry['filename']}"
            entry["index"] = "lab-main"
        return lock

    monkeypatch.setattr(plan_action, "make_lock", make_lock)
    monkeypatch.setattr(plan_action, "find_uv", lambda path: "/usr/bin/uv")
    monkeypatch.setattr(plan_action, "fetch_wheelhouse", lambda *args, **kwargs: {})


def declared(files):
    profile = copy.deepcopy(PROFILE)
    profile["wheels"]["indexes"][0]["files"] = files
    return profile


def plan(tmp_path, profile, task_vars=None):
    args = {
        "profile": profile,
        "controller_dir": str(tmp_path / "c"),
        "lock_file": str(tmp_path / "fleet.lock.yml"),
        "hosts": {"node1": "x86_64-manylinux_2_36"},
        "fetch": False,
    }
    return make(plan_action, "wheel_plan", args).run(task_vars={"inventory_hostname": "ctl", **(task_vars or {})})


def audit(tmp_path, profile, task_vars=None):
    args = {"path": str(tmp_path / "fleet.lock.yml"), "profile": profile, "controller_dir": str(tmp_path / "c")}
    action = make(lock_action, "wheel_lock", args, check_mode=True)
    return action.run(task_vars={"inventory_hostname": "node1", **(task_vars or {})})


def test_plan_refuses_a_page_linking_files_off_its_index_naming_the_index_and_the_field(page, tmp_path):
    refused = plan(tmp_path, PROFILE)
    assert refused.get("failed"), refused
    assert refused["msg"].startswith("ctl: the plan names wheel URLs off every place the profile's indexes link")
    url = f"{ASSETS}v0.3.21/lab_sgl_kernel-0.3.21+cu130-py3-none-any.whl"
    assert f"package lab-sgl-kernel: {url} (planned from index lab-main)" in refused["msg"]
    assert (
        f"add a prefix of {ASSETS}v0.3.21/ (its folder, or a shorter one) to wheels.indexes[lab-main].files"
        in (refused["msg"])
    )
    assert "No lock file was written" in refused["msg"] and not (tmp_path / "fleet.lock.yml").exists()


def test_a_profile_declaring_where_its_index_links_files_plans_and_audits_that_lock(page, tmp_path):
    profile = declared([ASSETS])
    written = plan(tmp_path, profile)
    assert not written.get("failed"), written
    assert lf.read(str(tmp_path / "fleet.lock.yml"))["entries"][0]["packages"][0]["url"].startswith(ASSETS)
    # The wheelhouse is empty (not fetched): the audit passes the URL check and stops at the missing wheel.
    audited = audit(tmp_path, profile)
    assert "names wheel URLs" not in audited.get("msg", ""), audited
    assert "no longer holds every wheel" in audited["msg"]
    # The same lock against a profile that does not declare it: refused at the audit, naming index and field.
    refused = audit(tmp_path, PROFILE)
    assert "(planned from index lab-main)" in refused["msg"] and "wheels.indexes[lab-main].files" in refused["msg"]
    assert "Nothing was fetched" in refused["msg"]


def test_the_operator_s_allowed_prefixes_count_at_plan_and_at_audit(page, tmp_path):
    allowed = {"gpufleet_lock_allowed_urls": [ASSETS]}
    assert not plan(tmp_path, PROFILE, allowed).get("failed")
    assert "names wheel URLs" not in audit(tmp_path, PROFILE, allowed).get("msg", "")
    assert "names wheel URLs" in audit(tmp_path, PROFILE).get("msg", "")
