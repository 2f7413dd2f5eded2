# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Plan resolution (plugins/plugin_utils/_wheels.py): pure functions over fake index listings."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
import yaml
from packaging.metadata import Metadata
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _wheels as w

TODAY = dt.date(2026, 3, 1)
TARGET = w.Target("3.11", "x86_64-manylinux_2_36")
REPO = Path(__file__).resolve().parents[4]


def cand(filename, index="main", days_old=10, sha="0" * 64, **kw):
    c = w.make_candidate(index, filename, f"http://127.0.0.1:1/{index}/{filename}", sha256=sha, **kw)
    assert c is not None, filename
    if days_old is not None and "upload_time" not in kw:
        c.upload_time = dt.datetime.combine(TODAY - dt.timedelta(days=days_old), dt.time(), dt.timezone.utc)
    return c


def rule(name, spec="", indexes=("main",), local_tag=None, allow_stale=None):
    return w.PackageRule(name, SpecifierSet(spec), list(indexes), local_tag, allow_stale)


class Meta:
    """metadata_of stand-in: METADATA agrees with the file name unless told otherwise; counts calls."""

    def __init__(self, requires=None, versions=None):
        self.requires = requires or {}
        self.versions = versions or {}
        self.calls = []

    def __call__(self, c):
        self.calls.append(c.filename)
        version = self.versions.get(c.filename, str(c.version))
        lines = ["Metadata-Version: 2.1", f"Name: {c.project}", f"Version: {version}"]
        lines += [f"Requires-Dist: {r}" for r in self.requires.get(c.filename, [])]
        return Metadata.from_email("\n".join(lines) + "\n", validate=False)


def plan(rules, cands, meta=None, **rules_kw):
    return w.resolve_plan(rules, cands, w.Rules(**rules_kw), TARGET, meta or Meta(), today=TODAY)


# --- listings -------------------------------------------------------------------------------------------


def test_make_candidate_skips_sdists_and_parses_wheels():
    assert w.make_candidate("i", "torch-2.11.0.tar.gz", "u") is None
    c = w.make_candidate("i", "Flashinfer_JIT_Cache-0.6.4+cu130-cp39-abi3-manylinux_2_28_x86_64.whl", "u")
    assert c.project == "flashinfer-jit-cache"
    assert c.version == Version("0.6.4+cu130") and c.version.local == "cu130"


def test_parse_project_json_reads_pep691_and_pep700_fields():
    doc = {
        "meta": {"api-version": "1.1"},
        "files": [
            {
                "filename": "six-1.17.0-py3-none-any.whl",
                "url": "../../packages/six-1.17.0-py3-none-any.whl",
                "hashes": {"sha256": "ab" * 32},
                "requires-python": ">=3.8",
                "upload-time": "2025-12-01T10:00:00.123456Z",
                "size": 1234,
                "core-metadata": {"sha256": "cd" * 32},
                "yanked": False,
            },
            {"filename": "six-1.17.0.tar.gz", "url": "six-1.17.0.tar.gz", "hashes": {}},
            {"filename": "six-1.16.0-py3-none-any.whl", "url": "x.whl", "hashes": {}, "yanked": "broken"},
        ],
    }
    out = w.parse_project_json(doc, "http://127.0.0.1:9/simple/six/", "main")
    assert [c.filename for c in out] == ["six-1.17.0-py3-none-any.whl", "six-1.16.0-py3-none-any.whl"]
    first = out[0]
    assert first.url == "http://127.0.0.1:9/packages/six-1.17.0-py3-none-any.whl"
    assert first.sha256 == "ab" * 32 and first.size == 1234 and first.requires_python == ">=3.8"
    assert first.metadata_url == first.url + ".metadata"
    assert first.date == dt.date(2025, 12, 1) and first.date_source == "upload-time"
    assert out[1].yanked and out[1].sha256 is None


def test_parse_project_html_reads_fragments_and_data_attributes():
    html = """<html><body>
    <a href="/packages/six-1.17.0-py3-none-any.whl#sha256=%s" data-requires-python="&gt;=3.12"
       data-dist-info-metadata="sha256=ff">six-1.17.0-py3-none-any.whl</a><br>
    <a href="six-1.16.0-py3-none-any.whl" data-yanked="">six-1.16.0-py3-none-any.whl</a>
    <a href="six-1.16.0.tar.gz">six-1.16.0.tar.gz</a>
    </body></html>""" % ("12" * 32)
    out = w.parse_project_html(html, "http://127.0.0.1:9/simple/six/", "stale")
    assert len(out) == 2
    assert out[0].url == "http://127.0.0.1:9/packages/six-1.17.0-py3-none-any.whl"
    assert out[0].sha256 == "12" * 32 and out[0].requires_python == ">=3.12" and out[0].metadata_url
    assert out[1].url == "http://127.0.0.1:9/simple/six/six-1.16.0-py3-none-any.whl"
    assert out[1].yanked and out[1].sha256 is None and out[1].metadata_url is None
    assert all(c.index == "stale" for c in out)


