# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""_lock_file imports without packaging (ansible-test's import check has none); the checks that need it refuse."""

from __future__ import annotations

import pytest

from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _lock_file as lf

PACKAGE = {"name": "six", "version": "1.17.0", "filename": "six-1.17.0-py2.py3-none-any.whl"}


def test_a_name_check_without_packaging_refuses_naming_the_library(monkeypatch):
    monkeypatch.setattr(lf, "HAS_PACKAGING", False)
    with pytest.raises(lf.LockFileError) as exc:
        lf.wheel_name_problem(PACKAGE)
    message = str(exc.value)
    assert "six-1.17.0-py2.py3-none-any.whl" in message
    assert "(packaging)" in message
    assert message.endswith("nothing was changed")


def test_a_metadata_check_without_packaging_refuses(monkeypatch, tmp_path):
    monkeypatch.setattr(lf, "HAS_PACKAGING", False)
    with pytest.raises(lf.LockFileError, match=r"METADATA in .*\(packaging\)"):
        lf.metadata_problems([], str(tmp_path))


def test_with_packaging_the_name_check_runs():
    assert lf.HAS_PACKAGING
    assert lf.wheel_name_problem(PACKAGE) is None
