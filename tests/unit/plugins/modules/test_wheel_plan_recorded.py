# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""wheel_plan's action plugin planning for real, with uv, on the static pages recorded from real indexes
(lab/recorded_index.py RecordedPages on loopback): a republished sgl-kernel wheel, torch links without a sha256,
and PyTorch's index answering 403 for the kernels."""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path

import pytest
from test_wheel_plan import make_action

REPO = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(REPO))

from lab.recorded_index import recorded_indexes, recorded_profile  # noqa: E402

SGL = "sgl_kernel-0.3.21+cu130-cp310-abi3-manylinux2014_x86_64.whl"

pytestmark = pytest.mark.skipif(
    shutil.which("uv", path=str(Path(sys.executable).parent)) is None, reason="needs uv beside the tests' Python"
)


def test_check_mode_and_apply_lock_the_same_served_hashes(tmp_path):
    with recorded_indexes() as servers:
        args = {
            "profile": recorded_profile(servers),
            "controller_dir": str(tmp_path),
            "tools": [],
            "today": "2026-03-01",
        }
        checked = make_action(dict(args), check_mode=True).run(task_vars={"inventory_hostname": "ctl"})
        assert not checked.get("failed"), checked.get("msg")
        # The hash-less and republished files were hashed in a scratch folder: no lock, no wheelhouse; only the
        # controller's cache (uv's, the index answers kept with their validators, and the hash computed for the
        # link without one).
        assert [p.name for p in tmp_path.iterdir()] == ["cache"]
        assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["index", "url-sha256.json", "uv"]
        applied = make_action(dict(args)).run(task_vars={"inventory_hostname": "ctl"})
        assert not applied.get("failed"), applied.get("msg")
        lock = json.loads(Path(applied["lock_path"]).read_text())
        assert lock["hash"] == checked["lock"]["hash"]
        for entry in lock["packages"]:
            served = servers[entry["index"]].served_sha256(entry["filename"])
            wheel = tmp_path / "wheelhouse" / entry["filename"]
            assert entry["sha256"] == served == hashlib.sha256(wheel.read_bytes()).hexdigest(), entry["name"]
        # Each wheel crossed once in the run that fetched: hashed while planning, then reused by the fetch.
        assert len(applied["fetch"]["fetched"]) == len(lock["packages"]) == 3 and applied["fetch"]["reused"] == []
        report = Path(applied["lock_path"]).with_suffix(".txt").read_text()
        assert f"  {SGL} is republished on index 'sgl': listed 5 times with distinct sha256;" in report
        assert "  source pytorch: not carried by this index (HTTP 403 for the project)" in report
        # The apply fetches the file for the hosts and hashes what is served (never a record it cannot check).
        checked_report = "\n".join(checked["report"])
        assert "index 'pytorch' lists no sha256 for it; downloaded once on the controller and hashed" in checked_report
        assert "index 'pytorch' lists no sha256 for it; downloaded once on the controller and hashed" in report
        torch = next(e for e in lock["packages"] if e["name"] == "torch")
        assert torch["sha256_source"] == "controller" and torch["installed_size"] > 0
        assert "sha256 computed by the controller, not served by the index: " + torch["filename"] in report

        # Check mode again: torch is neither downloaded to hash it nor by uv (it reads the wheelhouse's copy).
        torch_gets = servers["pytorch"].count("GET", torch["filename"])
        again = make_action(dict(args), check_mode=True).run(task_vars={"inventory_hostname": "ctl"})
        assert not again.get("failed"), again.get("msg")
        assert again["lock"]["hash"] == lock["hash"] and again["changed"] is False
        assert servers["pytorch"].count("GET", torch["filename"]) == torch_gets
        assert "not downloaded: the controller hashed it before" in "\n".join(again["report"])