def test_parse_project_html_unquotes_local_versions():
    html = '<a href="/p/torch-2.11.0%2Bcu130-cp311-cp311-manylinux_2_28_x86_64.whl#sha256=aa">t</a>'
    (c,) = w.parse_project_html(html, "http://127.0.0.1:9/simple/torch/", "pt")
    assert c.version == Version("2.11.0+cu130")


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        ("2.11.0.dev20260115+cu130", dt.date(2026, 1, 15)),
        ("2.11.0.dev0", None),
        ("2.11.0.dev20261399", None),
        ("2.11.0", None),
    ],
)
def test_dev_date(version, expected):
    assert w.dev_date(Version(version)) == expected


def test_date_prefers_upload_time_then_dev_then_last_modified():
    c = cand("torch-2.11.0.dev20260115+cu130-cp311-cp311-manylinux_2_28_x86_64.whl", days_old=None)
    assert c.date == dt.date(2026, 1, 15) and c.date_source == "dev-version"
    c.upload_time = dt.datetime(2026, 1, 16, tzinfo=dt.timezone.utc)
    assert c.date == dt.date(2026, 1, 16)
    plain = cand("six-1.17.0-py3-none-any.whl", days_old=None)
    assert plain.date is None
    plain.last_modified = dt.datetime(2025, 5, 5, tzinfo=dt.timezone.utc)
    assert plain.date == dt.date(2025, 5, 5) and plain.date_source == "last-modified"


# --- compatibility --------------------------------------------------------------------------------------


def test_platform_tags_cover_manylinux_aliases_down_to_linux():
    tags = w.platform_tags("x86_64-manylinux_2_36")
    assert tags[0] == "manylinux_2_36_x86_64"
    assert "manylinux2014_x86_64" in tags and "manylinux_2_17_x86_64" in tags
    assert tags[-1] == "linux_x86_64"
    assert "manylinux_2_39_x86_64" not in tags


def test_platform_tags_reject_unknown_platform():
    with pytest.raises(w.PlanError, match="ARCH-manylinux_2_MINOR"):
        w.platform_tags("win_amd64")


@pytest.mark.parametrize(
    ("filename", "rule_kw", "fragment"),
    [
        ("torch-2.12.0+cu130-cp311-cp311-manylinux_2_28_x86_64.whl", {"spec": "<2.12"}, "does not satisfy <2.12"),
        ("torch-2.11.0+cu128-cp311-cp311-manylinux_2_28_x86_64.whl", {"local_tag": "cu130"}, "'cu128' is not"),
        ("torch-2.11.0-cp311-cp311-manylinux_2_28_x86_64.whl", {"local_tag": "cu130"}, "'(none)' is not"),
        ("torch-2.11.0+cu130-cp312-cp312-manylinux_2_28_x86_64.whl", {}, "do not fit Python 3.11"),
        ("torch-2.11.0+cu130-cp311-cp311-manylinux_2_39_x86_64.whl", {}, "do not fit"),
        ("torch-2.11.0+cu130-cp311-cp311-manylinux_2_28_aarch64.whl", {}, "do not fit"),
        ("torch-2.11.0+cu130-cp311-cp311-win_amd64.whl", {}, "do not fit"),
    ],
)
def test_reject_reason(filename, rule_kw, fragment):
    supported = w.supported_tags(TARGET)
    reason = w.reject_reason(cand(filename), rule("torch", **rule_kw), supported, TARGET)
    assert reason is not None and fragment in reason


def test_reject_reason_accepts_abi3_and_py3_and_requires_python():
    supported = w.supported_tags(TARGET)
    ok = [
        cand("sgl_kernel-0.3.21+cu130-cp310-abi3-manylinux2014_x86_64.whl"),
        cand("six-1.17.0-py2.py3-none-any.whl", requires_python=">=3.8"),
        cand("uv-0.13.8-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"),
    ]
    for c in ok:
        assert w.reject_reason(c, rule(c.project), supported, TARGET) is None, c.filename
    too_new = cand("six-1.17.0-py3-none-any.whl", requires_python=">=3.12")
    assert "requires Python >=3.12" in w.reject_reason(too_new, rule("six"), supported, TARGET)
    yanked = cand("six-1.17.0-py3-none-any.whl", yanked=True)
    assert w.reject_reason(yanked, rule("six"), supported, TARGET) == "yanked by the index"


def test_spec_with_dev_release_admits_nightlies_plain_spec_does_not():
    supported = w.supported_tags(TARGET)
    nightly = cand("torch-2.11.0.dev20260115+cu130-cp311-cp311-manylinux_2_28_x86_64.whl")
    assert w.reject_reason(nightly, rule("torch", ">=2.11.0.dev0,<2.12"), supported, TARGET) is None
    assert w.reject_reason(nightly, rule("torch", ">=2.10,<2.12"), supported, TARGET) is not None


