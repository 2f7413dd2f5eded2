# Copyright: (c) 2026, gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""An unprivileged SSH user without ansible_become is refused first, naming the user, the paths and the fix, not at
the lock as if another run held it, and the host report writes no textfile it cannot write."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.integration]

SUMMARY_ENV = {
    "ANSIBLE_CALLBACKS_ENABLED": "gpufleet.upgrade.upgrade_summary",
    "ANSIBLE_TIMEOUT": "60",
    "ANSIBLE_SSH_RETRIES": "3",
}


@pytest.fixture(scope="module")
def fleet(lab_fleet):
    return lab_fleet(1, name="priv")


def test_unprivileged_user_is_refused_naming_become_and_the_paths(fleet, run_playbook, node_exec):
    node = fleet.nodes[0]
    node_exec(node, ["sh", "-c", "id gpuop >/dev/null 2>&1 || useradd -m -s /bin/sh gpuop"], check=True)
    before = node_exec(node, ["sh", "-c", "ls -la /var/lib/gpufleet; readlink /opt/gpufleet/serving/current"]).stdout
    result = run_playbook(
        "playbooks/upgrade.yml",
        fleet.inventory,
        extravars={"ansible_user": "gpuop", "ansible_become": False, "gpufleet_batch_size": 1},
        envvars=SUMMARY_ENV,
    )
    assert result.rc != 0
    reports = [t for t in result.tasks("Publish the host's report", host=node) if "ansible_facts" in t.res]
    outcome = reports[-1].res["ansible_facts"]["gpufleet_upgrade_report"]["outcome"]
    assert outcome.startswith("failed preflight:"), outcome
    assert f"{node}: the run connects as user gpuop (uid " in outcome
    assert "without become (ansible_become is off) and cannot write state folder (gpufleet_state_dir)" in outcome
    assert "node-exporter textfile folder (gpufleet_textfile_dir)" in outcome
    assert "Fix: set ansible_become: true for this host" in outcome and "Nothing was changed." in outcome
    assert "lock" not in outcome, "the refusal blamed the lock"
    assert not result.tasks("Take the upgrade lock", host=node), "the lock was tried before the privilege"
    assert "textfile was not written" not in result.stdout, "the report tried the textfile it was told it cannot write"
    after = node_exec(node, ["sh", "-c", "ls -la /var/lib/gpufleet; readlink /opt/gpufleet/serving/current"]).stdout
    assert after == before
