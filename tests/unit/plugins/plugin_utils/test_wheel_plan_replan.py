# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Re-planning an unchanged profile asks the indexes only whether anything changed: the planner keeps project pages,
METADATA and HEAD answers with their validators under the controller's cache folder (_index.ValidatorCache) and asks
again with If-None-Match / If-Modified-Since. Real HTTP servers on loopback: the recorded static pages and the
recorded default index (lab/recorded_index.py) with validators in front (lab/validating.py), every request logged
with the conditional headers it carried."""

from __future__ import annotations

import datetime as dt
import json
import shutil
import sys
from pathlib import Path

import pytest

from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _index as ix
from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _wheel_plan as wp
from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _wheels as w

REPO = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(REPO))

from lab.mirrors import PrivateServer  # noqa: E402
from lab.recorded_index import RecordedIndex, RecordedPages, recorded_profile  # noqa: E402
from lab.tiny_wheel import tiny_wheel  # noqa: E402
from lab.validating import by_agent, validating  # noqa: E402

TARGET = w.Target("3.11", "x86_64-manylinux_2_28")
PLANNER = ix.USER_AGENT


@pytest.fixture
def pages():
    kind = validating(RecordedPages)
    with (
        kind("pytorch-nightly-cu130") as torch,
        kind("sgl-whl-cu130") as sgl,
        kind("flashinfer-whl-cu130") as fi,
    ):
        yield {"pytorch": torch, "sgl": sgl, "flashinfer": fi}


def _asked(servers) -> list:
    return [a for s in servers.values() for a in by_agent(s.asked, PLANNER)]


def _forget(servers):
    for server in servers.values():
        server.asked.clear()


def probe_and_resolve(profile, fetcher):
    rules_by_pkg, rules = w.rules_from_profile(profile["wheels"])
    cands = wp.probe(fetcher, profile["wheels"], rules_by_pkg, TARGET)
    metadata_of = wp._metadata_memo(fetcher)
    chosen, _report = w.resolve_plan(rules_by_pkg, cands, rules, TARGET, metadata_of, today=dt.date(2026, 3, 1))
    return {k: c.filename for k, c in chosen.items()}


def test_a_second_probe_asks_only_with_validators_and_reuses_every_page_on_304(pages, tmp_path):
    profile = recorded_profile(pages)
    first = ix.Fetcher(cache=ix.ValidatorCache(str(tmp_path)))
    chosen = probe_and_resolve(profile, first)
    first.cache.save()
    asked = _asked(pages)
    assert asked and not any(a["conditional"] for a in asked)
    kept = json.loads((tmp_path / "index" / ix.ValidatorCache.NAME).read_text())
    assert {k.split(" ", 1)[0] for k in kept} >= {"page", "metadata"}

    _forget(pages)
    again = ix.Fetcher(cache=ix.ValidatorCache(str(tmp_path)))
    assert probe_and_resolve(profile, again) == chosen
    asked = _asked(pages)
    # Every request of the re-plan that the first plan got an answer to carried the validators kept from it, and
    # every answer was 304. The 403s of the projects PyTorch's index does not carry came without a validator: they
    # are asked again as they were (the index may carry the project now).
    refused = [a for a in asked if a["status"] == 403]
    assert len(refused) == len(again.not_carried) == 2 and not any(a["conditional"] for a in refused)
    served = [a for a in asked if a["status"] != 403]
    assert len(served) == again.conditional == again.revalidated == again.requests - len(refused) > 0
    assert all(a["status"] == 304 and "If-None-Match" in a["conditional"] for a in served)
    assert again.bytes_in == 0


def test_a_page_that_changed_is_read_again_and_its_new_builds_planned(tmp_path):
    kind = validating(RecordedIndex)
    profile = {
        "indexes": [{"name": "default", "url": ""}],
        "packages": [{"name": "sglang", "spec": ">=0.5", "indexes": ["default"]}],
        "rules": {},
    }
    with kind(projects=("sglang",), newest={"sglang": "0.5.8"}) as idx:
        profile["indexes"][0]["url"] = idx.url
        rules_by_pkg, _rules = w.rules_from_profile(profile)
        cache = ix.ValidatorCache(str(tmp_path))
        before = wp.probe(ix.Fetcher(cache=cache), profile, rules_by_pkg, TARGET)
        cache.save()
        # The index publishes a newer release: the page's ETag changes, the kept page is not used.
        idx.pages["sglang"] = RecordedIndex(projects=("sglang",)).pages["sglang"]
        fetcher = ix.Fetcher(cache=ix.ValidatorCache(str(tmp_path)))
        after = wp.probe(fetcher, profile, rules_by_pkg, TARGET)
    assert max(c.version for c in before).public == "0.5.8"
    assert max(c.version for c in after) > max(c.version for c in before)
    assert fetcher.conditional == 1 and fetcher.revalidated == 0 and fetcher.bytes_in > 0


@pytest.mark.parametrize("damage", ["gone", "changed"])
def test_a_kept_page_whose_body_is_gone_or_changed_is_asked_for_without_validators(pages, tmp_path, damage):
    profile = recorded_profile(pages)
    cache = ix.ValidatorCache(str(tmp_path))
    chosen = probe_and_resolve(profile, ix.Fetcher(cache=cache))
    cache.save()
    for body in (tmp_path / "index").iterdir():
        if body.name != ix.ValidatorCache.NAME:
            if damage == "gone":
                body.unlink()
            else:  # same size, other bytes: a kept page is never trusted by its size
                body.write_bytes(bytes(len(body.read_bytes())))
    _forget(pages)
    again = ix.Fetcher(cache=ix.ValidatorCache(str(tmp_path)))
    assert probe_and_resolve(profile, again) == chosen
    pages_asked = [a for a in _asked(pages) if a["method"] == "GET" and not a["path"].endswith((".whl", ".metadata"))]
    assert pages_asked and not any(a["conditional"] for a in pages_asked)


@pytest.mark.skipif(shutil.which("uv", path=str(Path(sys.executable).parent)) is None, reason="needs uv")
def test_a_replan_with_the_controller_cache_makes_conditional_requests_only(pages, tmp_path):
    """make_lock with the controller's cache folder, twice, as playbooks/plan.yml runs it (check mode: no
    wheelhouse): the second plan's requests from the planner are all conditional and all answered 304, and it locks
    the same wheels."""
    profile = recorded_profile(pages)
    uv = wp.find_uv()
    cache_dir = str(tmp_path / "cache")
    first = ix.Fetcher()
    lock = wp.make_lock(profile, TARGET, first, uv, tools=(), today=dt.date(2026, 3, 1), cache_dir=cache_dir)
    # Within one plan too: the hash-less torch file is HEADed to date it and again to settle its hash (304).
    assert lock["index_requests"]["requests"] == first.requests > first.conditional
    # uv is given each chosen wheel with its sha256: it reads the METADATA by range and never downloads a wheel.
    uv_asked = [a for s in pages.values() for a in by_agent(s.asked, "uv/")]
    assert uv_asked and all(a["method"] == "HEAD" or a["range"] for a in uv_asked)
    _forget(pages)
    again = ix.Fetcher()
    relock = wp.make_lock(profile, TARGET, again, uv, tools=(), today=dt.date(2026, 3, 1), cache_dir=cache_dir)
    assert relock["hash"] == lock["hash"]
    asked = [a for a in _asked(pages) if a["status"] != 403]  # refusals carry no validator (see above)
    assert asked and all(a["conditional"] for a in asked) and all(a["status"] == 304 for a in asked)
    assert relock["index_requests"] == {
        "requests": len(asked) + len(again.not_carried),
        "conditional": len(asked),
        "not_modified": len(asked),
        # flashinfer's page lists the jit-cache wheel's sha256: its METADATA is taken by it, without a request.
        "metadata_by_sha256": 1,
    }
    # No wheel crossed: the hash-less torch link was settled from the record (one conditional HEAD), not downloaded.
    assert again.downloads == [] and again.bytes_in == 0
    # uv kept the METADATA it read (only the wheels it unpacked are removed after a plan): it asks nothing again.
    assert [a for s in pages.values() for a in by_agent(s.asked, "uv/")] == []


@pytest.mark.skipif(shutil.which("uv", path=str(Path(sys.executable).parent)) is None, reason="needs uv")
def test_a_replan_does_not_read_the_dependencies_metadata_again(tmp_path):
    """uv's cache under the controller folder keeps the METADATA uv read of each dependency (only the wheels it
    unpacked are removed after a plan): a re-plan asks the index for its pages, never for a dependency's wheel."""
    root = tmp_path / "index"
    root.mkdir()
    tiny_wheel(root, "serve-app", "1.0", ["app-dep-a", "app-dep-b>=2"])
    tiny_wheel(root, "app-dep-a", "1.0")
    tiny_wheel(root, "app-dep-b", "2.0")
    log = tmp_path / "access.jsonl"
    with PrivateServer("replan-deps", ["--kind", "pypi", "--root", str(root)], "/simple", log) as server:
        profile = {
            "name": "deps",
            "python": {"version": "3.11"},
            "cuda": {"version": "13.0"},
            "wheels": {
                "indexes": [{"name": "default", "url": server.url}],
                "packages": [{"name": "serve-app", "spec": "==1.0", "indexes": ["default"]}],
                "rules": {},
            },
        }
        cache_dir = str(tmp_path / "cache")
        plans = []
        for _round in range(2):
            start = len(log.read_text().splitlines())
            lock = wp.make_lock(profile, TARGET, ix.Fetcher(), wp.find_uv(), tools=(), cache_dir=cache_dir)
            plans.append([json.loads(line) for line in log.read_text().splitlines()[start:]])
    assert {e["name"] for e in lock["packages"]} == {"serve-app", "app-dep-a", "app-dep-b"}
    wheels_read = [[r for r in asked if r["path"].endswith(".whl") and "dep" in r["path"]] for asked in plans]
    assert wheels_read[0], "the first plan reads each dependency's METADATA from its wheel"
    assert wheels_read[1] == []
    assert not list((tmp_path / "cache" / "uv").glob("archive-v*"))


