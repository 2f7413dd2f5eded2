# Copyright: (c) 2026, gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The collection under Mitogen for Ansible (docs/awx.md section 5), on one lab host: upgrade.yml, then
audit.yml --check, then rollback.yml, each with Mitogen's linear strategy (``ANSIBLE_STRATEGY=mitogen_linear`` from
the installed ansible_mitogen's plugin folder).

Each run is judged by what it did: the upgrade's report.json says the host upgraded and ``current`` points at the
venv it built, serving the new stack; the audit finds the host in sync with nothing changed; the rollback's
report.json says the host was restored, ``current`` back on the seed venv and the old stack serving. And each run
must have gone through Mitogen: a Mitogen interpreter (``python3(mitogen:…)``, what Mitogen's first stage execs)
ran on that host while it lasted (lab.mitogen.Trace); under the default strategy none does, and the test fails.

Skipped, saying why, where mitogen is not installed or the installed ansible-core is outside the range that
mitogen's own package declares (lab.mitogen.unsupported). Nothing in the collection depends on Mitogen.

In ``make integration`` (CI), not ``-m long``: a CI module must stay within about 120 s on the 2-core lab machine,
and this one (lab up, the three runs, lab down) took 88.5 s and 124.9 s there beside other labs (load average 4.6 to
6.5, about what three xdist workers of ``make integration`` make), 144.3 s at load 10; its parts run one by one on
the quiet machine add up to about 70 s (lab up 7 s, upgrade 45 s, audit 3 s, rollback 14 s). The same runs under the
default strategy take longer: Mitogen's wall is 0.74 times the default's (bench/mitogen.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lab import mitogen

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CURRENT = "/opt/gpufleet/serving/current"
OLD_VENV = "/opt/gpufleet/serving/venvs/lab-cu128-seed"
OLD_SGLANG, NEW_SGLANG = "0.5.3", "0.5.9"
OLD_CUDA, NEW_CUDA = "/usr/local/cuda-12.8", "/usr/local/cuda-13.0"
# The lab shares two cores with other work: give SSH room so a busy machine is not an unreachable host.
SLOW_SSH = {"ANSIBLE_TIMEOUT": "60", "ANSIBLE_SSH_RETRIES": "3"}


@pytest.fixture(scope="module")
def mitogen_env():
    reason = mitogen.unsupported()
    if reason:
        pytest.skip(reason)
    return {**SLOW_SSH, **mitogen.strategy_env()}


@pytest.fixture(scope="module")
def fleet(mitogen_env, lab_fleet):
    return lab_fleet(1, name="mitogen")


def sh(node_exec, node, script):
    return node_exec(node, ["sh", "-c", script], check=True).stdout.strip()


def served(fleet, node_exec, node):
    """The lab-sglang release and the CUDA_HOME the running server loaded."""
    raw = sh(node_exec, node, f"curl -fsS --max-time 10 http://127.0.0.1:{fleet.serving_port(node)}/get_server_info")
    info = json.loads(raw)["gpufleet_lab"]
    return info["distributions"]["lab-sglang"], info["cuda_home"]


def under_mitogen(run_playbook, mitogen_env, fleet, playbook, **kw):
    """Run ``playbook`` over the fleet with Mitogen's strategy; fail unless a Mitogen interpreter served the host."""
    node = fleet.nodes[0]
    with mitogen.Trace(node) as trace:
        result = run_playbook(playbook, fleet.inventory, envvars=mitogen_env, **kw)
    assert result.rc == 0, result
    assert trace.seen, f"no Mitogen interpreter ran on {node} during {playbook}: the run did not use Mitogen\n{result}"
    return result


def host_record(result, node):
    """The host's entry in the run's report.json."""
    facts = result.task("Publish the host's report", node).res["ansible_facts"]
    doc = json.loads((Path(facts["gpufleet_run_dir"]) / "report.json").read_text())
    return next(h for h in doc["hosts"] if h["host"] == node)


def test_upgrade_under_mitogen(fleet, run_playbook, mitogen_env, node_exec):
    node = fleet.nodes[0]
    assert sh(node_exec, node, f"readlink -f {CURRENT}") == OLD_VENV
    result = under_mitogen(
        run_playbook, mitogen_env, fleet, "playbooks/upgrade.yml", extravars={"gpufleet_batch_size": 1}
    )
    record = host_record(result, node)
    assert (record["outcome_kind"], record["ok"]) == ("upgraded", True), record
    built = sh(node_exec, node, f"readlink -f {CURRENT}")
    assert built != OLD_VENV and sh(node_exec, node, f"cat {built}/.gpufleet-verified"), built
    assert served(fleet, node_exec, node) == (NEW_SGLANG, NEW_CUDA)


def test_audit_under_mitogen_finds_the_host_in_sync(fleet, run_playbook, mitogen_env):
    node = fleet.nodes[0]
    audit = under_mitogen(run_playbook, mitogen_env, fleet, "playbooks/audit.yml", check=True)
    verdict = audit.audit_reports()[node]
    assert verdict["in_sync"] and verdict["drift"] == [], verdict
    assert audit.stats[node]["changed"] == 0 and audit.changed_tasks(node) == [], audit.stats


def test_rollback_under_mitogen_serves_the_old_stack(fleet, run_playbook, mitogen_env, node_exec):
    node = fleet.nodes[0]
    result = under_mitogen(run_playbook, mitogen_env, fleet, "playbooks/rollback.yml")
    record = host_record(result, node)
    assert (record["outcome_kind"], record["ok"]) == ("restored", True), record
    assert record["outcome"].startswith("rolled back to backup"), record["outcome"]
    assert sh(node_exec, node, f"readlink -f {CURRENT}") == OLD_VENV
    assert served(fleet, node_exec, node) == (OLD_SGLANG, OLD_CUDA)
