# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""incident_bundle: writes the archive (or, in check mode, only says what it would hold)."""

from __future__ import annotations

import tarfile

import pytest
from ansible.module_utils import basic
from ansible.module_utils.testing import patch_module_args
from module_harness import Exit

from ansible_collections.gpufleet.upgrade.plugins.modules import incident_bundle


@pytest.fixture
def host(monkeypatch):
    answers = {"journalctl": (0, "sglang: up\n", ""), "systemctl": (0, "MainPID=0\nActiveState=failed\n", "")}
    monkeypatch.setattr(
        basic.AnsibleModule, "get_bin_path", lambda self, n, *a, **k: f"/x/{n}" if n in answers else None
    )
    monkeypatch.setattr(basic.AnsibleModule, "run_command", lambda self, argv, **k: answers[argv[0].rsplit("/", 1)[1]])


@pytest.mark.parametrize("check", [False, True])
def test_writes_the_archive_outside_check_mode(tmp_path, host, check):
    dest = tmp_path / "b.tar.gz"
    args = {
        "dest": str(dest),
        "run_id": "20261208T001203Z-1",
        "unit": "sglang.service",
        "_ansible_check_mode": check,
        "extra": {"run-record.json": {"outcome": "rolled back"}},
    }
    with patch_module_args(args), pytest.raises(Exit) as out:
        incident_bundle.main()
    result = out.value.args[0]
    assert "journal/sglang.service.log" in result["members"] and "run-record.json" in result["members"]
    assert dest.exists() is not check
    if not check:
        with tarfile.open(dest) as tar:
            assert "b/MANIFEST.json" in tar.getnames()
