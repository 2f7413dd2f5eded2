# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Merging the fleet reports of a sliced run: synthetic slices written as the summary callback writes them
(_fleet_report.fleet + write), merged by _merge_reports, by the lookup merged_report and by
playbooks/merge_reports.yml run with ansible-playbook on localhost (connection local, no lab)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _fleet_report as fr
from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _merge_reports as mr
from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _outcome as o

REPO = Path(__file__).resolve().parents[4]
RUN_A = "20261207T031500Z-111111"
RUN_B = "20261207T031501Z-222222"
T0 = 1_796_613_300.0


def host_report(host, run_id, kind="upgraded", profile="cu130"):
    """A host's report as the playbooks publish it (filters outcome and host_report)."""
    detail = profile if kind == "upgraded" else f"postcheck failed on {host}"
    phases = {"preflight": "ok", "prepare": "venv built", "switch": "switched"}
    return o.host_report(o.outcome(kind, detail, host, f"{host}-b1"), host, run_id, profile, f"{host}-b1", phases)


def timeline(start):
    return [
        (start, "phase_start", "preflight"),
        (start + 5, "phase_end", "preflight"),
        (start + 5, "phase_start", "prepare"),
        (start + 65, "phase_end", "prepare"),
        (start + 66, "down", ""),
        (start + 70, "up", ""),
        (start + 80, "report", ""),
    ]


def write_slice(controller, run_id, hosts, generated, kinds=None, profile="cu130"):
    """A slice's run folder as the callback leaves it; returns the folder."""
    kinds = kinds or {}
    records = [
        fr.host_record(h, host_report(h, run_id, kinds.get(h, "upgraded"), profile), {}, timeline(generated - 100))
        for h in hosts
    ]
    folder = Path(controller) / "runs" / run_id
    fr.write(folder, fr.fleet(records, generated=generated))
    return folder


def test_two_slices_make_one_fleet_report(tmp_path):
    write_slice(tmp_path, RUN_A, ["gpu-01", "gpu-03"], T0, kinds={"gpu-03": "rolled_back"})
    write_slice(tmp_path, RUN_B, ["gpu-02", "gpu-04"], T0 + 7)

    doc = mr.merge_runs([RUN_A, RUN_B], tmp_path)

    assert [r["host"] for r in doc["hosts"]] == ["gpu-01", "gpu-02", "gpu-03", "gpu-04"]
    assert doc["totals"] == {"failed": 1, "ok": 3}
    assert doc["kind"] == "upgrade" and doc["profile"] == "cu130"
    # Dated by its newest slice; each host keeps its own slice's run id.
    assert doc["generated_epoch"] == T0 + 7
    assert {r["host"]: r["run_id"] for r in doc["hosts"]}["gpu-03"] == RUN_A
    assert [(s["run_id"], s["hosts"], s["totals"]) for s in doc["slices"]] == [
        (RUN_A, 2, {"failed": 1, "ok": 1}),
        (RUN_B, 2, {"ok": 2}),
    ]
    assert doc["run_id"].startswith("merged-") and doc["run_id"] == mr.merged_run_id([RUN_B, RUN_A])
    # Records are carried over as the slices wrote them (phases, downtime).
    one = next(r for r in doc["hosts"] if r["host"] == "gpu-02")
    assert one["downtime_s"] == 4.0 and [p["name"] for p in one["phases"]][:2] == ["preflight", "prepare"]


def test_merge_is_deterministic_and_renders(tmp_path):
    write_slice(tmp_path, RUN_A, ["a1"], T0)
    write_slice(tmp_path, RUN_B, ["b1"], T0 + 1)
    first = fr.render(mr.merge_runs([RUN_A, RUN_B], tmp_path))
    again = fr.render(mr.merge_runs([str(tmp_path / "runs" / RUN_B), RUN_A], tmp_path))
    assert first == again
    assert set(first) == set(fr.REPORT_FILES)
    assert "a1" in first["report.md"] and "b1" in first["junit.xml"]


def test_a_host_in_two_slices_is_refused_naming_both_runs(tmp_path):
    write_slice(tmp_path, RUN_A, ["gpu-01", "gpu-02"], T0)
    write_slice(tmp_path, RUN_B, ["gpu-02", "gpu-03"], T0)
    with pytest.raises(mr.MergeError) as err:
        mr.merge_runs([RUN_A, RUN_B], tmp_path)
    text = str(err.value)
    assert text.startswith("gpu-02: in two slices") and RUN_A in text and RUN_B in text and "fix:" in text


