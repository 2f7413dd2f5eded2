# Copyright: (c) 2026, gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""gpufleet_drain=slurm in an upgrade run, against a real Slurm cluster of the lab's nodes (lab/slurm.py).

slurmctld runs on the controller, slurmd on each of the two lab nodes (each node is the Slurm node of its name, the
default ``gpufleet_slurm_node``). Both hosts are upgraded in one batch:

* node 1 runs a job when the upgrade starts. The job goes on until it is told to end, which the test does a few
  seconds after Slurm shows the node DRAINING: the drain phase must wait for it, so the host changes only after
  the job ended, and the undrain resumes the node.
* node 2 was drained by an operator before the run (reason "fan replacement"). A check-mode run without
  gpufleet_upgrade_drained_hosts refuses it at its drain, naming the drain found and the fix; with it the run upgrades
  it, neither drains nor resumes it, and it is still drained with the operator's reason at the end.
"""

from __future__ import annotations

import datetime
import shutil
import subprocess
import threading
import time

import pytest

from lab import nodes as lab_nodes
from lab import slurm as lab_slurm

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# Seconds the job runs on after the node shows DRAINING; the drain must wait at least that long.
HOLD_S = 8
# The job's own bound, should nothing tell it to end (the run never drained the node).
JOB_CAP_S = 900
OPERATOR_REASON = "fan replacement"
RELEASE = "/tmp/gpufleet-test-job-release"
ENDED = "/tmp/gpufleet-test-job-ended"
DRAIN_TASK = "Drain the host's Slurm node"
RESUME_TASK = "Resume the host's Slurm node"


@pytest.fixture(scope="module")
def fleet(lab_fleet):
    if shutil.which("slurmctld") is None:
        pytest.skip("slurmctld is not installed (scripts/setup.sh installs Debian's slurm packages)")
    return lab_fleet(2, name="drain-slurm")


@pytest.fixture(scope="module")
def cluster(fleet):
    info = lab_slurm.start(fleet.name)
    yield info
    lab_slurm.stop(fleet.name)


def slurm(cluster, *argv):
    return subprocess.run(
        argv, capture_output=True, text=True, check=True, env={"PATH": "/usr/bin:/bin", **cluster["env"]}
    )


def node_state(cluster, node):
    """sinfo's ``state|reason`` of the node."""
    return slurm(cluster, "sinfo", "-h", "-N", "-n", node, "-o", "%T|%E").stdout.strip().splitlines()[0]


def ended_at(result, task, host):
    """When the task ended for host (ansible-runner's event time, UTC)."""
    for ev in result.events:
        data = ev.get("event_data", {})
        if ev.get("event") == "runner_on_ok" and data.get("host") == host and task in data.get("task", ""):
            return datetime.datetime.fromisoformat(ev["created"]).replace(tzinfo=datetime.timezone.utc).timestamp()
    raise AssertionError(f"no end of {task!r} for {host}")


def release_when_draining(cluster, node, stop):
    """Tell the job on ``node`` to end HOLD_S seconds after Slurm shows the node draining (a thread)."""
    while not stop.is_set():
        if node_state(cluster, node).startswith("draining"):
            stop.wait(HOLD_S)
            break
        stop.wait(0.5)
    lab_nodes.node_exec(node, ["touch", RELEASE], check=False)