# --- picking --------------------------------------------------------------------------------------------


def test_newest_build_across_indexes_wins():
    cands = [
        cand("torch-2.11.0+cu130-cp311-cp311-manylinux_2_28_x86_64.whl", index="a"),
        cand("torch-2.11.1+cu130-cp311-cp311-manylinux_2_28_x86_64.whl", index="b"),
        cand("torch-2.12.0+cu130-cp311-cp311-manylinux_2_28_x86_64.whl", index="a"),
    ]
    chosen, report = plan([rule("torch", "<2.12", indexes=("a", "b"), local_tag="cu130")], cands)
    assert chosen["torch"].filename.startswith("torch-2.11.1") and chosen["torch"].index == "b"
    statuses = {c["filename"]: c["status"] for c in report["torch"]["candidates"]}
    assert statuses["torch-2.12.0+cu130-cp311-cp311-manylinux_2_28_x86_64.whl"].startswith("rejected: version")
    assert statuses["torch-2.11.0+cu130-cp311-cp311-manylinux_2_28_x86_64.whl"] == "eligible, not chosen"


def test_same_version_in_two_indexes_prefers_the_first_listed():
    cands = [cand("six-1.17.0-py3-none-any.whl", index="b"), cand("six-1.17.0-py3-none-any.whl", index="a")]
    chosen, _rejected = plan([rule("six", indexes=("a", "b"))], cands)
    assert chosen["six"].index == "a"
    chosen, _rejected = plan([rule("six", indexes=("b", "a"))], cands)
    assert chosen["six"].index == "b"


def test_best_tag_wins_between_files_of_one_version():
    cands = [
        cand("uv-0.13.8-py3-none-linux_x86_64.whl"),
        cand("uv-0.13.8-py3-none-manylinux_2_28_x86_64.whl"),
    ]
    chosen, _rejected = plan([rule("uv")], cands)
    assert "manylinux_2_28" in chosen["uv"].filename


def test_candidates_of_unlisted_indexes_and_other_projects_are_ignored():
    cands = [cand("six-1.17.0-py3-none-any.whl", index="other"), cand("idna-3.10-py3-none-any.whl")]
    with pytest.raises(w.PlanError, match="no wheel of this package was listed"):
        plan([rule("six")], cands)


# --- stale sources --------------------------------------------------------------------------------------

FI_STALE = "flashinfer_python-0.2.14-py3-none-any.whl"
FI_NEW = "flashinfer_python-0.6.4-py3-none-any.whl"


def test_stale_source_is_flagged_and_refused():
    cands = [cand(FI_STALE, index="nightly", days_old=110), cand(FI_NEW, index="own", days_old=20)]
    chosen, report = plan([rule("flashinfer-python", ">=0.2", indexes=("nightly", "own"))], cands, stale_gap_days=60)
    assert chosen["flashinfer-python"].filename == FI_NEW
    rep = report["flashinfer-python"]
    assert rep["stale_sources"] == ["nightly"]
    assert "90 days behind index 'own'" in rep["sources"]["nightly"]["reason"]
    assert "stale source(s) refused: nightly" in rep["why"]


def test_stale_source_by_max_age_alone():
    cands = [cand(FI_NEW, index="own", days_old=300)]
    with pytest.raises(w.PlanError) as err:
        plan([rule("flashinfer-python", indexes=("own",))], cands, max_age_days=240)
    assert "300 days old (max_age_days 240)" in str(err.value)
    assert "refused sources: own" in str(err.value)


def test_stale_only_source_fails_with_candidates_and_advice():
    cands = [cand(FI_STALE, index="nightly", days_old=110), cand(FI_NEW, index="own", days_old=20)]
    with pytest.raises(w.PlanError) as err:
        plan([rule("flashinfer-python", "==0.2.14", indexes=("nightly", "own"))], cands, stale_gap_days=60)
    msg = str(err.value)
    assert "no build of flashinfer-python satisfies spec ==0.2.14" in msg
    assert f"nightly: {FI_STALE}" in msg and "stale source 'nightly'" in msg
    assert f"own: {FI_NEW}" in msg and "does not satisfy ==0.2.14" in msg
    assert "allow_stale" in msg


def test_allow_stale_per_package_overrides_rules():
    cands = [cand(FI_STALE, index="nightly", days_old=110), cand(FI_NEW, index="own", days_old=20)]
    r = rule("flashinfer-python", "==0.2.14", indexes=("nightly", "own"), allow_stale=True)
    chosen, report = plan([r], cands, stale_gap_days=60)
    assert chosen["flashinfer-python"].index == "nightly"
    assert report["flashinfer-python"]["stale_sources"] == ["nightly"]
    with pytest.raises(w.PlanError):
        plan(
            [rule("flashinfer-python", "==0.2.14", indexes=("nightly", "own"), allow_stale=False)],
            cands,
            stale_gap_days=60,
            allow_stale=True,
        )


