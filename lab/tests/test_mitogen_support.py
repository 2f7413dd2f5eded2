# Copyright: (c) 2026, gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""lab.mitogen.unsupported: the reason tests/integration/test_mitogen.py skips with, read from mitogen's own
package, never from a version range written here."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError

import pytest

from lab import mitogen


def test_a_missing_mitogen_is_named_with_where_it_is_pinned(monkeypatch):
    def absent(name):
        raise PackageNotFoundError(name)

    monkeypatch.setattr(mitogen, "version", absent)
    assert "mitogen is not installed" in mitogen.unsupported()
    assert "requirements/tooling.txt" in mitogen.unsupported()


def test_an_ansible_core_above_the_range_mitogen_declares_is_refused(monkeypatch):
    loaders = pytest.importorskip("ansible_mitogen.loaders")
    assert mitogen.unsupported() is None  # the pinned pair (requirements/tooling.txt) is supported
    monkeypatch.setattr(loaders, "ANSIBLE_VERSION_MAX", (2, 10), raising=False)
    assert "supports ansible-core up to (2, 10)" in mitogen.unsupported()


def test_the_strategy_is_mitogens_own_plugin():
    pytest.importorskip("ansible_mitogen")
    env = mitogen.strategy_env()
    assert env["ANSIBLE_STRATEGY"] == "mitogen_linear"
    plugin = f"{env['ANSIBLE_STRATEGY_PLUGINS']}/mitogen_linear.py"
    assert "ansible_mitogen" in plugin and open(plugin, encoding="utf-8").read()
