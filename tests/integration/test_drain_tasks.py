# Copyright: (c) 2026, gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""gpufleet_drain=tasks: the operator's hooks run where the drain contract says, on a lab host.

One host, one upgrade that fails after its post-check (gpufleet_fault_inject=after_postcheck): the drain hook runs
just before the switch - the new toolkit is installed and the new venv built while the host still serves, current
still the old venv - the undrain hook runs after the rollback put the old venv back (the host serves the old stack
when it is put back in service), and each hook runs once.
"""

from __future__ import annotations

import json

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

OLD_VENV = "/opt/gpufleet/serving/venvs/lab-cu128-seed"

HOOK = """---
- name: Note the {what} hook and how the host looks
  ansible.builtin.shell: |
    printf '%s\\n' "$(date +%s.%N) {what} toolkit=$(test -e /usr/local/cuda-13.0 && echo new || echo old) \\
    current=$(readlink -f /opt/gpufleet/serving/current) venvs=$(ls /opt/gpufleet/serving/venvs | wc -l)" \\
    >> /var/lib/gpufleet/drain-hooks.log
  changed_when: true
"""


@pytest.fixture(scope="module")
def fleet(lab_fleet):
    return lab_fleet(1, name="drain-tasks")


def test_tasks_hooks_run_around_the_upgrade_and_after_a_rollback(fleet, run_playbook, node_exec, tmp_path):
    (tmp_path / "drain.yml").write_text(HOOK.format(what="drain"))
    (tmp_path / "undrain.yml").write_text(HOOK.format(what="undrain"))
    node = fleet.nodes[0]
    result = run_playbook(
        "playbooks/upgrade.yml",
        fleet.inventory,
        envvars={"ANSIBLE_TIMEOUT": "60"},
        extravars={
            "gpufleet_batch_size": 1,
            "gpufleet_drain": "tasks",
            "gpufleet_drain_tasks": str(tmp_path / "drain.yml"),
            "gpufleet_undrain_tasks": str(tmp_path / "undrain.yml"),
            "gpufleet_fault_inject": "after_postcheck",
        },
    )
    reports = [t.res["ansible_facts"] for t in result.tasks("Publish the host's report", host=node) if t.res]
    outcome = reports[-1]["gpufleet_upgrade_report"]["outcome"]
    assert outcome.startswith("rolled back: after postcheck"), (outcome, str(result))
    log = node_exec(node, ["cat", "/var/lib/gpufleet/drain-hooks.log"]).stdout.split("\n")
    lines = [line.split(" ", 1)[1] for line in log if line.strip()]
    assert [line.split()[0] for line in lines] == ["drain", "undrain"], json.dumps(lines, indent=1)
    # The drain ran after the toolkit and the new venv were prepared (two venvs), before the switch; the undrain after
    # the rollback had put the old venv back.
    assert lines[0] == f"drain toolkit=new current={OLD_VENV} venvs=2", lines
    assert f"current={OLD_VENV} " in lines[1], lines
