# Copyright: (c) 2026, gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Reports keep every reason whole: three failed preflight gates, judged by the filter the role runs, each keep their
own message and fix in report.json and junit.xml (the attribute one line, the body whole) and in report.md/html
(folded, never cut), though the outcome line is cut to length; a skipped post-check gate says why."""

from __future__ import annotations

import importlib.util
import json
import xml.etree.ElementTree as ET
from pathlib import Path

from ansible_collections.gpufleet.upgrade.plugins.filter.preflight import preflight_gates
from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _fleet_report as fr
from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _outcome as o

_SPEC = importlib.util.spec_from_file_location(
    "preflight_gates_test", Path(__file__).resolve().parents[1] / "filter" / "test_preflight_gates.py"
)
GATES = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(GATES)
GIB = GATES.GIB
HOST = "gpu-node-0042.rack17.example.internal"
LONG_STDERR = "still serving " + "request " * 30


def three_failed_gates():
    # The preflight filter's own test host (tests/unit/plugins/filter/test_preflight_gates.py), three gates failing.
    probe = GATES.probe(python={"rc": 127, "path": ""}, drained={"rc": 3, "stderr": LONG_STDERR})
    probe["disk"]["df"] = ["Mounted on Avail", f"/ {GIB}", f"/ {GIB}"]
    return preflight_gates(
        probe,
        host=HOST,
        lock_msg="taken",
        python="python3.12",
        python_version="3.12",
        drained_check_cmd="sinfo -n gpu1 -h -o %T | grep -q drained",
        check_mirrors=False,
    )


def refused_record():
    gates = three_failed_gates()
    reason = "Refuse the host when a gate failed: " + "; ".join(gates["failures"])
    outcome = o.outcome("failed_preflight", o.failure_reason({"msg": "; ".join(gates["failures"])}, reason[:36]))
    report = o.host_report(outcome, HOST, "20260301T120000Z-1", "cu130", phases={"preflight": "failed"})
    facts = {
        "preflight_report": gates["report"],
        "postcheck_result": {
            "gates": {
                "gpu_health": {"status": "skipped", "reasons": [], "skipped_reason": "skipped: no GPU"},
                "smoke": {"status": "skipped", "reasons": [], "skipped_reason": "skipped: disabled"},
            }
        },
    }
    return gates, fr.fleet([fr.host_record(HOST, report, facts)], run_id="20260301T120000Z-1", kind="upgrade")


def test_each_failed_gate_keeps_its_own_reason_and_fix_in_report_json():
    gates, doc = refused_record()
    record = json.loads(fr.to_json(doc))["hosts"][0]
    by_name = {g["name"]: g for g in record["gates"]}
    assert len(gates["failures"]) == 3
    for name, failure in zip(("python", "disk", "drained"), gates["failures"], strict=True):
        assert by_name[f"preflight.{name}"]["status"] == "failed"
        own = " ".join(failure.removeprefix(f"{HOST}: ").split())
        assert by_name[f"preflight.{name}"]["message"] == f"failed: {own}"
        assert "fix:" in by_name[f"preflight.{name}"]["message"]
    assert len(record["outcome"]) <= o.REASON_LIMIT + len("failed preflight: ")
    assert "fix: drain the host first" not in record["outcome"], "the test needs an outcome cut before the third fix"


def test_junit_gives_a_one_line_message_and_the_whole_reason_in_the_body():
    gates, doc = refused_record()
    cases = {c.get("name"): c for c in ET.fromstring(fr.to_junit(doc)).iter("testcase")}
    drained = cases["preflight.drained"].find("failure")
    assert drained.get("message") != "failed" and len(drained.get("message")) <= fr.JUNIT_SUMMARY
    assert drained.get("message").startswith("failed: the drained check `sinfo -n gpu1")
    assert drained.text.endswith("fix: drain the host first, or use gpufleet_drain to let the run drain it")
    disk = cases["preflight.disk"].find("failure")
    assert "GiB free on /" in disk.get("message") and "fix: free space on /" in disk.text
    skipped = cases["postcheck.gpu_health"].find("skipped")
    assert skipped.get("message") == "skipped: no GPU"
    assert cases["postcheck.smoke"].find("skipped").get("message") == "skipped: disabled"


def test_markdown_and_html_fold_every_gate_reason_whole():
    gates, doc = refused_record()
    third = " ".join(gates["failures"][2].removeprefix(f"{HOST}: ").split())
    markdown = fr.to_markdown(doc)
    assert "<details><summary>gates: " in markdown and "3 failed" in markdown
    assert third.replace("|", "\\|") in markdown
    assert "| postcheck.gpu_health | skipped | skipped: no GPU |" in markdown
    html = fr.to_html(doc)
    assert "<details><summary>gates: " in html
    assert "fix: drain the host first, or use gpufleet_drain to let the run drain it" in html
    assert "smoke</b> skipped: skipped: disabled" in html


def test_prepare_says_reused_when_it_reused_a_verified_venv():
    venv = "/opt/gpufleet/serving/venvs/cu130-0123456789ab"
    built = o.phase_note("prepare", {"venv_rebuild_path": venv, "venv_rebuild_reused": False})
    reused = o.phase_note("prepare", {"venv_rebuild_path": venv, "venv_rebuild_reused": True})
    assert built == {"prepare": f"ok: {venv} built and verified, the host still serving"}
    assert reused == {"prepare": f"ok: {venv} reused (verified earlier), the host still serving"}
