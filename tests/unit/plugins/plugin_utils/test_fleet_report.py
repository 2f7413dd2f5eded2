# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fleet report from a realistic run: the per-host reports are built by the same filters the playbooks call
(plugin_utils/_outcome.py), the role facts have the shapes the roles publish, the timeline the callback's events.
junit.xml is validated against the JUnit XML schemas CI dashboards read, the textfile by prometheus_client's parser
of the text format; the HTML is parsed for its table and chart (tests/unit/plugins/callback opens it in Chromium)."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _fleet_report as fr
from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _outcome as o

DATA = Path(__file__).resolve().parents[3] / "data" / "junit"
RUN = "20260301T120000Z-421337"
T0 = 1_772_366_400.0  # 2026-03-01T12:00:00Z

PREFLIGHT = {
    "lock": "ok: lock taken",
    "state": "ok: no interrupted run",
    "python": "ok: /usr/bin/python3 3.11",
    "gpu": "ok: 8 x NVIDIA RTX PRO 6000 Blackwell, driver 590.48.01 (CUDA 13.1)",
    "disk": "ok: / 412 GiB bytes free; needs 40 GiB",
    "mirrors": "ok: 3 answered",
    "drained": "not required",
}


def postcheck(after_tok_s, bench_failed=""):
    gates = {
        "gpu_health": {"status": "passed", "reasons": [], "notes": []},
        "smoke": {"status": "passed", "reasons": [], "wall_s": 15.77},
        "bench": {"status": "failed" if bench_failed else "passed", "reasons": [bench_failed] if bench_failed else []},
    }
    return {
        "passed": not bench_failed,
        "failures": [bench_failed] if bench_failed else [],
        "gates": gates,
        "bench": {"passed": not bench_failed, "bench": {"output_tok_s": after_tok_s, "accept_length": 3.1}},
    }


def upgraded_host(host):
    facts = {
        "preflight_report": PREFLIGHT,
        "postcheck_baseline": {"output_tok_s": 54.1},
        "postcheck_result": postcheck(96.1),
        "assess_result": {
            "in_sync": False,
            "on_profile": False,
            "drifted": ["toolkit", "serving venv link"],
            "drift": ["toolkit at /usr/local/cuda-13.0 is absent", "serving venv link: current is lab-cu128-seed"],
        },
    }
    phases = {}
    for phase in ("preflight", "assess", "backup", "cuda_toolkit", "venv_rebuild", "postcheck"):
        phases.update(
            o.phase_note(
                phase,
                {
                    **facts,
                    "backup_id": f"B-{host}",
                    "cuda_toolkit_home": "/usr/local/cuda-13.0",
                    "venv_rebuild_path": "/opt/gpufleet/serving/venvs/cu130-0123456789ab",
                },
            )
        )
    report = o.host_report(o.run_outcome(facts["assess_result"], "cu130"), host, RUN, "cu130", f"B-{host}", phases)
    t = T0
    timeline = []
    for name, took in (
        ("preflight", 4),
        ("assess", 9),
        ("backup", 31),
        ("cuda_toolkit", 120),
        ("venv_rebuild", 240),
        ("postcheck", 60),
    ):
        timeline += [(t, "phase_start", name), (t + took, "phase_end", name)]
        if name == "venv_rebuild":  # the switch restarts the unit, the health wait answers 18 s later
            timeline += [(t + took - 20, "down", "restart"), (t + took - 2, "up", "health")]
        t += took
    timeline.append((t + 1, "report", ""))
    return report, facts, timeline


def rolled_back_host(host):
    reason = (
        f"Fail with the post-check's problems: {host}: post-check failed (1 problem(s)): "
        "bench: 41.0 tok/s is 24 % below 54.1"
    )
    facts = {
        "preflight_report": PREFLIGHT,
        "postcheck_baseline": {"output_tok_s": 54.1},
        "postcheck_result": postcheck(41.0, "bench: 41.0 tok/s is 24 % below the baseline 54.1 (max 5 %)"),
    }
    phases = o.phase_note("preflight", facts)
    phases.update({"postcheck": f"failed: {reason}", "rollback": f"rolled back to backup B-{host}"})
    report = o.host_report(o.outcome("rolled_back", f"postcheck: {reason}"), host, RUN, "cu130", f"B-{host}", phases)
    timeline = [
        (T0, "phase_start", "preflight"),
        (T0 + 5, "phase_end", "preflight"),
        (T0 + 5, "phase_start", "postcheck"),
        (T0 + 65, "failed", "Fail with the post-check's problems"),
        (T0 + 70, "down", "restart"),
        (T0 + 88, "up", "health"),
        (T0 + 90, "report", ""),
    ]
    return report, facts, timeline


