# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the wheel plan keeps on the controller between plans, offline on the recorded pages (lab/recorded_index.py):
the sha256 it computed for links without one (UrlHashRecord, keyed by URL and what the index serves the file with),
which hashes no index served (sha256_source), uv's cache under the controller folder pruned after the plan, and
each locked wheel's installed size read from the wheelhouse."""

from __future__ import annotations

import datetime as dt
import json
import shutil
import sys
import zipfile
from pathlib import Path

import pytest

from ansible_collections.gpufleet.upgrade.plugins.module_utils._hash_record import UrlHashRecord
from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _index as ix
from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _wheel_plan as wp
from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _wheels as w

REPO = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(REPO))

from lab.recorded_index import RecordedPages, recorded_indexes, recorded_profile  # noqa: E402
from lab.tiny_wheel import tiny_wheel  # noqa: E402

TORCH = "torch-2.11.0.dev20260115+cu130-cp311-cp311-manylinux_2_28_x86_64.whl"
TARGET = w.Target("3.11", "x86_64-manylinux_2_28")
HAS_UV = shutil.which("uv", path=str(Path(sys.executable).parent)) is not None


def _torch(fetcher, idx):
    return next(c for c in fetcher.listing("pytorch", idx.url, "torch") if c.filename == TORCH)


def _settle(idx, folder):
    fetcher = ix.Fetcher()
    cand = _torch(fetcher, idx)
    record = UrlHashRecord(str(folder))
    notes = ix.settle_hashes(fetcher, {"torch": cand}, None, None, record)
    record.save()
    return fetcher, cand, notes["torch"]


# --- hashes the controller computed ---------------------------------------------------------------------------


def test_a_hashless_link_is_hashed_once_and_not_downloaded_again_while_served_the_same(tmp_path):
    with RecordedPages("pytorch-nightly-cu130") as idx:
        first, cand, note = _settle(idx, tmp_path)
        assert first.downloads == [cand.url] and note["how"] == "downloaded"
        assert cand.sha256 == idx.served_sha256(TORCH) and cand.sha256_source == "controller"
        recorded = json.loads((tmp_path / UrlHashRecord.NAME).read_text())[cand.url]
        assert recorded["sha256"] == cand.sha256 and recorded["size"] == len(idx.bodies[TORCH])

        # A later plan (check mode too: no wheelhouse): one HEAD request, no download.
        again, cand2, note2 = _settle(idx, tmp_path)
        assert again.downloads == [] and note2["how"] == "recorded" and cand2.sha256 == cand.sha256
        assert idx.count("GET", TORCH) == 1
        assert "not downloaded: the controller hashed it before" in ix.hash_note(note2)
        assert ix.hash_note(note2).endswith(f"sha256 {cand.sha256} (locked, computed by the controller)")

        # The index now serves another file under the same URL: downloaded and hashed anew.
        idx.bodies[TORCH] = idx.bodies[TORCH] + b"\0"
        third, cand3, note3 = _settle(idx, tmp_path)
        assert third.downloads == [cand.url] and note3["how"] == "downloaded"
        assert cand3.sha256 == idx.served_sha256(TORCH) != cand.sha256


def test_a_plan_that_fills_the_wheelhouse_hashes_what_is_served_over_a_wrong_record(tmp_path):
    with RecordedPages("pytorch-nightly-cu130") as idx:
        fetcher = ix.Fetcher()
        cand = _torch(fetcher, idx)
        record = UrlHashRecord(str(tmp_path / "cache"))
        record.put(cand.url, fetcher.served_stamp(cand.url), "0" * 64)  # a record the served file contradicts
        wheelhouse = tmp_path / "wheelhouse"
        notes = ix.settle_hashes(fetcher, {"torch": cand}, str(wheelhouse), None, record)
        assert notes["torch"]["how"] == "downloaded" and cand.sha256 == idx.served_sha256(TORCH)
        assert record.get(cand.url, fetcher.served_stamp(cand.url)) == cand.sha256
        # Held by the wheelhouse with the recorded hash: neither downloaded nor read from the index again.
        again = ix.Fetcher()
        cand2 = _torch(again, idx)
        notes = ix.settle_hashes(again, {"torch": cand2}, str(wheelhouse), None, record)
        assert again.downloads == [] and notes["torch"]["how"] == "recorded" and cand2.sha256 == cand.sha256


def test_a_record_without_anything_the_index_serves_the_file_with_is_not_trusted(tmp_path):
    record = UrlHashRecord(str(tmp_path))
    record.put("http://127.0.0.1:1/a.whl", {"size": None, "etag": None, "last_modified": None}, "a" * 64)
    assert record.get("http://127.0.0.1:1/a.whl", {}) is None
    record.put("http://127.0.0.1:1/a.whl", {"size": 10, "etag": '"x"'}, "b" * 64)
    assert record.get("http://127.0.0.1:1/a.whl", {"size": 10, "etag": '"x"'}) == "b" * 64
    assert record.get("http://127.0.0.1:1/a.whl", {"size": 10, "etag": '"y"'}) is None


