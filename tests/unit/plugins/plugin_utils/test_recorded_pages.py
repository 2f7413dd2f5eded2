# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The planner on real index behaviour, offline: static pages recorded from their public repositories
(tests/data/index/pages, described in RECORDED.json ``pages``) served on loopback by lab/recorded_index.py
``RecordedPages``: sgl-kernel's cu130 page (file names republished with other hashes), flashinfer-jit-cache's cu130
page, and torch's page in PyTorch's index format (links without sha256, 403 for a project it does not carry)."""

from __future__ import annotations

import datetime as dt
import hashlib
import html
import json
import re
import shutil
import sys
from pathlib import Path

import pytest

from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _index as ix
from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _wheel_plan as wp
from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _wheels as w

REPO = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(REPO))

from lab.recorded_index import DATA, RecordedPages, lab_wheel, recorded_indexes, recorded_profile  # noqa: E402

PAGES = json.loads((DATA / "RECORDED.json").read_text())["pages"]
SGL = "sgl_kernel-0.3.21+cu130-cp310-abi3-manylinux2014_x86_64.whl"
TARGET = w.Target("3.11", "x86_64-manylinux_2_28")
ANCHOR = re.compile(r'<a href="([^"#]*)(?:#sha256=([0-9a-f]+))?"[^>]*>([^<]*)</a>')


def anchors(text):
    return [(html.unescape(name), sha) for _href, sha, name in ANCHOR.findall(text)]


def page_of(source):
    return (DATA / PAGES[source]["page"]).read_text()


# --- the recorded data -------------------------------------------------------------------------------------


def test_the_sgl_kernel_page_lists_one_wheel_five_times_each_newer_than_the_last():
    doc = PAGES["sgl-whl-cu130"]
    assert doc["repository"] == "sgl-project/whl" and doc["trimmed"] == "no"
    listed = [sha for name, sha in anchors(page_of("sgl-whl-cu130")) if name == SGL]
    assert len(listed) == 5 and len(set(listed)) == 5
    assert doc["republished"][SGL]["hashes"] == listed
    # The page has no dates; its history does: every republished name's entries appear in the order they were
    # published, so the last entry is the newest (the file the release host serves).
    for name, entry in doc["republished"].items():
        dates = [doc["first_listed"][sha]["date"] for sha in entry["hashes"]]
        assert dates == sorted(dates), name
    first = [doc["first_listed"][sha]["date"][:10] for sha in listed]
    assert first[0] == "2026-01-14" and first[-1] == "2026-02-21"


@pytest.mark.parametrize("source", sorted(PAGES))
def test_a_recorded_page_names_no_host(source):
    assert "://" not in page_of(source)
    assert len(anchors(page_of(source))) == PAGES[source]["anchors"]


def test_the_pytorch_format_page_has_no_hashes_and_its_index_answers_403():
    doc = PAGES["pytorch-nightly-cu130"]
    text = page_of("pytorch-nightly-cu130")
    found = anchors(text)
    assert len(found) == doc["anchors"] == doc["hashless_links"] and all(sha == "" for _n, sha in found)
    assert doc["missing_project_status"] == 403
    assert 'data-core-metadata="sha256=' in text and 'href="/whl/nightly/cu130/torch-2.11.0.dev' in text


# --- the lab server ------------------------------------------------------------------------------------------


def test_the_server_keeps_the_page_and_serves_the_last_entry_of_a_republished_name():
    with RecordedPages("sgl-whl-cu130") as idx:
        served = ix.Fetcher()._open(f"{idx.url}/sgl-kernel/").read().decode()
        recorded, rewritten = anchors(page_of("sgl-whl-cu130")), anchors(served)
        assert [n for n, _s in rewritten] == [n for n, _s in recorded]  # same entries, same order
        rows = idx.entries(SGL)
        assert [r["recorded"] for r in rows] == PAGES["sgl-whl-cu130"]["republished"][SGL]["hashes"]
        assert [s for n, s in rewritten if n == SGL] == [r["lab"] for r in rows]
        assert len({r["lab"] for r in rows}) == 5
        body = ix.Fetcher()._open(f"{idx.url.rsplit('/', 1)[0]}/any/path/{SGL}").read()
        assert hashlib.sha256(body).hexdigest() == rows[-1]["lab"] == idx.served_sha256(SGL)


def test_a_pytorch_format_index_answers_403_for_a_project_it_does_not_carry():
    with RecordedPages("pytorch-nightly-cu130") as idx:
        fetcher = ix.Fetcher()
        assert fetcher.listing("pytorch", idx.url, "sgl-kernel") == []
        assert fetcher.not_carried == {("pytorch", "sgl-kernel"): "HTTP 403"}
        torch = fetcher.listing("pytorch", idx.url, "torch")
        assert len(torch) == 15 and all(c.sha256 is None and c.metadata_url for c in torch)


def test_an_index_error_other_than_403_or_404_still_stops_the_plan():
    with RecordedPages("pytorch-nightly-cu130") as idx:
        idx.doc["missing_project_status"] = 500
        with pytest.raises(ix.IndexUnreachable, match="answered HTTP 500"):
            ix.Fetcher().listing("pytorch", idx.url, "numpy")


# --- listing: one candidate per file name --------------------------------------------------------------------


def test_a_republished_name_keeps_its_last_entry_with_every_hash_listed():
    with RecordedPages("sgl-whl-cu130") as idx:
        cands = ix.Fetcher().listing("sgl", idx.url, "sgl-kernel")
    assert len(cands) == len({c.filename for c in cands}) == len({n for n, _s in anchors(page_of("sgl-whl-cu130"))})
    cand = next(c for c in cands if c.filename == SGL)
    assert cand.sha256 == idx.entries(SGL)[-1]["lab"]
    assert cand.listed_hashes == tuple(r["lab"] for r in idx.entries(SGL))
    assert cand.summary()["republished"] == 5
    once = next(c for c in cands if c.filename.startswith("sgl_kernel-0.3.19+cu130-cp310-abi3-manylinux2014_x86"))
    assert once.listed_hashes == () and "republished" not in once.summary()


def test_a_page_that_lists_each_name_once_is_left_as_it_is():
    with RecordedPages("flashinfer-whl-cu130") as idx:
        cands = ix.Fetcher().listing("fi", idx.url, "flashinfer-jit-cache")
    assert len(cands) == 20 and not any(c.listed_hashes for c in cands)
    # The page is in string order (0.6.10 before 0.6.2): position says nothing across versions.
    releases = [c.version.public for c in cands]
    assert releases.index("0.6.10") < releases.index("0.6.2")


def _json_entry(sha, uploaded=None):
    return {"filename": SGL, "url": f"../../files/{SGL}", "hashes": {"sha256": sha}, "upload-time": uploaded}


def test_pep691_republished_entries_are_ordered_by_upload_time_when_all_have_one():
    doc = {
        "files": [
            _json_entry("a" * 64, "2026-02-21T10:19:19Z"),
            _json_entry("b" * 64, "2026-01-14T09:28:12Z"),
        ]
    }
    cands = ix.collapse_republished(w.parse_project_json(doc, "http://127.0.0.1:1/simple/sgl-kernel/", "x"))
    assert [c.sha256 for c in cands] == ["a" * 64] and cands[0].listed_hashes == ("a" * 64, "b" * 64)
    doc["files"][1]["upload-time"] = None  # an entry without a date: page order decides, the last is newest
    cands = ix.collapse_republished(w.parse_project_json(doc, "http://127.0.0.1:1/simple/sgl-kernel/", "x"))
    assert [c.sha256 for c in cands] == ["b" * 64]


# --- hashes settled by download ------------------------------------------------------------------------------


def _sgl_candidate(idx):
    return next(c for c in ix.Fetcher().listing("sgl", idx.url, "sgl-kernel") if c.filename == SGL)


def test_a_republished_wheel_locks_the_hash_the_served_file_has(tmp_path):
    with RecordedPages("sgl-whl-cu130") as idx:
        cand = _sgl_candidate(idx)
        # The host serves an earlier entry's body (a page whose newest entry is the stale one).
        idx.bodies[SGL] = lab_wheel(SGL, 2, 5, idx.entries(SGL)[1]["recorded"])
        notes = ix.settle_hashes(ix.Fetcher(), {"sgl-kernel": cand}, str(tmp_path), None)
    note = notes["sgl-kernel"]
    assert note["entry"] == 2 and cand.sha256 == note["sha256"] == idx.entries(SGL)[1]["lab"]
    assert ix.hash_note(note) == (
        f"{SGL} is republished on index 'sgl': listed 5 times with distinct sha256; planned the newest entry; the"
        f" file served matched entry 2 of 5, sha256 {cand.sha256} (locked, verified by the controller: downloaded"
        " once on the controller and hashed)"
    )
    assert hashlib.sha256((tmp_path / SGL).read_bytes()).hexdigest() == cand.sha256


def test_a_republished_wheel_matching_no_listed_hash_is_refused(tmp_path):
    with RecordedPages("sgl-whl-cu130") as idx:
        cand = _sgl_candidate(idx)
        idx.bodies[SGL] = b"PK-not-any-listed-body"
        with pytest.raises(ix.HashMismatch, match="lists the file name 5 times \\(republished\\)"):
            ix.settle_hashes(ix.Fetcher(), {"sgl-kernel": cand}, str(tmp_path), None)
    assert not (tmp_path / SGL).exists()


def test_a_hashless_link_is_downloaded_once_and_hashed_without_a_wheelhouse():
    with RecordedPages("pytorch-nightly-cu130") as idx:
        fetcher = ix.Fetcher()
        cands = fetcher.listing("pytorch", idx.url, "torch")
        cand = next(
            c for c in cands if c.filename == "torch-2.11.0.dev20260115+cu130-cp311-cp311-manylinux_2_28_x86_64.whl"
        )
        notes = ix.settle_hashes(fetcher, {"torch": cand}, None, None)
    assert cand.sha256 == notes["torch"]["sha256"] == idx.served_sha256(cand.filename)
    assert notes["torch"]["kind"] == "unhashed" and fetcher.downloads == [cand.url]
    assert "lists no sha256 for it; downloaded once on the controller and hashed" in ix.hash_note(notes["torch"])


# --- the whole plan: probe, resolve, settle hashes, uv, lock ------------------------------------------------


@pytest.fixture()
def recorded():
    with recorded_indexes() as servers:
        yield servers


@pytest.mark.skipif(shutil.which("uv", path=str(Path(sys.executable).parent)) is None, reason="needs uv")
def test_the_plan_locks_the_served_hashes_and_says_why(recorded, tmp_path):
    uv = wp.find_uv()
    fetcher = ix.Fetcher()
    lock = wp.make_lock(
        recorded_profile(recorded), TARGET, fetcher, uv, tools=(), today=dt.date(2026, 3, 1), wheelhouse=str(tmp_path)
    )
    by_name = {e["name"]: e for e in lock["packages"]}
    torch = "torch-2.11.0.dev20260115+cu130-cp311-cp311-manylinux_2_28_x86_64.whl"
    assert by_name["torch"]["filename"] == torch and by_name["sgl-kernel"]["filename"] == SGL
    for entry in lock["packages"]:
        server = recorded[entry["index"]]
        assert entry["sha256"] == server.served_sha256(entry["filename"]), entry["name"]
        assert hashlib.sha256((tmp_path / entry["filename"]).read_bytes()).hexdigest() == entry["sha256"]
    # Each wheel crossed once: the hash-less and republished ones while planning, into the wheelhouse.
    assert sorted(u.rsplit("/", 1)[-1].replace("%2B", "+") for u in fetcher.downloads) == sorted(
        e["filename"] for e in lock["packages"]
    )
    lines = wp.report_lines(lock)
    assert "  source pytorch: not carried by this index (HTTP 403 for the project)" in lines
    assert any(line.startswith(f"  {SGL} is republished on index 'sgl': listed 5 times") for line in lines)
    assert any(line.startswith(f"  {torch}: index 'pytorch' lists no sha256 for it; downloaded once") for line in lines)
    assert any(f"{SGL} (2026-02-21, republished: 5 hashes listed): chosen" in line for line in lines)

    # Without a wheelhouse (check mode) the same hashes are locked: the files are hashed in a scratch folder.
    again = wp.make_lock(recorded_profile(recorded), TARGET, ix.Fetcher(), uv, tools=(), today=dt.date(2026, 3, 1))
    assert again["hash"] == lock["hash"]


def test_a_package_no_index_carries_fails_naming_the_403(recorded):
    profile = recorded_profile(recorded)
    profile["wheels"]["packages"] = [{"name": "sgl-kernel", "spec": "==0.3.21", "indexes": ["pytorch"]}]
    rules_by_pkg, _rules = w.rules_from_profile(profile["wheels"])
    with pytest.raises(w.PlanError) as err:
        wp.probe(ix.Fetcher(), profile["wheels"], rules_by_pkg, TARGET)
    assert str(err.value).startswith(
        "package sgl-kernel: every index the profile names for it refused it: index 'pytorch'"
        f" ({recorded['pytorch'].url}) answered HTTP 403 for the project page of sgl-kernel."
    )
    assert "Fix: if 'pytorch' should serve sgl-kernel" in str(err.value)
