"""The README's main job end to end: audit a lab fleet in the old state, upgrade it, audit again.

- audit.yml names the drift of an old host and changes nothing on it (a fingerprint of every path the upgrade
  touches is the same before and after);
- upgrade.yml upgrades every host: the serving unit answers from the new venv with CUDA_HOME of the new toolkit,
  and the run's summary says "upgraded" per host with the benchmark before and after;
- afterwards audit.yml says "in sync" and upgrade.yml --check reports no change at all (truthful check mode).
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

FINGERPRINT = (
    "find /usr/local /opt/gpufleet /etc/gpufleet /etc/systemd/system -xdev \\( -type f -o -type l \\) "
    "-newermt '1970-01-02' -printf '%p %s %T@ %l\\n' 2>/dev/null | sort | sha256sum; readlink /usr/local/cuda; "
    "readlink /opt/gpufleet/serving/current"
)


@pytest.fixture(scope="module")
def fleet(lab_fleet):
    return lab_fleet(2, name="it-demo")


def fingerprint(node_exec, node):
    return node_exec(node, ["sh", "-c", FINGERPRINT], check=True).stdout


def served(fleet, node):
    url = f"http://127.0.0.1:{fleet.serving_port(node)}/get_server_info"
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.load(resp)["gpufleet_lab"]


def audits(result):
    return result.audit_reports()


def test_audit_upgrade_audit(fleet, run_playbook, node_exec, tmp_path):
    before = {n: fingerprint(node_exec, n) for n in fleet.nodes}

    first = run_playbook("playbooks/audit.yml", fleet.inventory, check=True, diff=True)
    assert first.rc == 0, first
    assert set(audits(first)) == set(fleet.nodes)
    for report in audits(first).values():
        assert report["in_sync"] is False, report
        assert any("toolkit at /usr/local/cuda-13.0 is absent" in d for d in report["drift"]), report
        assert any("serving venv link: current is lab-cu128-seed" in d for d in report["drift"]), report
    assert {n: fingerprint(node_exec, n) for n in fleet.nodes} == before, "the audit changed a host"

    refused = run_playbook("playbooks/audit.yml", fleet.inventory)
    assert refused.rc != 0 and "needs --check" in refused.stdout

    summary = tmp_path / "summary.json"
    upgrade = run_playbook(
        "playbooks/upgrade.yml",
        fleet.inventory,
        extravars={"gpufleet_bench_enabled": True},
        envvars={"GPUFLEET_SUMMARY_FILE": str(summary)},
    )
    assert upgrade.rc == 0, upgrade
    # A clean run warns of nothing: neither ansible-core ("Using a template for task args is unsafe", a find that
    # skipped a missing drop-in folder) nor the summary callback, and no task's result carries a warning.
    warned = [line for line in upgrade.stdout.splitlines() if "WARNING]" in line]
    warned += [
        f"{r.host} {r.task}: {w}" for rs in upgrade.results.values() for r in rs for w in r.res.get("warnings") or []
    ]
    assert warned == [], warned
    outcomes = json.loads(summary.read_text())
    text = json.dumps(outcomes)
    for node in fleet.nodes:
        assert node in text
        info = served(fleet, node)
        assert info["cuda_home"] == "/usr/local/cuda-13.0", info
        assert "lab-cu128-seed" not in info.get("sys_prefix_realpath", ""), info
        versions = {k.lower(): v for k, v in info["distributions"].items()}
        assert versions["lab-sglang"] == "0.5.9" and versions["lab-torch"] == "2.11.0+cu130", versions
    assert text.count("upgraded") >= len(fleet.nodes), text
    # The benchmark before and after: the stand-in serves EAGLE-3 at 54.1 tok/s on the old stack, 96.1 on the new.
    assert text.count("speculative decoding") == len(fleet.nodes), text
    # The fleet report (callback upgrade_summary) lies in the run's folder beside the hosts' reports.
    reports = ("report.json", "report.md", "report.html", "junit.xml")
    assert {
        name
        for t in upgrade.tasks("Publish the host's report")
        for name in reports
        if (Path(t.res["ansible_facts"]["gpufleet_run_dir"]) / name).is_file()
    } == set(reports), upgrade

    again = run_playbook("playbooks/audit.yml", fleet.inventory, check=True, diff=True)
    assert again.rc == 0, again
    assert all(r["in_sync"] for r in audits(again).values()), audits(again)

    check = run_playbook("playbooks/upgrade.yml", fleet.inventory, check=True, diff=True)
    assert check.rc == 0, check
    # Records of the run (its report on the controller, the post-check result, the backup of a host whose results
    # changed) are not stack state.
    records = ("on the controller", "report folder", "Write the result on the host", "Snapshot the host")
    changed = [f"{r.host}: {r.task}" for r in check.changed_tasks() if not any(w in r.task for w in records)]
    assert changed == [], changed