def test_staleness_only_counts_builds_for_the_target_cuda_tag():
    # A source with fresh cu128 builds but only an old cu130 one is stale for a cu130 plan.
    cands = [
        cand("jit-0.2.14+cu130-py3-none-any.whl", index="nightly", days_old=200),
        cand("jit-0.6.5+cu128-py3-none-any.whl", index="nightly", days_old=1),
        cand("jit-0.6.4+cu130-py3-none-any.whl", index="own", days_old=20),
    ]
    chosen, report = plan([rule("jit", indexes=("nightly", "own"), local_tag="cu130")], cands, stale_gap_days=60)
    assert chosen["jit"].index == "own"
    assert report["jit"]["sources"]["nightly"]["stale"] is True


def test_undated_source_without_a_version_gap_is_undatable_and_allowed_without_a_local_tag():
    cands = [cand(FI_STALE, index="nightly", days_old=None), cand(FI_NEW, index="own", days_old=20)]
    sources = w.judge_sources(
        rule("flashinfer-python", indexes=("nightly", "own")),
        {"nightly": cands[:1], "own": cands[1:]},
        w.Rules(stale_gap_days=60, max_age_days=240),
        TODAY,
    )
    assert sources["nightly"]["undatable"] is True and sources["nightly"]["stale"] is False
    assert sources["nightly"]["undatable_policy"] == "allow"
    assert "none of its 1 fitting build(s) has an upload time" in sources["nightly"]["reason"]
    assert sources["own"] == {
        "newest": (TODAY - dt.timedelta(days=20)).isoformat(),
        "newest_release": "0.6.4",
        "count": 1,
        "stale": False,
        "undatable": False,
    }


def test_undated_source_far_behind_another_is_stale_by_version_gap():
    cands = [cand(FI_STALE, index="nightly", days_old=None)] + [
        cand(f"flashinfer_python-{v}-py3-none-any.whl", index="own", days_old=20)
        for v in ("0.3.0", "0.4.0", "0.5.0", "0.6.4")
    ]
    chosen, report = plan([rule("flashinfer-python", indexes=("nightly", "own"))], cands, stale_version_gap=3)
    src = report["flashinfer-python"]["sources"]["nightly"]
    assert src["stale"] is True and src["undatable"] is True
    assert src["reason"] == "newest release 0.2.14 is 4 releases behind index 'own' (0.6.4; stale_version_gap 3)"
    assert chosen["flashinfer-python"].filename == "flashinfer_python-0.6.4-py3-none-any.whl"
    assert "stale source(s) refused: nightly" in report["flashinfer-python"]["why"]
    # One release behind is within a gap of 3: the undated source stays, judged undatable (and allowed).
    close = [cand(FI_STALE, index="nightly", days_old=None), cand("flashinfer_python-0.3.0-py3-none-any.whl", "own")]
    _chosen, report = plan([rule("flashinfer-python", indexes=("nightly", "own"))], close, stale_version_gap=3)
    assert report["flashinfer-python"]["sources"]["nightly"]["stale"] is False


def test_undatable_source_is_refused_by_default_for_local_tag_packages_and_when_told():
    jit = "jit-0.6.4+cu130-py3-none-any.whl"
    with pytest.raises(w.PlanError) as err:
        plan([rule("jit", indexes=("cu130",), local_tag="cu130")], [cand(jit, index="cu130", days_old=None)])
    msg = str(err.value)
    assert f"cu130: {jit} (undated): undatable source 'cu130'" in msg
    assert "(undatable: refuse); to accept it set undatable: allow on package jit" in msg
    allowed = w.PackageRule("jit", SpecifierSet(), ["cu130"], "cu130", undatable="allow")
    chosen, report = plan([allowed], [cand(jit, index="cu130", days_old=None)])
    assert chosen["jit"].filename == jit and "undatable source cu130 allowed (undatable: allow)" in report["jit"]["why"]
    with pytest.raises(w.PlanError, match="undatable source 'main'"):
        plan([rule("flashinfer-python")], [cand(FI_NEW, days_old=None)], undatable="refuse")


def test_a_dev_date_dates_a_source_that_has_no_upload_times():
    nightly = cand("torch-2.12.0.dev20260220+cu130-cp311-cp311-manylinux_2_28_x86_64.whl", "nightly", days_old=None)
    chosen, report = plan([rule("torch", indexes=("nightly",), local_tag="cu130")], [nightly], max_age_days=30)
    src = report["torch"]["sources"]["nightly"]
    assert src["newest"] == "2026-02-20" and src["undatable"] is False and chosen["torch"] is nightly