def refused_host(host):
    reason = f"Check the free disk space: {host}: / has 1.00 GiB free, needs 40 GiB; free space, then re-run"
    report = o.host_report(
        o.outcome("failed_preflight", reason), host, RUN, "cu130", phases={"preflight": f"failed: {reason}"}
    )
    return (
        report,
        {"preflight_report": {"lock": "ok: lock taken"}},
        [(T0, "phase_start", "preflight"), (T0 + 3, "failed", "disk"), (T0 + 4, "report", "")],
    )


def not_started_host(host):
    report = o.host_report(
        o.outcome("not_started", "the rollout stopped after 1 failed host(s) (n2)"), host, RUN, "cu130"
    )
    return report, {}, [(T0 + 100, "report", "")]


@pytest.fixture
def doc():
    hosts = {
        "n1": upgraded_host("n1"),
        "n2": rolled_back_host("n2"),
        "n3": refused_host("n3"),
        "n4": not_started_host("n4"),
        "n5": upgraded_host("n5"),
    }
    records = [fr.host_record(h, *parts) for h, parts in hosts.items()]
    records.append(fr.host_record("n6", None, {}, []))  # unreachable before it reported
    return fr.fleet(records, generated=T0 + 600)


def by_host(doc):
    return {r["host"]: r for r in doc["hosts"]}


def test_records_carry_outcome_phases_downtime_bench_backup_drift(doc):
    hosts = by_host(doc)
    n1 = hosts["n1"]
    assert (n1["outcome"], n1["status"], n1["ok"], n1["backup_id"]) == ("upgraded", "ok", True, "B-n1")
    assert [p["name"] for p in n1["phases"]] == [
        "preflight",
        "assess",
        "backup",
        "cuda_toolkit",
        "venv_rebuild",
        "postcheck",
    ]
    assert {p["name"]: p["duration_s"] for p in n1["phases"]}["venv_rebuild"] == 240
    assert n1["phases"][-1]["note"] == "ok: speculative decoding 54.1 -> 96.1 tok/s"
    assert n1["downtime_s"] == 18 and n1["duration_s"] == 465
    assert n1["bench"] == {"before_tok_s": 54.1, "after_tok_s": 96.1, "change_pct": 77.6}
    assert n1["drift"] == ["toolkit at /usr/local/cuda-13.0 is absent", "serving venv link: current is lab-cu128-seed"]

    n2 = hosts["n2"]
    assert n2["status"] == "failed" and n2["outcome"].startswith("rolled back: postcheck:")
    phases = {p["name"]: p for p in n2["phases"]}
    assert phases["postcheck"]["status"] == "failed" and phases["postcheck"]["duration_s"] == 60
    # The rollback runs from the failure to the report; the unit was down while it restarted.
    assert phases["rollback"]["duration_s"] == 25 and phases["rollback"]["note"] == "rolled back to backup B-n2"
    assert n2["downtime_s"] == 18 and n2["bench"]["change_pct"] == -24.2

    assert hosts["n3"]["status"] == "failed" and hosts["n3"]["downtime_s"] == 0 and hosts["n3"]["backup_id"] == ""
    assert hosts["n4"]["status"] == "skipped" and hosts["n4"]["phases"] == []
    assert hosts["n6"]["outcome"] == "unreachable: no report" and hosts["n6"]["duration_s"] is None
    assert doc["totals"] == {"failed": 3, "ok": 2, "skipped": 1}
    assert doc["kind"] == "upgrade" and doc["run_id"] == RUN and doc["generated"] == "2026-03-01T12:10:00Z"
    assert json.loads(fr.to_json(doc)) == doc


def test_a_unit_still_down_at_the_report_counts_until_then():
    times = fr.timings([(0, "phase_start", "drain"), (10, "down", "stop"), (50, "failed", "x"), (70, "report", "")])
    assert times["downtime_s"] == 60 and times["phases"]["drain"] == {"duration_s": 50, "status": "failed"}


