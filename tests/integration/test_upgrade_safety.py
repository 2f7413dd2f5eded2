# Copyright: (c) 2026, gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""upgrade.yml and rollback.yml on two lab hosts: check mode, the host lock, preflight refusals, the summary,
and rollback's bad input (never upgraded, another host's or profile's manifest, corrupt or missing manifest),
plus a rollback that has to rebuild a removed venv from the manifest's lock."""

from __future__ import annotations

import json
import subprocess

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

OLD_VENV = "/opt/gpufleet/serving/venvs/lab-cu128-seed"
OLD_SGLANG, NEW_SGLANG = "0.5.3", "0.5.9"
# The lab shares two cores with other work: give SSH room so a busy machine is not an unreachable host.
SUMMARY_ENV = {
    "ANSIBLE_CALLBACKS_ENABLED": "gpufleet.upgrade.upgrade_summary",
    "ANSIBLE_TIMEOUT": "60",
    "ANSIBLE_SSH_RETRIES": "3",
}
LOCK = "/var/lib/gpufleet/upgrade.lock"


def sh(node_exec, node, script):
    return node_exec(node, ["sh", "-c", script]).stdout.strip()


def host_state(node_exec, node):
    """What a change would show: links, new toolkit, backups, state file, lock."""
    return sh(
        node_exec,
        node,
        "readlink /opt/gpufleet/serving/current; readlink /usr/local/cuda; ls -d /usr/local/cuda-* ; "
        "ls /var/lib/gpufleet/backups 2>/dev/null; test -e /var/lib/gpufleet/state.json && echo state; "
        f"test -e {LOCK} && echo lock; sha256sum /etc/gpufleet/gpufleet-serving.env",
    )


def served_sglang(fleet, node_exec, node):
    """lab-sglang version the running server loaded (old stack 0.5.3, lab target 0.5.9)."""
    raw = sh(node_exec, node, f"curl -fsS --max-time 10 http://127.0.0.1:{fleet.serving_port(node)}/get_server_info")
    return json.loads(raw)["gpufleet_lab"]["distributions"]["lab-sglang"]


def report_of(result, node):
    found = [t for t in result.tasks("Publish the host's report", host=node) if "ansible_facts" in t.res]
    assert found, f"{node} published no report\n{result}"
    return found[-1].res["ansible_facts"]["gpufleet_upgrade_report"]


def upgrade(fleet, run_playbook, **kw):
    extravars = {"gpufleet_batch_size": len(fleet.nodes), "gpufleet_max_fail_percentage": 100}
    extravars.update(kw.pop("extravars", {}))
    return run_playbook("playbooks/upgrade.yml", fleet.inventory, extravars=extravars, envvars=SUMMARY_ENV, **kw)


def rollback(fleet, run_playbook, **kw):
    return run_playbook("playbooks/rollback.yml", fleet.inventory, envvars=SUMMARY_ENV, **kw)


@pytest.fixture(scope="module")
def fleet(lab_fleet):
    # A name per session: two sessions running this module must not recreate each other's nodes.
    return lab_fleet(2, name="safe-up")


def test_rollback_of_a_never_upgraded_host_is_a_noop(fleet, run_playbook, node_exec):
    node = fleet.nodes[0]
    before = host_state(node_exec, node)
    result = rollback(fleet, run_playbook, limit=node)
    assert result.rc == 0, str(result)
    assert "never upgraded" in report_of(result, node)["outcome"]
    assert host_state(node_exec, node) == before
    assert "GPUFLEET SUMMARY" in result.stdout