def test_dating_needed_is_only_the_builds_that_pass_the_filters_and_the_newest_release():
    listed = [cand(f"torch-2.{m}.0+cu130-cp311-cp311-manylinux_2_28_x86_64.whl", "cu130", None) for m in range(1, 12)]
    listed += [cand("torch-2.11.0+cu128-cp311-cp311-manylinux_2_28_x86_64.whl", "cu130", None)]
    listed += [cand("torch-2.11.0+cu130-cp310-cp310-manylinux_2_28_x86_64.whl", "cu130", None)]
    listed += [cand("torch-2.10.0+cu130-cp311-cp311-manylinux_2_28_x86_64.whl", "cu130", days_old=3)]
    need = w.dating_needed([rule("torch", ">=2.9,<2.11", ("cu130",), "cu130")], listed, TARGET)
    assert sorted(c.filename for c in need) == [
        "torch-2.10.0+cu130-cp311-cp311-manylinux_2_28_x86_64.whl",
        "torch-2.11.0+cu130-cp311-cp311-manylinux_2_28_x86_64.whl",
        "torch-2.9.0+cu130-cp311-cp311-manylinux_2_28_x86_64.whl",
    ]


# --- cross-package rules --------------------------------------------------------------------------------

TRIO = ["flashinfer-python", "flashinfer-cubin", "flashinfer-jit-cache"]


def trio_rules():
    return [rule("flashinfer-python"), rule("flashinfer-cubin"), rule("flashinfer-jit-cache", local_tag="cu130")]


def test_same_version_group_takes_newest_common_version():
    cands = [
        cand("flashinfer_python-0.6.5-py3-none-any.whl"),
        cand("flashinfer_python-0.6.4-py3-none-any.whl"),
        cand("flashinfer_cubin-0.6.4-py3-none-any.whl"),
        cand("flashinfer_cubin-0.6.5-py3-none-any.whl"),
        cand("flashinfer_jit_cache-0.6.4+cu130-cp39-abi3-manylinux_2_28_x86_64.whl"),
    ]
    chosen, _rejected = plan(trio_rules(), cands, same_version=[TRIO])
    assert {str(c.version) for c in chosen.values()} == {"0.6.4", "0.6.4+cu130"}


def test_mismatched_trio_fails_naming_each_member_versions():
    cands = [
        cand("flashinfer_python-0.6.4-py3-none-any.whl"),
        cand("flashinfer_cubin-0.6.4-py3-none-any.whl"),
        cand("flashinfer_jit_cache-0.2.14+cu130-cp39-abi3-manylinux_2_28_x86_64.whl"),
    ]
    with pytest.raises(w.PlanError) as err:
        plan(trio_rules(), cands, same_version=[TRIO])
    msg = str(err.value)
    assert "same-version group [flashinfer-python, flashinfer-cubin, flashinfer-jit-cache]" in msg
    assert "flashinfer-jit-cache: 0.2.14" in msg and "flashinfer-python: 0.6.4" in msg


def test_without_the_group_rule_the_trio_may_differ():
    cands = [
        cand("flashinfer_python-0.6.4-py3-none-any.whl"),
        cand("flashinfer_cubin-0.6.4-py3-none-any.whl"),
        cand("flashinfer_jit_cache-0.2.14+cu130-cp39-abi3-manylinux_2_28_x86_64.whl"),
    ]
    chosen, _rejected = plan(trio_rules(), cands)
    assert str(chosen["flashinfer-jit-cache"].version) == "0.2.14+cu130"


TORCH_11 = "torch-2.11.0+cu130-cp311-cp311-manylinux_2_28_x86_64.whl"
TORCH_12 = "torch-2.12.0+cu130-cp311-cp311-manylinux_2_28_x86_64.whl"
KERNEL_21 = "sgl_kernel-0.3.21+cu130-cp310-abi3-manylinux2014_x86_64.whl"
KERNEL_22 = "sgl_kernel-0.3.22+cu130-cp310-abi3-manylinux2014_x86_64.whl"


def test_kernel_exact_torch_pin_is_honoured():
    cands = [cand(TORCH_11), cand(TORCH_12), cand(KERNEL_21)]
    meta = Meta(requires={KERNEL_21: ["torch==2.11.0", "numpy"]})
    rules = [rule("torch", ">=2.11", local_tag="cu130"), rule("sgl-kernel", local_tag="cu130")]
    chosen, report = plan(rules, cands, meta)
    assert chosen["torch"].filename == TORCH_11
    assert f"pinned by {KERNEL_21} (torch==2.11.0)" in report["torch"]["why"]
    assert report["torch"]["candidates"][0]["status"].startswith("eligible")  # 2.12 seen, not chosen