def test_check_mode_has_no_downtime_and_an_audit_names_its_drift():
    report = o.host_report(o.outcome("would_upgrade"), "n1", RUN, "cu130", check_mode=True)
    assert fr.host_record("n1", report, {}, [(0, "down", "x"), (9, "report", "")])["downtime_s"] is None
    audit = {
        "host": "n1",
        "profile": "cu130",
        "in_sync": False,
        "drift": ["toolkit at /usr/local/cuda-13.0 is absent"],
        "items": [
            {"item": "toolkit", "ok": False, "drift": "toolkit at /usr/local/cuda-13.0 is absent"},
            {"item": "serving unit", "ok": True, "drift": ""},
        ],
    }
    record = fr.host_record("n1", audit, {}, [(0, "report", "")])
    assert (record["status"], record["outcome_kind"], record["drift"]) == ("drift", "drifted", audit["drift"])
    assert [(g["name"], g["status"]) for g in record["gates"]] == [
        ("audit.toolkit", "failed"),
        ("audit.serving unit", "passed"),
    ]
    assert fr.fleet([record])["kind"] == "audit"


def test_an_audit_report_is_built_from_the_host_model_s_verdict():
    verdict = {
        "in_sync": False,
        "drift": ["serving venv link: current is seed, the lock wants lab-8304"],
        "drifted": ["serving venv link"],
        "items": [
            {"item": "toolkit", "ok": True, "expected": {}, "observed": {}, "drift": []},
            {"item": "serving venv link", "ok": False, "expected": "/v/lab-8304", "observed": "/v/seed", "drift": []},
        ],
        "on_profile": False,
        "last_run": {"run_id": "r0"},
    }
    report = fr.audit_report("n1", verdict, {"run_id": "audit-1", "dir": "/x"}, "cu130")
    assert report == {
        "host": "n1",
        "run_id": "audit-1",
        "profile": "cu130",
        "in_sync": False,
        "drift": verdict["drift"],
        "drifted": ["serving venv link"],
        "items": verdict["items"],
        "serving_venv": "/v/seed",
        "expected_venv": "/v/lab-8304",
        "last_run": {"run_id": "r0"},
    }
    assert fr.host_record("n1", report, {}, [(0, "report", "")])["outcome"].startswith("drift: serving venv link")
    with pytest.raises(fr.ReportError, match=r"^n2: the host model's verdict has no in_sync.*fix: publish it with"):
        fr.audit_report("n2", {"drift": []}, {}, "cu130")


def test_a_report_that_is_not_a_dict_is_refused_naming_the_host():
    with pytest.raises(fr.ReportError, match=r"^n7: the published report is a str.*fix: publish it with"):
        fr.host_record("n7", "upgraded", {}, [])


def test_junit_is_valid_against_the_jenkins_and_the_ant_schema(doc):
    etree = pytest.importorskip("lxml.etree")
    xml = fr.to_junit(doc).encode()
    tree = etree.fromstring(xml)
    for xsd in ("junit-10.xsd", "JUnit.xsd"):
        schema = etree.XMLSchema(etree.parse(str(DATA / xsd)))
        assert schema.validate(tree), (xsd, schema.error_log)
    suites = {s.get("name"): s for s in tree.iter("testsuite")}
    assert list(suites) == ["n1", "n2", "n3", "n4", "n5", "n6"]
    n2 = {c.get("name"): c for c in suites["n2"].iter("testcase")}
    assert "preflight.disk" in n2 and "postcheck.bench" in n2 and "outcome" in n2
    assert n2["postcheck.bench"].find("failure").get("message").startswith("bench: 41.0 tok/s")
    assert n2["outcome"].find("failure") is not None and n2["preflight.gpu"].find("failure") is None
    assert n2["preflight.drained"].find("skipped") is not None
    assert suites["n1"].get("failures") == "0" and suites["n2"].get("failures") == "2"
    assert suites["n4"].find("testcase").find("skipped") is not None
    # A schema that says no: the validator is not a rubber stamp.
    broken = etree.fromstring(xml.replace(b' tests="', b' tezts="', 1))
    assert not etree.XMLSchema(etree.parse(str(DATA / "JUnit.xsd"))).validate(broken)