def test_metadata_of_a_wheel_listed_with_its_sha256_is_not_asked_for_again_where_the_index_gives_no_validators(
    tmp_path,
):
    """A mirror that serves no ETag or Last-Modified (as this machine's mirror of the default index does) cannot be
    asked conditionally: its pages are read again, but a wheel's METADATA is the same for as long as its sha256 is."""
    wheels = {
        "indexes": [{"name": "default", "url": ""}],
        "packages": [{"name": "sglang", "spec": "==0.5.9", "indexes": ["default"]}],
        "rules": {},
    }
    target = w.Target("3.12", "x86_64-manylinux_2_28")
    with RecordedIndex(projects=("sglang",)) as idx:
        wheels["indexes"][0]["url"] = idx.url
        rules_by_pkg, _rules = w.rules_from_profile(wheels)
        firsts = []
        for _round in range(2):
            fetcher = ix.Fetcher(cache=ix.ValidatorCache(str(tmp_path)))
            (sglang,) = [c for c in wp.probe(fetcher, wheels, rules_by_pkg, target) if c.filename in idx.metadata]
            firsts.append(fetcher.metadata(sglang).requires_dist)
            fetcher.cache.save()
        assert idx.count("GET", ".metadata") == 1 and idx.count("GET", "/sglang/") == 2
    assert firsts[0] == firsts[1] and fetcher.metadata_by_sha256 == 1 and fetcher.conditional == 0