def test_check_mode_changes_nothing_and_says_what_it_would_do(fleet, run_playbook, node_exec):
    before = {n: host_state(node_exec, n) for n in fleet.nodes}
    result = upgrade(fleet, run_playbook, check=True, diff=True)
    assert result.rc == 0, str(result)
    for node in fleet.nodes:
        report = report_of(result, node)
        assert report["outcome"].startswith("would upgrade"), report
        assert report["phases"]["preflight"].startswith("ok: lock ok"), report
        assert "gpu skipped: no GPU" in report["phases"]["preflight"]
        assert result.task("Snapshot the host", host=node).changed, "check mode must show the backup it would take"
        # The state file's would-be changes are shown (with their diff), not skipped; nothing is written. (The
        # record of a phase that records nothing at its start is imported with its condition: it shows as skipped.)
        records = result.tasks("Record the run's progress in the host's state file", node)
        records = [r for r in records if r.status != "skipped"]
        assert len(records) >= 8 and all(r.changed for r in records), [r.res for r in records]
        assert any("diff" in r.res for r in records), [r.res for r in records]
        assert host_state(node_exec, node) == before[node]


def test_a_host_the_operator_skips_is_left_untouched(fleet, run_playbook, node_exec):
    node = fleet.nodes[0]
    textfile = "sha256sum /var/lib/prometheus/node-exporter/gpufleet.prom 2>/dev/null || echo none"
    before = host_state(node_exec, node), sh(node_exec, node, textfile)
    result = upgrade(fleet, run_playbook, limit=node, extravars={"gpufleet_skip": True})
    assert result.rc == 0, str(result)
    assert report_of(result, node)["outcome"] == "skipped by operator (gpufleet_skip is set for this host)"
    assert result.changed_tasks(node) == [], [r.task for r in result.changed_tasks(node)]
    # Nothing written to the host, not even the textfile the rollback test before left there.
    assert (host_state(node_exec, node), sh(node_exec, node, textfile)) == before


def test_preflight_refusal_names_host_value_and_fix(fleet, run_playbook, node_exec):
    node = fleet.nodes[0]
    before = host_state(node_exec, node)
    result = upgrade(fleet, run_playbook, limit=node, extravars={"preflight_toolkit_free_bytes": 10**15})
    assert result.rc != 0
    outcome = report_of(result, node)["outcome"]
    assert outcome.startswith("failed preflight:") and f"{node}:" in outcome and "GiB free on" in outcome
    assert "fix:" in outcome
    assert host_state(node_exec, node).replace("\nstate", "") == before.replace("\nstate", "")


def with_host_vars(fleet, tmp_path, host_vars):
    """A copy of the lab inventory with host_vars added to its hosts (e.g. each host's serving group)."""
    import yaml

    inventory = yaml.safe_load(open(fleet.inventory, encoding="utf-8"))
    hosts = inventory["all"]["children"]["gpufleet_lab"]["hosts"]
    for host, extra in host_vars.items():
        hosts[host].update(extra)
    path = tmp_path / "inventory.yml"
    path.write_text(yaml.safe_dump(inventory), encoding="utf-8")
    return path


def batch_lines(result):
    return [line.split(": ", 1)[1] for line in result.stdout.splitlines() if line.startswith("gpufleet: batch ")]