def test_kernel_whose_pin_no_torch_meets_falls_back_to_older_kernel():
    cands = [cand(TORCH_11), cand(KERNEL_21), cand(KERNEL_22)]
    meta = Meta(requires={KERNEL_22: ["torch==2.13.0"], KERNEL_21: ["torch==2.11.0"]})
    rules = [rule("torch", local_tag="cu130"), rule("sgl-kernel", local_tag="cu130")]
    chosen, report = plan(rules, cands, meta)
    assert chosen["sgl-kernel"].filename == KERNEL_21
    statuses = {c["filename"]: c["status"] for c in report["sgl-kernel"]["candidates"]}
    assert (
        "requires torch==2.13.0, but no eligible torch build satisfies it (eligible: 2.11.0+cu130)"
        in statuses[KERNEL_22]
    )


def test_kernel_pin_unsatisfiable_everywhere_fails():
    cands = [cand(TORCH_12), cand(KERNEL_21)]
    meta = Meta(requires={KERNEL_21: ["torch==2.11.0"]})
    with pytest.raises(w.PlanError, match=r"requires torch==2\.11\.0"):
        plan([rule("torch"), rule("sgl-kernel")], cands, meta)


def test_pins_behind_markers_that_do_not_apply_are_ignored():
    cands = [cand(TORCH_11), cand(TORCH_12), cand(KERNEL_21)]
    meta = Meta(requires={KERNEL_21: ['torch==2.11.0; python_version < "3.10"', 'torch; extra == "dev"']})
    chosen, _rejected = plan([rule("torch"), rule("sgl-kernel")], cands, meta)
    assert chosen["torch"].filename == TORCH_12


def test_metadata_version_disagreeing_with_file_name_is_rejected():
    # sgl-kernel's cu130 wheels once carried METADATA without +cu130: pip discarded them.
    cands = [cand(KERNEL_21), cand(KERNEL_22)]
    meta = Meta(versions={KERNEL_22: "0.3.22"})
    chosen, report = plan([rule("sgl-kernel", local_tag="cu130")], cands, meta)
    assert chosen["sgl-kernel"].filename == KERNEL_21
    statuses = {c["filename"]: c["status"] for c in report["sgl-kernel"]["candidates"]}
    assert statuses[KERNEL_22] == "rejected: METADATA version 0.3.22 disagrees with the file name's 0.3.22+cu130"


def test_metadata_mismatch_on_the_only_build_fails():
    meta = Meta(versions={KERNEL_21: "0.3.21"})
    with pytest.raises(w.PlanError, match=r"METADATA version 0\.3\.21 disagrees"):
        plan([rule("sgl-kernel", local_tag="cu130")], [cand(KERNEL_21)], meta)


def test_metadata_is_read_only_for_chosen_wheels():
    cands = [cand(TORCH_11), cand(TORCH_12)]
    meta = Meta()
    plan([rule("torch")], cands, meta)
    assert meta.calls == [TORCH_12]


def test_python_version_with_no_wheels_names_the_tags():
    cands = [cand(TORCH_11)]
    with pytest.raises(w.PlanError) as err:
        w.resolve_plan([rule("torch")], cands, w.Rules(), w.Target("3.13", "x86_64-manylinux_2_36"), Meta(), TODAY)
    assert "cp311-cp311-manylinux_2_28_x86_64 do not fit Python 3.13" in str(err.value)


def test_no_build_satisfies_spec_lists_every_candidate_and_reason():
    cands = [cand(TORCH_11, index="a"), cand(TORCH_12.replace("cu130", "cu128"), index="b")]
    with pytest.raises(w.PlanError) as err:
        plan([rule("torch", "==2.12.0", indexes=("a", "b"), local_tag="cu130")], cands)
    msg = str(err.value)
    assert "no build of torch satisfies spec ==2.12.0, local tag cu130 in indexes a, b" in msg
    assert f"a: {TORCH_11}" in msg and "version 2.11.0+cu130 does not satisfy ==2.12.0" in msg
    assert "b: torch-2.12.0+cu128" in msg and "'cu128' is not the required 'cu130'" in msg


# --- profile, lock --------------------------------------------------------------------------------------


def test_rules_from_lab_profile():
    profile = yaml.safe_load((REPO / "stacks" / "lab.yml").read_text())
    rules_by_pkg, rules = w.rules_from_profile(profile["wheels"])
    names = [r.name for r in rules_by_pkg]
    assert names[0] == "lab-torch" and rules_by_pkg[0].local_tag == "cu130"
    assert rules.same_version == [["lab-flashinfer-python", "lab-flashinfer-cubin", "lab-flashinfer-jit-cache"]]
    assert rules.stale_gap_days == 60 and rules.allow_stale is False


def test_rules_from_profile_rejects_bad_spec():
    wheels = {"packages": [{"name": "torch", "spec": "=>2", "indexes": ["a"]}], "rules": {}}
    with pytest.raises(w.PlanError, match="spec '=>2' is not a version specifier"):
        w.rules_from_profile(wheels)