def test_upgrade_waits_for_the_job_and_leaves_an_operators_drain(cluster, fleet, run_playbook):
    busy, held = fleet.nodes
    assert set(cluster["nodes"]) == {busy, held}
    slurm(cluster, "scontrol", "update", f"nodename={held}", "state=drain", f"reason={OPERATOR_REASON}")
    lab_nodes.node_exec(busy, ["rm", "-f", RELEASE, ENDED])
    # Without gpufleet_upgrade_drained_hosts the drain refuses the node an operator drained (check mode: it reads
    # Slurm, sends no command), and names the fix.
    looked = run_playbook(
        "playbooks/upgrade.yml",
        fleet.inventory,
        check=True,
        envvars={"ANSIBLE_TIMEOUT": "60", **cluster["env"]},
        extravars={"gpufleet_drain": "slurm", "gpufleet_batch_size": 2},
    )
    look = looked.task(DRAIN_TASK, host=held)
    refused = look.res
    assert look.failed and refused["drained_by"] == "other", refused
    assert f"Slurm node {held} was drained (reason '{OPERATOR_REASON}') before this run" in refused["msg"]
    assert "fix: set gpufleet_upgrade_drained_hosts=true" in refused["msg"]
    assert node_state(cluster, held) == f"drained|{OPERATOR_REASON}"
    wrap = f"for i in $(seq {JOB_CAP_S}); do [ -e {RELEASE} ] && break; sleep 1; done; date +%s.%N > {ENDED}"
    sbatch = ["sbatch", "--parsable", f"--nodelist={busy}", "--chdir=/tmp", "--output=/dev/null", "--wrap", wrap]
    job = slurm(cluster, *sbatch).stdout.strip().split(";")[0]
    stop = threading.Event()
    try:
        deadline = time.monotonic() + 30
        while slurm(cluster, "squeue", "-h", "-j", job, "-o", "%T").stdout.strip() != "RUNNING":
            assert time.monotonic() < deadline, f"the job did not start: {node_state(cluster, busy)}"
            time.sleep(0.5)
        watcher = threading.Thread(target=release_when_draining, args=(cluster, busy, stop), daemon=True)
        watcher.start()
        t0 = time.monotonic()
        result = run_playbook(
            "playbooks/upgrade.yml",
            fleet.inventory,
            envvars={"ANSIBLE_TIMEOUT": "60", **cluster["env"]},
            extravars={
                "gpufleet_drain": "slurm",
                "gpufleet_drain_timeout_s": 300,
                "gpufleet_batch_size": 2,
                "gpufleet_upgrade_drained_hosts": True,
            },
        )
    finally:
        stop.set()
        lab_nodes.node_exec(busy, ["touch", RELEASE], check=False)
    assert result.rc == 0, str(result)
    print(f"upgrade of {busy} and {held}: {time.monotonic() - t0:.1f}s")

    drained = result.task(DRAIN_TASK, host=busy).res
    assert drained["changed"] and drained["previous"]["state"] in ("mixed", "allocated"), drained
    assert drained["node_state"]["state"] == "drained" and drained["node_state"]["reason"].startswith("gpufleet ")
    assert drained["waited_s"] >= HOLD_S - 1, drained
    print(f"{busy}: the drain waited {drained['waited_s']:.1f}s for job {job}")
    assert job not in slurm(cluster, "squeue", "-h", "-o", "%i").stdout.split(), "the job still ran after the drain"
    # The job ran in node 1's container and ended before the drain did (and so before every change after it).
    job_end = float(lab_nodes.node_exec(busy, ["cat", ENDED]).stdout)
    assert job_end <= ended_at(result, DRAIN_TASK, busy)
    resumed = result.task(RESUME_TASK, host=busy).res
    assert resumed["changed"] and resumed["node_state"]["state"] == "idle", resumed
    assert node_state(cluster, busy).rstrip("*") == "idle|none"

    left = result.task(DRAIN_TASK, host=held).res
    assert not left["changed"] and "by someone else" in left["msg"] and left["waited_s"] == 0, left
    assert left["drained_by"] == "other" and drained["drained_by"] == "run"
    kept = result.task(RESUME_TASK, host=held).res
    assert not kept["changed"] and kept["node_state"]["reason"] == OPERATOR_REASON, kept
    assert node_state(cluster, held) == f"drained|{OPERATOR_REASON}"
    assert result.stats[held]["failed"] == 0 and result.stats[busy]["failed"] == 0, result.stats