def test_batches_keep_a_serving_groups_share_and_the_failure_budget_is_a_percentage(
    fleet, run_playbook, node_exec, tmp_path
):
    # Both hosts serve one group: at most 1 of its hosts per batch cuts the batch of 2 in two. Each host is refused
    # at preflight (nothing changes), so the budget decides whether the second batch starts.
    inventory = with_host_vars(fleet, tmp_path, {n: {"serving_group": "llama-70b"} for n in fleet.nodes})
    first, second = fleet.nodes
    before = {n: host_state(node_exec, n) for n in fleet.nodes}
    extravars = {
        "gpufleet_batch_size": 2,
        "gpufleet_batch_by": "serving_group",
        "gpufleet_batch_group_max": 1,
        "gpufleet_batch_pause": 1,
        "preflight_toolkit_free_bytes": 10**15,
    }
    common = {"extravars": extravars, "envvars": SUMMARY_ENV}
    # 49 % of 2 hosts is 0: the first refusal stops the rollout; the second host is not started, and nobody paused.
    stopped = run_playbook(
        "playbooks/upgrade.yml", inventory, **dict(common, extravars=dict(extravars, gpufleet_max_failed_hosts="49%"))
    )
    assert stopped.rc != 0
    assert batch_lines(stopped) == [f"batch 1 of 2: {first} (1 host(s))", f"batch 2 of 2: {second} (1 host(s))"], (
        stopped.stdout
    )
    assert report_of(stopped, first)["outcome"].startswith("failed preflight:")
    outcome = report_of(stopped, second)["outcome"]
    assert (
        "the rollout stopped after 1 failed host(s)" in outcome
        and "gpufleet_max_failed_hosts=49%, 0 of 2 hosts" in outcome
    )
    assert [t for t in stopped.tasks("Pause between batches") if t.status == "ok"] == []
    # 50 % is 1 host: the rollout goes on to the second batch, after the pause.
    went_on = run_playbook(
        "playbooks/upgrade.yml", inventory, **dict(common, extravars=dict(extravars, gpufleet_max_failed_hosts="50%"))
    )
    assert went_on.rc != 0
    assert report_of(went_on, second)["outcome"].startswith("failed preflight:"), report_of(went_on, second)
    assert len([t for t in went_on.tasks("Pause between batches") if t.status == "ok"]) == 1
    # A refusal records itself in the state file, nothing else.
    assert {n: host_state(node_exec, n).replace("\nstate", "") for n in fleet.nodes} == {
        n: b.replace("\nstate", "") for n, b in before.items()
    }
    # A setting no host has is refused before any batch, naming the setting.
    wrong = run_playbook(
        "playbooks/upgrade.yml", inventory, **dict(common, extravars=dict(extravars, gpufleet_batch_by="pool"))
    )
    assert wrong.rc != 0 and "gpufleet_batch_by='pool': no host sets the variable 'pool'" in wrong.stdout, wrong.stdout


def test_lock_of_another_controller_refuses_until_broken(fleet, run_playbook, node_exec):
    node = fleet.nodes[1]
    lock = {"run_id": "r-elsewhere", "pid": 4242, "pid_start": "1", "controller": "ctl-elsewhere", "started": "t"}
    sh(node_exec, node, f"mkdir -p /var/lib/gpufleet && echo '{json.dumps(lock)}' > {LOCK}")
    refused = upgrade(fleet, run_playbook, limit=node)
    outcome = report_of(refused, node)["outcome"]
    assert "failed preflight" in outcome and "ctl-elsewhere" in outcome and "gpufleet_lock_break=r-elsewhere" in outcome
    assert json.loads(sh(node_exec, node, f"cat {LOCK}"))["run_id"] == "r-elsewhere", "a refused run took the lock"
    result = upgrade(fleet, run_playbook, extravars={"gpufleet_lock_break": "r-elsewhere"})
    assert result.rc == 0, str(result)
    for n in fleet.nodes:
        assert report_of(result, n)["outcome"] == "upgraded"
        assert served_sglang(fleet, node_exec, n) == NEW_SGLANG
        assert sh(node_exec, n, f"test -e {LOCK} || echo free") == "free"
    assert f"{fleet.nodes[1]}: upgraded" in result.stdout and "totals: upgraded 2" in result.stdout


def test_rerun_on_an_upgraded_host_takes_no_backup(fleet, run_playbook, node_exec):
    first = upgrade(fleet, run_playbook)
    assert first.rc == 0, str(first)
    backups = {node: sh(node_exec, node, "ls /var/lib/gpufleet/backups") for node in fleet.nodes}
    second = upgrade(fleet, run_playbook)
    assert second.rc == 0, str(second)
    for node in fleet.nodes:
        assert report_of(second, node)["outcome"] == "already at lab (in sync)", report_of(second, node)
        assert sh(node_exec, node, "ls /var/lib/gpufleet/backups") == backups[node], "a converged host was backed up"
        assert second.tasks("Snapshot the host", host=node) == []
    assert second.changed_tasks() == [], [t.task for t in second.changed_tasks()]


