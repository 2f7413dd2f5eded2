# Copyright: (c) 2026, gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""gpufleet_drain=slurm in an upgrade run: a job on the node must end before the host changes.

A real one-node Slurm cluster runs on the controller (lab/slurm.py); its node stands in for the lab host's node
(gpufleet_slurm_node), since the lab's nodes run no slurmd yet. A job is running on it when the upgrade starts; the
drain phase waits until Slurm says DRAINED (the job ended), the host is upgraded, and the undrain resumes the node.
"""

from __future__ import annotations

import datetime
import shutil
import subprocess
import time

import pytest

from lab import slurm as lab_slurm

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# Long enough to be still running when the drain phase starts (after preflight, assess, backup, the toolkit install
# and the new venv's build: about a minute and a half on a loaded 2-core machine).
JOB_S = 180


@pytest.fixture(scope="module")
def cluster():
    if shutil.which("slurmctld") is None:
        pytest.skip("slurmctld is not installed (scripts/setup.sh installs Debian's slurm packages)")
    info = lab_slurm.start("drain-slurm")
    yield info
    lab_slurm.stop("drain-slurm")


@pytest.fixture(scope="module")
def fleet(lab_fleet):
    return lab_fleet(1, name="drain-slurm")


def slurm(cluster, *argv):
    return subprocess.run(
        argv, capture_output=True, text=True, check=True, env={"PATH": "/usr/bin:/bin", **cluster["env"]}
    )


def ended_at(result, task, host):
    """When the task ended for host (ansible-runner's event time, UTC)."""
    for ev in result.events:
        data = ev.get("event_data", {})
        if ev.get("event") == "runner_on_ok" and data.get("host") == host and task in data.get("task", ""):
            return datetime.datetime.fromisoformat(ev["created"]).replace(tzinfo=datetime.timezone.utc).timestamp()
    raise AssertionError(f"no end of {task!r} for {host}")


def test_upgrade_waits_for_the_running_job_then_resumes(cluster, fleet, run_playbook, tmp_path):
    node = cluster["node"]
    done = tmp_path / "job-ended"
    wrap = f"sleep {JOB_S}; date +%s.%N > {done}"
    job = slurm(cluster, "sbatch", "--parsable", "--output=/dev/null", "--wrap", wrap).stdout.strip().split(";")[0]
    deadline = time.monotonic() + 30
    while slurm(cluster, "squeue", "-h", "-j", job, "-o", "%T").stdout.strip() != "RUNNING":
        assert time.monotonic() < deadline, "the job did not start"
        time.sleep(0.5)
    result = run_playbook(
        "playbooks/upgrade.yml",
        fleet.inventory,
        envvars={"ANSIBLE_TIMEOUT": "60", **cluster["env"]},
        extravars={"gpufleet_drain": "slurm", "gpufleet_slurm_node": node, "gpufleet_drain_timeout_s": 240},
    )
    assert result.rc == 0, str(result)
    host = fleet.nodes[0]
    drained = result.task("Drain the host's Slurm node", host=host).res
    assert drained["changed"] and drained["previous"]["state"] in ("mixed", "allocated"), drained
    assert drained["node_state"]["state"] == "drained" and drained["node_state"]["reason"].startswith("gpufleet ")
    assert drained["waited_s"] > 5, drained
    assert job not in slurm(cluster, "squeue", "-h", "-o", "%i").stdout.split(), "the job still ran after the drain"
    # The drain (and so every change after it) ended after the job did.
    assert float(done.read_text()) <= ended_at(result, "Drain the host's Slurm node", host)
    resumed = result.task("Resume the host's Slurm node", host=host).res
    assert resumed["changed"] and resumed["node_state"]["state"] == "idle", resumed
    state = slurm(cluster, "sinfo", "-h", "-N", "-n", node, "-o", "%T|%E").stdout.split()[0]
    assert state.rstrip("*") == "idle|none", state
