# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The planner on the real ecosystem, offline: the default index's pages as recorded (tests/data/index, by
scripts/record_index_data.py) served again on loopback by lab/recorded_index.py, as PEP 691 JSON or as a PEP 503
listing without dates."""

from __future__ import annotations

import copy
import datetime as dt
import json
import re
import sys
from pathlib import Path

import pytest
import yaml
from packaging.metadata import Metadata
from packaging.utils import parse_wheel_filename
from packaging.version import Version

from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _wheel_plan as wp
from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _wheels as w
from ansible_collections.gpufleet.upgrade.plugins.plugin_utils._index import Fetcher

REPO = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(REPO))

from lab.recorded_index import DATA, RecordedIndex  # noqa: E402

RECORDED = json.loads((DATA / "RECORDED.json").read_text())
TODAY = dt.date.fromisoformat(RECORDED["recorded_at"][:10])
TARGET = w.Target("3.12", "x86_64-manylinux_2_28")
FI_064 = "flashinfer_python-0.6.4-py3-none-any.whl"
SGLANG = "sglang-0.5.9-py3-none-any.whl"


def cu130_on_the_default_index(url):
    """stacks/cu130.yml's wheels section narrowed to its packages that the default index carries, that index
    being the recorded one (the other indexes of the profile cannot be reached from here)."""
    wheels = copy.deepcopy(yaml.safe_load((REPO / "stacks" / "cu130.yml").read_text())["wheels"])
    wheels["packages"] = [dict(p, indexes=["default"]) for p in wheels["packages"] if "default" in p["indexes"]]
    wheels["indexes"] = [{"name": "default", "url": url}]
    return wheels


def name_only_metadata(cand):
    """METADATA for wheels whose real one was not recorded (only the stack's own were): name and version."""
    return Metadata.from_email(
        f"Metadata-Version: 2.1\nName: {cand.project}\nVersion: {cand.version}\n", validate=False
    )


def plan(wheels, recorded_metadata=True):
    rules_by_pkg, rules = w.rules_from_profile(wheels)
    fetcher = Fetcher(timeout=10)
    cands = wp.probe(fetcher, wheels, rules_by_pkg, TARGET)
    metadata_of = fetcher.metadata if recorded_metadata else name_only_metadata
    chosen, report = w.resolve_plan(rules_by_pkg, cands, rules, TARGET, metadata_of, today=TODAY)
    return chosen, report, rules


@pytest.fixture(scope="module")
def default_index():
    with RecordedIndex(mode="json", projects=("flashinfer-python", "flashinfer-cubin", "sglang")) as idx:
        yield idx


def test_the_profile_names_the_packages_this_test_plans(default_index):
    names = [p["name"] for p in cu130_on_the_default_index(default_index.url)["packages"]]
    assert names == ["flashinfer-python", "flashinfer-cubin", "sglang"]


def test_cu130_does_not_plan_on_the_real_pins_without_its_overrides(default_index):
    wheels = cu130_on_the_default_index(default_index.url)
    del wheels["overrides"]
    with pytest.raises(w.PlanError) as err:
        plan(wheels)
    msg = str(err.value)
    assert msg.startswith("no build of sglang satisfies spec ==0.5.9 in indexes default")
    assert (
        f"default: {SGLANG} (2026-02-23): requires flashinfer_python==0.6.3, but no eligible flashinfer-python"
        " build satisfies it (eligible: 0.6.4)" in msg
    )


def test_cu130_plans_on_the_real_data_with_its_overrides_listed(default_index):
    chosen, report, rules = plan(cu130_on_the_default_index(default_index.url))
    assert {k: c.filename for k, c in chosen.items()} == {
        "flashinfer-python": FI_064,
        "flashinfer-cubin": "flashinfer_cubin-0.6.4-py3-none-any.whl",
        "sglang": SGLANG,
    }
    # The pins sglang 0.5.9's real METADATA declares, each replaced by one override of the profile.
    assert sorted(report["sglang"]["overridden_pins"]) == [
        "cuda-python==12.9",
        "flashinfer_cubin==0.6.3",
        "flashinfer_python==0.6.3",
        "torch==2.9.1",
        "torchaudio==2.9.1",
    ]
    records = {r["requirement"]: r for r in w.override_records(rules, report)}
    assert records["flashinfer-python==0.6.4"]["replaced"] == [{"by": SGLANG, "pin": "flashinfer_python==0.6.3"}]
    assert records["torch<2.12,>=2.11.0.dev0"]["replaced"] == [{"by": SGLANG, "pin": "torch==2.9.1"}]
    # torch 2.11 requires cuda-bindings 13: sglang 0.5.9's CUDA 12 pin of cuda-python is overridden, not resolved.
    assert [r["pin"] for r in records["cuda-python<14,>=13.0"]["replaced"]] == ["cuda-python==12.9"]
    lock = {
        "profile": "cu130",
        "python": TARGET.python_version,
        "platform": TARGET.platform,
        "venv_name": "cu130-test",
        "overrides": list(records.values()),
        "report": report,
        "packages": [],
    }
    lines = wp.report_lines(lock)
    assert (
        "override flashinfer-python==0.6.4: flashinfer 0.6.4 has the cu130 builds the stack runs; sglang 0.5.9 pins"
        f" 0.6.3; replaces flashinfer_python==0.6.3 (by {SGLANG})" in lines
    )
    assert any(
        line.startswith("  source default: 72 file(s), newest build 2026-11-11 (release 0.7.4): ok") for line in lines
    )
    # The default index dates every file (PEP 700 upload-time): not one HEAD request was needed.
    assert default_index.count("HEAD") == 0


def fitting_releases(project, above):
    """Releases of a recorded project newer than `above` with a wheel for the target, read from the data."""
    page = json.loads((DATA / f"{project}.json").read_text())
    supported = set(w.supported_tags(TARGET))
    out = set()
    for entry in page["files"]:
        if not entry["filename"].endswith(".whl"):
            continue
        _name, version, _build, tags = parse_wheel_filename(entry["filename"])
        if version.release > Version(above).release and tags & supported:
            out.add(version.release)
    return out


def test_an_undated_pep503_source_whose_builds_stop_far_behind_is_refused():
    """The upgrade's pivotal moment: a static cu130 index whose flashinfer builds had stopped (PEP 503, no dates,
    no Last-Modified) while the default index has newer ones. In the upgrade they stopped at 0.2.14; the default
    index has wheels from 0.5 on (0.2.x are sdists there), so here they stop at 0.5.3."""
    frozen = RecordedIndex(mode="html", last_modified=False, newest={"flashinfer-python": "0.5.3"})
    with frozen, RecordedIndex(mode="json") as full:
        wheels = {
            "indexes": [{"name": "cu130-static", "url": frozen.url}, {"name": "default", "url": full.url}],
            "packages": [{"name": "flashinfer-python", "spec": "==0.5.3", "indexes": ["cu130-static", "default"]}],
            "rules": {"stale_version_gap": 3},
        }
        chosen, report, _rules = plan(wheels, recorded_metadata=False)
        src = report["flashinfer-python"]["sources"]["cu130-static"]
        behind = len(fitting_releases("flashinfer-python", "0.5.3"))
        assert behind >= 3
        assert src["undatable"] is True and src["stale"] is True
        assert src["reason"] == (
            f"newest release 0.5.3 is {behind} releases behind index 'default' (0.7.4; stale_version_gap 3)"
        )
        # Both carry 0.5.3; the earlier index would win a tie, so the refusal is what moves the pick.
        assert chosen["flashinfer-python"].index == "default"
        assert "stale source(s) refused: cu130-static" in report["flashinfer-python"]["why"]
        # HEAD only for builds whose date is read: the spec's (==0.5.3) and the newest release's, here the same.
        heads = frozen.count("HEAD")
        listed = [c for c in report["flashinfer-python"]["candidates"] if c["index"] == "cu130-static"]
        assert len(listed) == src["count"] == 7
        assert heads == sum(1 for c in listed if c["version"] == "0.5.3") == 1

        # Without the version-gap rule the source cannot be judged at all: undatable, and allowed for a package
        # without a local tag (the old behaviour, now said aloud), refused when the profile says so.
        del wheels["rules"]["stale_version_gap"]
        chosen, report, _rules = plan(wheels, recorded_metadata=False)
        src = report["flashinfer-python"]["sources"]["cu130-static"]
        assert chosen["flashinfer-python"].index == "cu130-static" and src["undatable"] and not src["stale"]
        assert "undatable source cu130-static allowed (undatable: allow)" in report["flashinfer-python"]["why"]
        wheels["rules"]["undatable"] = "refuse"
        chosen, _report, _rules = plan(wheels, recorded_metadata=False)
        assert chosen["flashinfer-python"].index == "default"


def test_a_thousand_file_pep503_listing_costs_a_handful_of_head_requests():
    with RecordedIndex(mode="html", projects=("torch",)) as idx:
        wheels = {
            "indexes": [{"name": "torch-html", "url": idx.url}],
            "packages": [{"name": "torch", "spec": "==2.9.1", "indexes": ["torch-html"]}],
            "rules": {"max_age_days": 400},
        }
        chosen, report, _rules = plan(wheels, recorded_metadata=False)
        listed = report["torch"]["sources"]["torch-html"]["count"]
        assert chosen["torch"].filename == "torch-2.9.1-cp312-cp312-manylinux_2_28_x86_64.whl"
        assert chosen["torch"].date_source == "last-modified"
        assert RECORDED["files_per_project"]["torch"] == 987 and listed < 987  # fitting builds only
        assert 0 < idx.count("HEAD") <= 4, idx.count("HEAD")


def test_every_recorded_sha256_is_hex_and_no_registry_host_is_left():
    for path in sorted(DATA.glob("*.json")):
        text = path.read_text()
        assert not re.search(r"https?://", text), path
        if path.name == "RECORDED.json":
            continue
        for entry in json.loads(text)["files"]:
            assert re.fullmatch(r"[0-9a-f]{64}", entry["hashes"]["sha256"]), entry["filename"]