def test_rollback_refuses_another_hosts_or_profiles_manifest(fleet, run_playbook, node_exec):
    n1, n2 = fleet.nodes
    foreign = sh(node_exec, n1, "ls /var/lib/gpufleet/backups | tail -1")
    before = host_state(node_exec, n2)
    data = subprocess.run(
        ["podman", "exec", n1, "tar", "-C", "/var/lib/gpufleet/backups", "-cf", "-", foreign],
        capture_output=True,
        check=True,
    ).stdout
    subprocess.run(
        ["podman", "exec", "-i", n2, "tar", "-C", "/var/lib/gpufleet/backups", "-xf", "-"], input=data, check=True
    )
    result = rollback(fleet, run_playbook, limit=n2, extravars={"rollback_backup_id": foreign})
    assert result.rc != 0
    assert f"belongs to host '{n1}'" in result.stdout and "refused" in result.stdout
    sh(node_exec, n2, f"rm -rf /var/lib/gpufleet/backups/{foreign}")
    other_profile = rollback(fleet, run_playbook, limit=n2, extravars={"gpufleet_stack_profile": "lab-cu128"})
    assert other_profile.rc != 0
    assert "was taken for profile 'lab', not 'lab-cu128'" in other_profile.stdout
    assert host_state(node_exec, n2) == before
    assert served_sglang(fleet, node_exec, n2) == NEW_SGLANG


def test_rollback_refuses_a_corrupt_or_missing_manifest(fleet, run_playbook, node_exec):
    node = fleet.nodes[1]
    backups = sh(node_exec, node, "ls /var/lib/gpufleet/backups").split()
    target = backups[0]
    sh(node_exec, node, f"cp /var/lib/gpufleet/backups/{target}/manifest.json /tmp/m.json")
    sh(node_exec, node, f"echo ' ' >> /var/lib/gpufleet/backups/{target}/manifest.json")
    before = host_state(node_exec, node)
    corrupt = rollback(fleet, run_playbook, limit=node, extravars={"rollback_backup_id": target})
    assert corrupt.rc != 0 and "does not match its sha256" in corrupt.stdout and "nothing was changed" in corrupt.stdout
    sh(node_exec, node, f"rm /var/lib/gpufleet/backups/{target}/manifest.json")
    missing = rollback(fleet, run_playbook, limit=node, extravars={"rollback_backup_id": target})
    assert missing.rc != 0 and "manifest.json is missing" in missing.stdout
    assert host_state(node_exec, node) == before
    sh(node_exec, node, f"cp /tmp/m.json /var/lib/gpufleet/backups/{target}/manifest.json")


def test_rollback_rebuilds_a_removed_venv_from_the_lock(fleet, run_playbook, node_exec):
    node = fleet.nodes[0]
    sh(node_exec, node, f"rm -rf {OLD_VENV}")
    check = rollback(fleet, run_playbook, limit=node, check=True, diff=True)
    assert check.rc == 0, str(check)
    assert sh(node_exec, node, f"test -e {OLD_VENV} || echo gone") == "gone"
    result = rollback(fleet, run_playbook, limit=node, extravars={"rollback_server_info_url": ""})
    assert result.rc == 0, str(result)
    outcome = report_of(result, node)["outcome"]
    assert f"venv {OLD_VENV} restored from the lock" in outcome, outcome
    assert served_sglang(fleet, node_exec, node) == OLD_SGLANG
    assert sh(node_exec, node, "readlink /usr/local/cuda") == "/usr/local/cuda-12.8"
    assert sh(node_exec, node, f"ls -d {OLD_VENV}.rollback-partial 2>/dev/null || echo none") == "none"
    restored = result.task("Read the backup", host=node).res["backup_id"]
    again = rollback(
        fleet, run_playbook, limit=node, extravars={"rollback_backup_id": restored, "rollback_server_info_url": ""}
    )
    assert again.rc == 0, str(again)
    restore_changes = [
        t.task for t in again.changed_tasks(node) if "lock" not in t.task.lower() and "state" not in t.task.lower()
    ]
    assert restore_changes == [], restore_changes
