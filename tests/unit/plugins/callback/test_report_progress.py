# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The summary callback while a run goes (batch k of n, hosts done and failed) and at its end (the fleet report in
the run's folder, its path printed), fed the events Ansible sends for a two-batch upgrade; the report's HTML is then
opened in headless Chromium (Debian's chromium; the test is skipped where it is not installed)."""

from __future__ import annotations

import json
import shutil
import subprocess
from types import SimpleNamespace

import pytest

from ansible_collections.gpufleet.upgrade.plugins.callback import upgrade_summary as us
from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _outcome as o

RUN = "20260301T120000Z-421337"


class Display:
    def __init__(self):
        self.lines, self.warnings, self.verbosity = [], [], 0

    def display(self, msg, **_kw):
        self.lines.append(msg)

    def warning(self, msg, **_kw):
        self.warnings.append(msg)


class Clock:
    def __init__(self):
        self.now = 1_772_366_400.0

    def __call__(self):
        return self.now


def named(name):
    return SimpleNamespace(get_name=lambda: name)


def task(name, action="ansible.builtin.set_fact", role=None, args=None, register=None):
    return SimpleNamespace(
        _uuid=f"{role}-{name}",
        action=action,
        args=args or {},
        register=register,
        get_name=lambda: name,
        _role=role and named(role),
    )


class Inventory:
    def __init__(self, everyone, batch):
        self.everyone, self.batch = everyone, batch

    def get_hosts(self, pattern, ignore_restrictions=False):
        return [named(h) for h in (self.everyone if ignore_restrictions else self.batch)]


def play(uuid, serial, everyone, batch):
    manager = SimpleNamespace(_inventory=Inventory(everyone, batch))
    return SimpleNamespace(_uuid=uuid, serial=serial, hosts="all", get_variable_manager=lambda: manager)


class Run:
    """Drives the callback as Ansible would, one host and task at a time."""

    def __init__(self, tmp_path):
        self.clock, self.display = Clock(), Display()
        self.cb = us.CallbackModule(display=self.display, clock=self.clock)
        self.cb.get_option = lambda name: None
        self.run_dir = str(tmp_path / "runs" / RUN)

    def ok(self, host, the_task, took=1.0, **result):
        self.cb.v2_runner_on_start(named(host), the_task)
        self.clock.now += took
        self.cb.v2_runner_on_ok(SimpleNamespace(_host=named(host), _task=the_task, _result=result))

    def phase(self, host, name, took, completed=True):
        self.ok(
            host,
            task("Note the phase the host is in"),
            0,
            ansible_facts={us.PHASE_FACT: {"name": name, "completed": False}},
        )
        self.clock.now += took
        if completed:
            self.ok(
                host,
                task("Note what the phase did"),
                0,
                ansible_facts={us.PHASE_FACT: {"name": name, "completed": True}},
            )

    def restart(self, host, took):
        self.ok(
            host,
            task(
                "Restart the serving unit",
                "ansible.builtin.systemd_service",
                "gpufleet.upgrade.serving",
                {"name": "gpufleet-serving.service", "state": "restarted", "daemon_reload": True},
            ),
            took - 2,
            # What systemd_service returns after a restart: the state is 'started'.
            changed=True,
            state="started",
            name="gpufleet-serving.service",
        )
        self.ok(
            host,
            task(
                "Poll /health while the unit is alive",
                "ansible.builtin.command",
                "gpufleet.upgrade.serving",
                {"argv": ["/usr/bin/python3", "-c", "...", "http://127.0.0.1:30000/health", "gpufleet-serving"]},
                register="__serving_health",
            ),
            2,
        )

    def fail(self, host, name):
        self.cb.v2_runner_on_failed(SimpleNamespace(_host=named(host), _task=task(name), _result={"msg": "boom"}))

    def report(self, host, outcome, phases=None, backup_id=""):
        report = o.host_report(outcome, host, RUN, "cu130", backup_id, phases)
        self.ok(
            host,
            task("Publish the host's report"),
            0,
            ansible_facts={"gpufleet_upgrade_report": report, "gpufleet_run_dir": self.run_dir},
        )


@pytest.fixture
def run(tmp_path):
    r = Run(tmp_path)
    everyone = ["n1", "n2", "n3"]
    r.cb.v2_playbook_on_play_start(play("ids", [], everyone, everyone))  # plays/run_id.yml: no batches
    r.cb.v2_playbook_on_play_start(play("up", [1, 2], everyone, ["n1"]))
    r.ok(
        "n1",
        task("Publish the baseline", role="gpufleet.upgrade.postcheck"),
        30,
        ansible_facts={"postcheck_baseline": {"output_tok_s": 54.1}},
    )
    for name, took in (("preflight", 5), ("backup", 20), ("cuda_toolkit", 100)):
        r.phase("n1", name, took)
    r.ok(
        "n1",
        task("Note the phase the host is in"),
        0,
        ansible_facts={us.PHASE_FACT: {"name": "venv_rebuild", "completed": False}},
    )
    r.clock.now += 200
    r.restart("n1", 18)
    r.ok(
        "n1",
        task("Note what the phase did"),
        0,
        ansible_facts={us.PHASE_FACT: {"name": "venv_rebuild", "completed": True}},
    )
    r.ok(
        "n1",
        task("Assemble the post-check result", role="gpufleet.upgrade.postcheck"),
        40,
        ansible_facts={
            "postcheck_result": {"gates": {"bench": {"status": "passed"}}, "bench": {"bench": {"output_tok_s": 96.1}}}
        },
    )
    r.report("n1", o.outcome("upgraded"), {"postcheck": "ok: speculative decoding 54.1 -> 96.1 tok/s"}, "B-n1")

    r.cb.v2_playbook_on_play_start(play("up", [1, 2], everyone, ["n2", "n3"]))
    r.ok(
        "n2",
        task("Publish the baseline", role="gpufleet.upgrade.postcheck"),
        30,
        ansible_facts={"postcheck_baseline": {"output_tok_s": 54.0}},
    )
    r.phase("n2", "preflight", 5)
    r.phase("n3", "preflight", 3, completed=False)
    r.fail("n3", "Check the free disk space")
    r.report("n3", o.outcome("failed_preflight", "n3: / has 1.00 GiB free"), {"preflight": "failed: disk"})
    r.phase("n2", "postcheck", 60, completed=False)
    r.fail("n2", "Fail with the post-check's problems")
    r.restart("n2", 15)
    r.report(
        "n2",
        o.outcome("rolled_back", "postcheck: bench regression"),
        {"rollback": "rolled back to backup B-n2"},
        "B-n2",
    )
    r.cb.v2_playbook_on_stats(None)
    return r


def test_progress_names_the_batch_and_its_hosts_done_and_failed(run):
    progress = [line for line in run.display.lines if line.startswith("gpufleet")]
    assert progress[:2] == [
        "gpufleet: batch 1 of 2: n1 (1 host(s))",
        # Batch 2 is still to come: the line says so (it read "0 to go" alone, as if the run had ended).
        "gpufleet: n1: upgraded (batch 1 of 2: 1 done, 0 failed, 0 to go in this batch;"
        " 2 host(s) in 1 batch(es) to come)",
    ]
    assert progress[2] == "gpufleet: batch 2 of 2: n2, n3 (2 host(s))"
    assert progress[3].startswith("gpufleet: n3: failed preflight") and progress[3].endswith(
        "0 done, 1 failed, 1 to go in this batch)"
    )
    assert progress[4].endswith("(batch 2 of 2: 0 done, 2 failed, 0 to go in this batch)")
    assert progress[-1] == (
        f"gpufleet report: {run.run_dir}/report.html (also report.json, report.md, junit.xml in {run.run_dir})"
    )
    assert run.display.warnings == []


@pytest.mark.parametrize(
    ("serial", "count", "sizes"),
    [
        ([1, "10%", "25%"], 20, [1, 2, 5, 5, 5, 2]),
        ([], 3, [3]),
        (["50%"], 3, [1, 1, 1]),
        ([2], 5, [2, 2, 1]),
    ],
)
def test_batch_sizes_follow_ansibles_serial(serial, count, sizes):
    assert us.batch_sizes(serial, count) == sizes


def test_the_run_folder_holds_the_report_with_what_the_callback_timed(run):
    with open(f"{run.run_dir}/report.json", encoding="utf-8") as handle:
        doc = json.load(handle)
    hosts = {r["host"]: r for r in doc["hosts"]}
    n1 = hosts["n1"]
    assert {p["name"]: p["duration_s"] for p in n1["phases"]} == {
        "preflight": 5,
        "backup": 20,
        "cuda_toolkit": 100,
        "venv_rebuild": 218,
        "postcheck": None,
    }
    assert n1["downtime_s"] == 18 and n1["bench"]["after_tok_s"] == 96.1 and n1["backup_id"] == "B-n1"
    n2 = {p["name"]: p for p in hosts["n2"]["phases"]}
    assert n2["postcheck"]["status"] == "failed" and n2["postcheck"]["duration_s"] == 60
    assert n2["rollback"]["duration_s"] == 15 and hosts["n2"]["downtime_s"] == 15
    assert hosts["n3"]["status"] == "failed" and hosts["n3"]["downtime_s"] == 0
    assert sorted(p.rsplit("/", 1)[1] for p in run.cb.report_paths) == sorted(
        ["report.json", "report.md", "report.html", "junit.xml"]
    )


def test_no_run_folder_no_report(tmp_path):
    r = Run(tmp_path)
    r.cb.v2_playbook_on_stats(None)
    assert r.cb.report_paths == [] and not any("gpufleet report" in line for line in r.display.lines)


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed")
def test_report_html_opens_in_headless_chromium(run, tmp_path):
    html = f"{run.run_dir}/report.html"
    flags = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--disable-extensions",
        # No network: a page that needed an external asset would show it missing.
        "--host-resolver-rules=MAP * ~NOTFOUND",
    ]
    dom = subprocess.run(
        [*flags, "--dump-dom", f"file://{html}"], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    assert dom.count("<tr class=") == 3 and 'class="failed"' in dom and 'id="tok-s-chart"' in dom
    shot = tmp_path / "report.png"
    subprocess.run(
        [*flags, "--window-size=1100,700", f"--screenshot={shot}", f"file://{html}"],
        capture_output=True,
        timeout=60,
        check=True,
    )
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 5000


def test_the_audit_prints_each_host_s_verdict_and_the_count():
    published = {
        "n2": {"host": "n2", "profile": "cu130", "in_sync": False, "drift": ["six 1.17.0 missing", "unit edited"]},
        "n1": {"host": "n1", "profile": "cu130", "in_sync": True, "drift": []},
        # An upgrade's report (no verdict of the model) is not an audit's line.
        "n3": {"host": "n3", "outcome": "upgraded"},
    }
    assert us.render_audit(published).splitlines()[2:] == [
        "n1: in sync with cu130",
        "n2: drift: six 1.17.0 missing; unit edited",
        "2 host(s) audited, 1 drifted",
    ]
    assert us.render_audit({"n3": published["n3"]}) == ""


def test_the_audit_s_reports_are_built_by_the_callback_from_each_verdict(tmp_path):
    """audit.yml publishes its run once and each host its verdict: the callback writes <host>.json, the fleet
    report and the verdict lines; an upgrade's verdicts (no audit run published) are not audits."""
    run = Run(tmp_path)
    audit_dir = tmp_path / "audits" / RUN
    run.ok(
        "n1",
        task("Note the audit's run for the report"),
        0,
        ansible_facts={us.AUDIT_RUN_FACT: {"run_id": f"audit-{RUN}", "dir": str(audit_dir)}},
    )
    for host, in_sync in (("n1", True), ("n2", False)):
        run.ok(
            host, task("Load and validate the stack profile"), 0, ansible_facts={"gpufleet_stack": {"name": "cu130"}}
        )
        verdict = {"in_sync": in_sync, "drift": [] if in_sync else ["six 1.17.0 missing"], "items": []}
        run.ok(
            host,
            task("Compare the host with the profile", "gpufleet.upgrade.host_state"),
            0,
            ansible_facts={us.VERDICT_FACT: verdict},
        )
    saved = json.loads((audit_dir / "n2.json").read_text())
    assert (saved["run_id"], saved["profile"], saved["drift"]) == (f"audit-{RUN}", "cu130", ["six 1.17.0 missing"])
    run.cb.v2_playbook_on_stats(None)
    assert "n2: drift: six 1.17.0 missing" in run.display.lines[-2]
    fleet = json.loads((audit_dir / "report.json").read_text())
    assert fleet["kind"] == "audit" and [h["host"] for h in fleet["hosts"]] == ["n1", "n2"]

    upgrade = Run(tmp_path)
    upgrade.ok(
        "n1",
        task("Compare the host with the profile", "gpufleet.upgrade.host_state"),
        0,
        ansible_facts={us.VERDICT_FACT: {"in_sync": True, "drift": [], "items": []}},
    )
    assert upgrade.cb.published == {}