def entry(name, version, sha):
    return {"name": name, "version": version, "filename": f"{name}-{version}-py3-none-any.whl", "sha256": sha}


def test_lock_hash_ignores_order_and_follows_content():
    a = [entry("six", "1.17.0", "1" * 64), entry("idna", "3.10", "2" * 64)]
    assert w.lock_hash(a, TARGET) == w.lock_hash(list(reversed(a)), TARGET)
    assert w.lock_hash(a, TARGET) != w.lock_hash([a[0], entry("idna", "3.10", "3" * 64)], TARGET)
    assert w.lock_hash(a, TARGET) != w.lock_hash(a, w.Target("3.12"))


def test_pick_file_takes_best_fitting_wheel():
    wheels = [
        {"url": "http://i/p/x-1.0-cp312-cp312-manylinux_2_28_x86_64.whl", "sha256": "a"},
        {"url": "http://i/p/x-1.0-cp311-cp311-linux_x86_64.whl", "sha256": "b"},
        {"url": "http://i/p/x-1.0-cp311-cp311-manylinux_2_28_x86_64.whl", "sha256": "c"},
        {"url": "http://i/p/x-1.0.tar.gz", "sha256": "d"},
    ]
    assert w.pick_file(wheels, TARGET)["sha256"] == "c"
    assert w.pick_file(wheels[3:], TARGET) is None


def test_unreadable_metadata_rejects_the_wheel():
    broken = Metadata.from_email("Metadata-Version: 2.1\nName: six\nVersion: not a version\n", validate=False)
    problem = w.metadata_problem(cand("six-1.17.0-py3-none-any.whl"), broken)
    assert problem is not None and problem.startswith("METADATA is unreadable")


# --- overrides (uv --override) --------------------------------------------------------------------------

SGLANG = "sglang-0.5.9-py3-none-any.whl"
SGLANG_PINS = {SGLANG: ["flashinfer_python==0.6.3", "torch==2.9.1", "torchaudio==2.9.1; sys_platform == 'linux'"]}


def fi_and_sglang():
    return [cand(FI_NEW), cand("flashinfer_python-0.6.3-py3-none-any.whl"), cand(SGLANG)]


def overrides(*pairs):
    return w.overrides_from_profile([{"requirement": r, "reason": why} for r, why in pairs])


def test_a_pin_the_profile_contradicts_fails_without_an_override():
    rules = [rule("flashinfer-python", "==0.6.4"), rule("sglang", "==0.5.9")]
    with pytest.raises(w.PlanError) as err:
        plan(rules, fi_and_sglang(), Meta(SGLANG_PINS))
    assert (
        f"main: {SGLANG} (2026-02-19): requires flashinfer_python==0.6.3, but no eligible flashinfer-python build"
        " satisfies it (eligible: 0.6.4)" in str(err.value)
    )


def test_an_override_replaces_the_pins_and_the_report_lists_them():
    rules = [rule("flashinfer-python", "==0.6.4"), rule("sglang", "==0.5.9")]
    over = overrides(("flashinfer-python==0.6.4", "the stack runs 0.6.4"), ("torch>=2.11,<2.12", "cu130 build"))
    chosen, report = w.resolve_plan(rules, fi_and_sglang(), w.Rules(overrides=over), TARGET, Meta(SGLANG_PINS), TODAY)
    assert chosen["flashinfer-python"].filename == FI_NEW
    assert report["sglang"]["overridden_pins"] == ["flashinfer_python==0.6.3", "torch==2.9.1"]
    assert report["flashinfer-python"]["overridden_pins"] == []
    assert "pinned by the profile's override (flashinfer-python==0.6.4)" in report["flashinfer-python"]["why"]
    records = w.override_records(w.Rules(overrides=over), report)
    assert records == [
        {
            "requirement": "flashinfer-python==0.6.4",
            "reason": "the stack runs 0.6.4",
            "replaced": [{"by": SGLANG, "pin": "flashinfer_python==0.6.3"}],
        },
        {
            "requirement": "torch<2.12,>=2.11",
            "reason": "cu130 build",
            "replaced": [{"by": SGLANG, "pin": "torch==2.9.1"}],
        },
    ]


def test_an_override_binds_the_profile_package_too():
    rules = [rule("flashinfer-python", ">=0.6"), rule("sglang", "==0.5.9")]
    over = overrides(("flashinfer-python<0.6.4", "hold back"))
    chosen, _report = w.resolve_plan(rules, fi_and_sglang(), w.Rules(overrides=over), TARGET, Meta(SGLANG_PINS), TODAY)
    assert str(chosen["flashinfer-python"].version) == "0.6.3"
    with pytest.raises(w.PlanError, match=r"excluded by the profile's override's requirement flashinfer-python<0.6"):
        w.resolve_plan(
            [rule("flashinfer-python", "==0.6.4")],
            [cand(FI_NEW)],
            w.Rules(overrides=overrides(("flashinfer-python<0.6", "x"))),
            TARGET,
            Meta(),
            TODAY,
        )


