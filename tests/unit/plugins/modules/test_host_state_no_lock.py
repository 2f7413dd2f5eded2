# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""host_state venv.no_lock: a host that records no lock is drift in one line, whatever its venv holds."""

from __future__ import annotations

import os

from ansible_collections.gpufleet.upgrade.plugins.modules import host_state


def test_no_lock_is_one_drift_line_naming_current_and_the_reason(tmp_path):
    venv = tmp_path / "venvs" / "lab-cu128-seed"
    venv.mkdir(parents=True)
    os.symlink(venv, tmp_path / "current")
    spec = {
        "link": str(tmp_path / "current"),
        "expected_path": "",
        "packages": [],
        "no_lock": "the host records no lock",
    }
    (only,) = host_state.venv_items(spec)
    assert only["item"] == "serving venv link" and not only["ok"]
    assert only["drift"] == ["serving venv link: current is lab-cu128-seed; the host records no lock"]
    os.unlink(tmp_path / "current")
    (missing,) = host_state.venv_items(spec)
    assert missing["drift"] == [f"serving venv link: {tmp_path / 'current'} is missing; the host records no lock"]


def test_with_a_lock_the_venv_is_judged_as_before(tmp_path):
    os.symlink(tmp_path / "venvs" / "x", tmp_path / "current")
    spec = {"link": str(tmp_path / "current"), "expected_path": str(tmp_path / "venvs" / "x"), "packages": []}
    items = host_state.venv_items(spec)
    assert [i["item"] for i in items] == ["serving venv link", "serving venv"]
