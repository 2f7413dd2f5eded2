# Copyright: (c) 2026, gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The set-up's ansible-test bootstrap step works on a machine that never ran ansible-test (empty HOME)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
STEP = REPO / "scripts" / "ansible_test_bootstrap.py"

sys.path.insert(0, str(REPO / "scripts"))
import ansible_test_bootstrap as boot  # noqa: E402


def _env(home: Path) -> dict[str, str]:
    return {**os.environ, "HOME": str(home)}


def test_empty_home_gets_the_file_and_ansible_test_accepts_it(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    res = subprocess.run([sys.executable, str(STEP)], env=_env(home), capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stderr
    written = sorted((home / ".ansible/test/cache").glob("get_pip_*.py"))
    assert written, f"nothing written under {home}: {res.stdout}{res.stderr}"
    for path in written:
        assert path.read_bytes() == boot.STAND_IN.read_bytes()
    # ansible-test itself, with that HOME: it must bootstrap pip into a sanity venv from the cached stand-in.
    run = subprocess.run(
        ["bash", str(REPO / "tests/sanity/run.sh"), "--test", "pep8"],
        env=_env(home),
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    out = run.stdout + run.stderr
    assert "Download failed" not in out, out[-3000:]
    assert "does not have pip available" not in out, out[-3000:]
    assert run.returncode == 0, out[-3000:]


def test_a_hand_made_copy_is_replaced(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    paths = boot.install()
    paths[0].write_text("print('hand-made')\n")
    assert boot.main(["--check"]) == 1
    boot.install()
    assert paths[0].read_bytes() == boot.STAND_IN.read_bytes()
    assert boot.main(["--check"]) == 0


def test_pin_must_be_found(tmp_path):
    tooling = tmp_path / "tooling.txt"
    tooling.write_text("ansible-core>=2.17\n")
    with pytest.raises(boot.SetupError, match="not pinned with =="):
        boot.pinned_ansible_core(tooling)
    tooling.write_text("ansible==12.3.0\n")
    with pytest.raises(boot.SetupError, match="no ansible-core line"):
        boot.pinned_ansible_core(tooling)
    assert boot.pinned_ansible_core() == boot.installed_ansible_core()