def test_an_override_whose_marker_does_not_apply_replaces_nothing():
    rules = [rule("flashinfer-python", "==0.6.4"), rule("sglang", "==0.5.9")]
    over = overrides(("flashinfer-python==0.6.4; sys_platform == 'win32'", "windows only"))
    with pytest.raises(w.PlanError, match=r"requires flashinfer_python==0\.6\.3"):
        w.resolve_plan(rules, fi_and_sglang(), w.Rules(overrides=over), TARGET, Meta(SGLANG_PINS), TODAY)


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        (
            [{"requirement": "torch>=>2", "reason": "r"}],
            r"wheels.overrides\[0\]: requirement 'torch>=>2' is not a PEP 508",
        ),
        ([{"requirement": "torch==2.11", "reason": " "}], r"wheels.overrides\[0\] \(torch==2.11\): no reason given"),
        (
            [{"requirement": "torch==2.11", "reason": "a"}, {"requirement": "Torch<3", "reason": "b"}],
            r"wheels.overrides\[1\]: a second override for torch \('Torch<3' after 'torch==2.11'\)",
        ),
        ([{"requirement": "torch @ file:///x.whl", "reason": "r"}], "has a URL or extras"),
    ],
)
def test_bad_overrides_name_the_entry_and_the_fix(entries, message):
    with pytest.raises(w.PlanError, match=message):
        w.overrides_from_profile(entries)


# --- bad inputs ------------------------------------------------------------------------------------------


def test_upper_case_sha256_in_json_and_html_listings_is_read_as_lower_case():
    doc = {"files": [{"filename": FI_NEW, "url": FI_NEW, "hashes": {"sha256": "AB" * 32}}]}
    assert w.parse_project_json(doc, "http://127.0.0.1:1/simple/x/", "i")[0].sha256 == "ab" * 32
    html = f'<a href="{FI_NEW}#sha256={"CD" * 32}">{FI_NEW}</a>'
    assert w.parse_project_html(html, "http://127.0.0.1:1/simple/x/", "i")[0].sha256 == "cd" * 32


def test_rebuilds_of_one_version_are_ordered_by_build_number_not_upload_date():
    older_build_newer_upload = cand("sgl_kernel-0.3.21-1-cp39-abi3-manylinux_2_28_x86_64.whl", days_old=1)
    newer_build = cand("sgl_kernel-0.3.21-2-cp39-abi3-manylinux_2_28_x86_64.whl", days_old=30)
    plain = cand("sgl_kernel-0.3.21-cp39-abi3-manylinux_2_28_x86_64.whl", days_old=0)
    chosen, _report = plan([rule("sgl-kernel", "==0.3.21")], [older_build_newer_upload, plain, newer_build])
    assert chosen["sgl-kernel"] is newer_build and newer_build.build == (2, "")


def test_why_says_when_the_pick_came_from_a_stale_source_that_was_allowed():
    cands = [cand(FI_STALE, index="nightly", days_old=110), cand(FI_NEW, index="own", days_old=20)]
    r = rule("flashinfer-python", "==0.2.14", indexes=("nightly", "own"), allow_stale=True)
    _chosen, report = plan([r], cands, stale_gap_days=60)
    why = report["flashinfer-python"]["why"]
    assert "stale source nightly allowed (allow_stale)" in why and "refused" not in why


def test_no_build_message_stays_short_for_a_long_listing():
    listed = [
        cand(f"torch-2.{m}.{p}+cu128-cp311-cp311-manylinux_2_28_x86_64.whl") for m in range(20) for p in range(50)
    ]
    listed += [cand("torch-2.11.0+cu130-cp39-cp39-manylinux_2_28_x86_64.whl")]
    with pytest.raises(w.PlanError) as err:
        plan([rule("torch", ">=2.11,<2.12", local_tag="cu130")], listed)
    msg = str(err.value)
    assert len(msg) < 2500, len(msg)
    parts = msg.split(" | ")
    # The closest misses come first: the cu130 build for another Python, then the cu128 builds of 2.11.
    assert parts[1].startswith("main: torch-2.11.0+cu130-cp39-cp39") and "do not fit Python 3.11" in parts[1]
    assert parts[2].startswith("main: torch-2.11.49+cu128") and "local tag 'cu128'" in parts[2]
    assert len(parts) == 1 + w.NO_BUILD_LISTED + 2
    assert parts[-2] == "993 more candidate(s): 950 version outside the spec, 43 another local tag"
    assert parts[-1].startswith("fix: no index of torch has a build for Python 3.11")
