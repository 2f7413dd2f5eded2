# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

import pytest

from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _lock

LOCK = """# serving-cu130: lock abc
Torch==2.9.1 --hash=sha256:aa
flashinfer_python==0.5.3 \\
    --hash=sha256:bb
pip==25.3
# tool: uv==0.9.0 --hash=sha256:cc
"""


def test_pins_are_pep503_sorted_and_skip_tooling_and_tools():
    assert _lock.pins(LOCK, skip=["PIP"]) == ["flashinfer-python==0.5.3", "torch==2.9.1"]


def test_pins_accept_the_lines_of_a_command():
    assert _lock.pins(["a_b==1", "c==2"]) == ["a-b==1", "c==2"]


def test_pins_refuse_a_url_install_naming_the_line_and_the_fix():
    with pytest.raises(_lock.LockError, match=r"installs lab from a URL.*fix: pin it as lab==VERSION"):
        _lock.pins("lab @ file:///tmp/lab-1.0-py3-none-any.whl\n")


def test_pins_refuse_an_editable_line_naming_the_fix():
    with pytest.raises(_lock.LockError, match=r"lock: venv lock line 1 .*fix: a lock holds one 'name==version'"):
        _lock.pins("-e /src/lab\n")


def test_pins_refuse_what_is_not_text():
    with pytest.raises(_lock.LockError, match=r"must be the text of a lock.*not dict"):
        _lock.pins({"torch": "2.9.1"})


def test_differences_name_each_package_and_agree_on_case_and_separators():
    freeze = ["torch==2.9.0", "Flashinfer-Python==0.5.3", "extra==1", "pip==24.0"]
    assert _lock.differences(LOCK, freeze, skip=["pip"]) == [
        "extra: expected absent, found 1",
        "torch: expected 2.9.1, found 2.9.0",
    ]
    assert _lock.differences(LOCK, ["torch==2.9.1", "flashinfer-python==0.5.3"], skip=["pip"]) == []


def test_requirements_text_matches_what_hosts_already_hold():
    entries = [
        {"name": "torch", "version": "2.9.1", "sha256": "aa"},
        {"name": "Flashinfer-python", "version": "0.5.3", "sha256": "bb"},
    ]
    text = _lock.requirements_text(entries, header="serving-cu130: lock abc")
    assert text == (
        "# serving-cu130: lock abc\nFlashinfer-python==0.5.3 --hash=sha256:bb\ntorch==2.9.1 --hash=sha256:aa\n"
    )
    tools = _lock.requirements_text([{"name": "uv", "version": "0.9.0", "sha256": "cc"}], comment_prefix="# tool: ")
    assert tools == "# tool: uv==0.9.0 --hash=sha256:cc\n"
    # What it writes, the parser reads back (tools stay comments).
    assert _lock.pins(text + tools) == ["flashinfer-python==0.5.3", "torch==2.9.1"]
    assert _lock.requirements_text([]) == ""


def test_requirements_text_refuses_an_entry_without_its_hash():
    with pytest.raises(_lock.LockError, match=r"lock entry 1 .* lacks sha256"):
        _lock.requirements_text([{"name": "torch", "version": "2.9.1"}])
    assert _lock.requirements_text([{"name": "torch", "version": "2.9.1"}], hashes=False) == "torch==2.9.1\n"


def test_package_lists_compare_the_venv_with_the_lock():
    lists = _lock.package_lists(["torch==2.8.0", "numpy==2.1.0"], [{"name": "Torch", "version": "2.9.1"}])
    assert lists == {"before": ["numpy==2.1.0", "torch==2.8.0"], "after": ["torch==2.9.1"]}
    assert _lock.package_lists(None, [])["before"] == []
    with pytest.raises(_lock.LockError, match="installed packages must be a list"):
        _lock.package_lists("torch==2.8.0", [])


def test_tooling_needed_names_only_the_tooling_a_package_requires_at_the_lock_s_version():
    freeze = "pip==23.0.1\nsetuptools==66.1.1\nsix==1.16.0\ntorch==2.9.1\n"
    check = (
        "Checked 3 packages in 1ms\nFound 2 incompatibilities\n"
        "The package `torch` requires `setuptools>=40`, but it's not installed\n"
        "The package `torch` requires `sympy`, but it's not installed\n"
    )
    assert _lock.tooling_needed(freeze, ["pip", "setuptools", "wheel"], check) == ["setuptools==66.1.1"]
    # A seeded pip nothing requires stays out; a clean check needs nothing.
    assert (
        _lock.tooling_needed(
            freeze, ["pip", "setuptools", "wheel"], "Checked 3 packages in 1ms\nAll installed packages are compatible\n"
        )
        == []
    )
    # Required but not pinned: the lock cannot say which version, so nothing is installed for it.
    assert _lock.tooling_needed("torch==2.9.1\n", ["setuptools"], check) == []