def test_slices_of_another_profile_or_kind_are_refused(tmp_path):
    write_slice(tmp_path, RUN_A, ["gpu-01"], T0)
    write_slice(tmp_path, RUN_B, ["gpu-02"], T0, profile="cu130-sglang0523")
    with pytest.raises(mr.MergeError, match=r"different profiles: 'cu130' \(run 2026.*'cu130-sglang0523'"):
        mr.merge_runs([RUN_A, RUN_B], tmp_path)
    rollback = "rollback-20261207T031502Z-333333"
    write_slice(tmp_path, rollback, ["gpu-04"], T0)
    with pytest.raises(mr.MergeError, match=r"different kinds: 'rollback'.*'upgrade'"):
        mr.merge_runs([RUN_A, rollback], tmp_path)


def test_unusable_slices_name_the_path_and_the_fix(tmp_path):
    with pytest.raises(mr.MergeError, match=r"runs/nope/report.json does not exist; fix: .*upgrade_summary"):
        mr.merge_runs(["nope"], tmp_path)
    bad = tmp_path / "other.json"
    bad.write_text(json.dumps({"schema": "something/v9", "hosts": []}))
    with pytest.raises(mr.MergeError, match=r"is not a fleet report .*'something/v9'"):
        mr.merge_runs([str(bad)], tmp_path)
    write_slice(tmp_path, RUN_A, ["gpu-01"], T0)
    with pytest.raises(mr.MergeError, match="listed twice"):
        mr.merge_runs([RUN_A, RUN_A], tmp_path)
    with pytest.raises(mr.MergeError, match="needs the controller folder"):
        mr.merge_runs([RUN_A], None)
    with pytest.raises(mr.MergeError, match="no slices"):
        mr.merge_runs([], tmp_path)


def test_report_path_reads_ids_folders_and_files(tmp_path):
    assert mr.report_path("R1", "/c") == "/c/runs/R1/report.json"
    assert mr.report_path("/x/runs/R1", None) == "/x/runs/R1/report.json"
    assert mr.report_path("/x/r.json", None) == "/x/r.json"


def test_lookup_returns_the_merged_report_and_its_files(tmp_path):
    from ansible.errors import AnsibleLookupError

    from ansible_collections.gpufleet.upgrade.plugins.lookup.merged_report import LookupModule

    write_slice(tmp_path, RUN_A, ["gpu-01"], T0)
    write_slice(tmp_path, RUN_B, ["gpu-02"], T0)
    lookup = LookupModule()
    [out] = lookup.run([[RUN_A, RUN_B]], variables={}, controller_dir=str(tmp_path))
    assert out["run_id"] == out["report"]["run_id"]
    assert json.loads(out["files"]["report.json"])["totals"] == {"ok": 2}
    write_slice(tmp_path, RUN_B, ["gpu-01"], T0)
    with pytest.raises(AnsibleLookupError, match="gpu-01: in two slices"):
        lookup.run([RUN_A, RUN_B], variables={}, controller_dir=str(tmp_path))


def _playbook(tmp_path, extra, *args):
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    bindir = os.path.dirname(sys.executable)
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    argv = [os.path.join(bindir, "ansible-playbook"), "-i", "localhost,", "-c", "local"]
    # localhost is named in the inventory here: it gets this Python rather than one found by discovery.
    extra = dict(extra, ansible_python_interpreter=sys.executable)
    argv += ["-e", json.dumps(extra), *args, str(REPO / "playbooks" / "merge_reports.yml")]
    return subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)


def test_playbook_writes_the_merged_report_check_mode_first(tmp_path):
    write_slice(tmp_path, RUN_A, ["gpu-01", "gpu-03"], T0)
    write_slice(tmp_path, RUN_B, ["gpu-02"], T0 + 3)
    merged = tmp_path / "runs" / mr.merged_run_id([RUN_A, RUN_B])
    extra = {"gpufleet_controller_dir": str(tmp_path), "gpufleet_merge_runs": [RUN_A, RUN_B]}

    check = _playbook(tmp_path, extra, "--check")
    assert check.returncode == 0, check.stdout + check.stderr
    assert not merged.exists()

    run = _playbook(tmp_path, extra)
    assert run.returncode == 0, run.stdout + run.stderr
    assert sorted(os.listdir(merged)) == sorted(fr.REPORT_FILES)
    doc = json.loads((merged / "report.json").read_text())
    assert [r["host"] for r in doc["hosts"]] == ["gpu-01", "gpu-02", "gpu-03"]
    assert "3 hosts from 2 slices" in run.stdout

    # The same slices again: nothing to change.
    again = _playbook(tmp_path, extra)
    assert again.returncode == 0 and "changed=0" in again.stdout, again.stdout

    write_slice(tmp_path, RUN_B, ["gpu-03"], T0 + 3)
    clash = _playbook(tmp_path, extra)
    assert clash.returncode != 0
    assert f"gpu-03: in two slices, run {RUN_A} and run {RUN_B}" in " ".join(clash.stdout.split())
