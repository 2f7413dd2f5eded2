# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The time back to service in the fleet report: each edge, the figure before and the kernels compiled after the
warm-up, in report.json, Markdown, HTML, JUnit and the Prometheus textfile."""

from __future__ import annotations

from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _fleet_report as fr

WARMUP = {
    "warmup": {"passes": [{"compiled": ["sampling"]}, {"compiled": []}], "warm": True, "kernels": ["sampling"],
               "compiled_after_warmup": []},
    "return": {"edges": {"process_up": 1.5, "health": 29.0, "warm": 12.5, "total_s": 43.0},
               "before": {"total_s": 40.0, "recorded_at": "then", "edges": {"process_up": 2.0}}},
}  # fmt: skip
REPORT = {"outcome": "upgraded", "outcome_kind": "upgraded", "ok": True, "run_id": "r1", "profile": "cu130"}


def record():
    return fr.host_record("n1", REPORT, {"postcheck_result": {"warmup": WARMUP}})


def test_the_record_carries_each_edge_the_figure_before_and_the_ratio():
    ret = record()["return"]
    assert [(e["key"], e["s"]) for e in ret["edges"]] == [("process_up", 1.5), ("health", 29.0), ("warm", 12.5)]
    # the gate's figures: the server's part, from its process's start (41.5 s now, 38 s before)
    assert (ret["total_s"], ret["server_s"], ret["before_s"], ret["ratio"]) == (43.0, 41.5, 38.0, 1.09)
    assert ret["kernels_compiled"] == 1 and ret["compiled_after_warmup"] == [] and ret["passes"] == 2


def test_every_rendering_shows_it():
    doc = fr.fleet([record()], generated=0)
    md = fr.to_markdown(doc)
    assert "| 43 s (server 42 s, 1.09x of 38 s before) |" in md
    assert (
        "Back to service: stop -> process up 2 s, process up -> /health 29 s, /health -> warm 12 s; 1 kernel(s) "
        "compiled in 2 warm-up pass(es), none in the last." in md
    )
    assert "43 s (server 42 s, 1.09x of 38 s before)" in fr.to_html(doc)
    junit = fr.to_junit(doc)
    assert '<property name="return_to_service_s" value="43" />' in junit
    assert '<property name="kernels_compiled_after_warmup" value="0" />' in junit
    text = fr.textfile(record(), now=0)
    assert 'gpufleet_return_to_service_seconds{edge="warm"} 12.5' in text
    assert 'gpufleet_return_to_service_seconds{edge="before"} 38' in text
    assert "gpufleet_jit_kernels_compiled_after_warmup 0" in text


def test_a_host_without_a_warm_up_shows_none():
    plain = fr.host_record("n1", REPORT, {})
    assert plain["return"]["total_s"] is None and fr.return_text(plain["return"]) == "-"
    assert "gpufleet_return_to_service_seconds" not in fr.textfile(plain, now=0)