def test_textfile_parses_as_prometheus_text_format(doc):
    parser = pytest.importorskip("prometheus_client.parser")
    families = {f.name: f for f in parser.text_string_to_metric_families(fr.textfile(by_host(doc)["n1"], now=T0 + 500))}
    assert families["gpufleet_stack_info"].samples[0].labels == {"profile": "cu130", "at_profile": "true"}
    assert families["gpufleet_last_run_result"].samples[0].labels == {"kind": "upgraded"}
    assert families["gpufleet_last_run_ok"].samples[0].value == 1
    assert families["gpufleet_last_run_timestamp_seconds"].samples[0].value == T0 + 500
    assert families["gpufleet_postcheck_output_tokens_per_second"].samples[0].value == 96.1

    rolled = {f.name: f for f in parser.text_string_to_metric_families(fr.textfile(by_host(doc)["n2"], now=T0))}
    assert rolled["gpufleet_stack_info"].samples[0].labels["at_profile"] == "false"
    assert rolled["gpufleet_last_run_ok"].samples[0].value == 0
    refused = {f.name for f in parser.text_string_to_metric_families(fr.textfile(by_host(doc)["n3"], now=T0))}
    assert "gpufleet_postcheck_output_tokens_per_second" not in refused  # no post-check ran: no figure

    odd = dict(by_host(doc)["n1"], profile='/srv/stacks/my "odd"\\profile.yml')
    parsed = next(parser.text_string_to_metric_families(fr.textfile(odd, now=T0)))
    assert parsed.samples[0].labels["profile"] == odd["profile"]


class Page(HTMLParser):
    def __init__(self):
        super().__init__()
        self.rows, self.rects, self.external = {}, [], []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "tr" and "data-host" in attrs:
            self.rows[attrs["data-host"]] = attrs["class"]
        if tag == "rect" and "class" in attrs:
            self.rects.append((attrs["class"], float(attrs["width"])))
        for key in ("src", "href"):
            if key in attrs:
                self.external.append(attrs[key])
        if tag == "link":
            self.external.append(attrs)


def test_html_has_a_coloured_row_per_host_and_an_inline_chart(doc):
    html = fr.to_html(doc)
    page = Page()
    page.feed(html)
    assert page.rows == {"n1": "ok", "n2": "failed", "n3": "failed", "n4": "skipped", "n5": "ok", "n6": "failed"}
    assert page.external == [] and "<svg" in html and "url(" not in html
    # n1, n2, n5 have figures: a before and an after bar each, on one scale (96.1 is the widest).
    assert [k for k, _w in page.rects] == ["before_tok_s", "after_tok_s"] * 3
    widths = [w for _k, w in page.rects]
    assert max(widths) == fr.CHART["bar_w"] and widths[0] == pytest.approx(54.1 / 96.1 * fr.CHART["bar_w"], abs=0.1)
    # Text from the hosts is escaped, never markup.
    evil = dict(by_host(doc)["n3"], outcome="failed preflight: <script>alert(1)</script>")
    assert "<script>" not in fr.to_html(fr.fleet([evil]))


def test_markdown_has_a_row_per_host_with_its_figures(doc):
    md = fr.to_markdown(doc)
    rows = [line for line in md.splitlines() if re.match(r"^\| n\d \|", line)]
    assert len(rows) == 6
    assert rows[0] == ("| n1 | ok | upgraded | 54.1 -> 96.1 tok/s (+77.6 %) | 18 s | - | 7 m 45 s | B-n1 |")
    assert "| rollback | 25 s | rolled back to backup B-n2 |" in md
    assert "- serving venv link: current is lab-cu128-seed" in md


def test_write_puts_every_report_file_in_the_run_folder(doc, tmp_path):
    written = fr.write(tmp_path / "runs" / RUN, doc)
    assert sorted(Path(p).name for p in written) == sorted(fr.REPORT_FILES)
    assert json.loads((tmp_path / "runs" / RUN / "report.json").read_text())["hosts"][0]["host"] == "n1"
    assert not list((tmp_path / "runs" / RUN).glob(".*.tmp"))


def test_the_textfile_filter_builds_the_same_record_from_the_host_facts():
    parser = pytest.importorskip("prometheus_client.parser")
    from ansible.errors import AnsibleFilterError

    from ansible_collections.gpufleet.upgrade.plugins.filter.fleet_report import fleet_textfile

    report, facts, _timeline = upgraded_host("n1")
    text = fleet_textfile(report, facts["postcheck_result"], now=T0)
    assert text == fr.textfile(fr.host_record("n1", report, {"postcheck_result": facts["postcheck_result"]}), T0)
    samples = {f.name: f.samples[0].value for f in parser.text_string_to_metric_families(text)}
    assert samples["gpufleet_postcheck_output_tokens_per_second"] == 96.1
    with pytest.raises(AnsibleFilterError, match=r"fleet_textfile: .*not a dict"):
        fleet_textfile(["upgraded"])