def test_a_dependency_whose_index_lists_no_sha256_is_marked_as_hashed_by_uv():
    with RecordedPages("pytorch-nightly-cu130") as idx, RecordedPages("sgl-whl-cu130") as sgl:
        fetcher = ix.Fetcher()
        torch = _torch(fetcher, idx)
        listed_sgl = fetcher.listing("sgl", sgl.url, "sgl-kernel")[0]
        entries = [
            {"name": "torch", "filename": TORCH, "url": torch.url, "sha256": "c" * 64, "sha256_source": "index"},
            {
                "name": "sgl-kernel",
                "filename": listed_sgl.filename,
                "url": listed_sgl.url,
                "sha256": listed_sgl.sha256,
                "sha256_source": "index",
            },
        ]
        wheels = {"indexes": [{"name": "pytorch", "url": idx.url}, {"name": "sgl", "url": sgl.url}]}
        wp.mark_uv_hashes(entries, fetcher, wheels)
    assert [e["sha256_source"] for e in entries] == ["uv", "index"]
    lines = wp.hash_source_lines(entries)
    assert lines == [f"sha256 computed by uv, not served by the index: {TORCH} ({'c' * 12})"]


# --- the whole plan: uv's cache and the marks -----------------------------------------------------------------


@pytest.mark.skipif(not HAS_UV, reason="needs uv beside the tests' Python")
def test_the_plan_keeps_uv_cache_under_the_controller_folder_pruned_and_says_its_size(tmp_path):
    cache = tmp_path / "cache"
    with recorded_indexes() as servers:
        lock = wp.make_lock(
            recorded_profile(servers),
            TARGET,
            ix.Fetcher(),
            wp.find_uv(),
            tools=(),
            today=dt.date(2026, 3, 1),
            cache_dir=str(cache),
        )
        by_name = {e["name"]: e for e in lock["packages"]}
        assert by_name["torch"]["sha256_source"] == "controller"
        assert by_name["sgl-kernel"]["sha256_source"] == "index"  # republished: listed, verified by download
        assert lock["uv_cache"]["path"] == str(cache / "uv") and lock["uv_cache"]["pruned"] == "pruned"
        assert lock["uv_cache"]["bytes"] == wp.folder_bytes(str(cache / "uv")) > 0
        # uv unpacked the chosen wheels to read and hash them; the prune removed them.
        assert not [p for p in (cache / "uv").glob("archive-v*/*") if p.is_dir()]
        lines = wp.report_lines(lock)
        assert f"uv cache {cache / 'uv'}: {lock['uv_cache']['bytes']} bytes after the plan (pruned)" in lines
        assert any(
            line.startswith(f"sha256 computed by the controller, not served by the index: {TORCH}") for line in lines
        )

        # Planned again (check mode: no wheelhouse): the torch link is not downloaded again.
        fetcher = ix.Fetcher()
        again = wp.make_lock(
            recorded_profile(servers),
            TARGET,
            fetcher,
            wp.find_uv(),
            tools=(),
            today=dt.date(2026, 3, 1),
            cache_dir=str(cache),
        )
        assert again["hash"] == lock["hash"]
        assert not [u for u in fetcher.downloads if "torch-" in u]


@pytest.mark.skipif(not HAS_UV, reason="needs uv beside the tests' Python")
def test_without_a_cache_folder_uv_cache_is_temporary_and_removed():
    with recorded_indexes() as servers:
        lock = wp.make_lock(
            recorded_profile(servers), TARGET, ix.Fetcher(), wp.find_uv(), tools=(), today=dt.date(2026, 3, 1)
        )
    assert lock["uv_cache"] == {"path": None, "bytes": 0, "pruned": "temporary, removed after the plan"}


# --- installed sizes ------------------------------------------------------------------------------------------


def _lock_of(path):
    return {
        "packages": [{"name": "six", "filename": path.name, "sha256": ix.file_sha256(str(path)), "url": path.as_uri()}],
        "tools": [{"name": "gone", "filename": "gone-1.0-py3-none-any.whl", "sha256": "0" * 64, "url": "x"}],
    }


def test_each_locked_wheel_gets_its_installed_size_when_the_wheelhouse_holds_it(tmp_path):
    wheel = tiny_wheel(tmp_path, "six", "1.0")
    with zipfile.ZipFile(wheel) as archive:
        expected = sum(i.file_size for i in archive.infolist())
    assert wp.installed_size(str(wheel)) == expected > wheel.stat().st_size - 1000
    lock = _lock_of(wheel)
    assert wp.verify_wheelhouse(lock, str(tmp_path)) == ["gone-1.0-py3-none-any.whl"]
    assert lock["packages"][0]["installed_size"] == expected
    assert "installed_size" not in lock["tools"][0]  # not at hand: absent, never a guess


def test_a_wheel_with_another_sha256_gets_no_installed_size(tmp_path):
    wheel = tiny_wheel(tmp_path, "six", "1.0")
    lock = _lock_of(wheel)
    lock["packages"][0]["sha256"] = "1" * 64
    lock["packages"][0]["installed_size"] = 5
    wp.verify_wheelhouse(lock, str(tmp_path))
    assert "installed_size" not in lock["packages"][0]
    assert wp.installed_size(str(tmp_path / "missing.whl")) is None
