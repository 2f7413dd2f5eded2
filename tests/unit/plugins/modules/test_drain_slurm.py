# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""drain_slurm: parsing and decisions, the module against stand-in scontrol / sinfo / squeue commands, and against a
real one-node Slurm cluster (lab/slurm.py --local: Debian's slurmctld, slurmd and munge on this machine) when those
are installed.

The answers are recorded from Slurm 22.05.8 (Debian 12): sinfo --format %N|%T|%E gives the node name, the extended
state (Slurm's node_state_string in lower case, one flag character such as ``*`` for not responding) and the reason
or ``none``; squeue --format %i|%u|%j|%T|%M gives id, user, name, state and time used.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import time
from pathlib import Path

import pytest
from ansible.module_utils.testing import patch_module_args
from module_harness import Exit, Fail

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _drain_slurm as sl
from ansible_collections.gpufleet.upgrade.plugins.module_utils._drain import DrainError
from ansible_collections.gpufleet.upgrade.plugins.modules import drain_slurm

# Recorded lines (node vm) renamed per node; gpu01 is listed twice, as a node in two partitions is.
SINFO = "gpu01|mixed|none\ngpu02|drained|gpufleet r1\ngpu03|draining|gpufleet r2\ngpu04|idle*|none\ngpu01|mixed|none\n"


@pytest.mark.parametrize(
    ("node", "expected"),
    [
        ("gpu01", {"node": "gpu01", "state": "mixed", "flags": "", "reason": ""}),
        ("gpu02", {"node": "gpu02", "state": "drained", "flags": "", "reason": "gpufleet r1"}),
        ("gpu03", {"node": "gpu03", "state": "draining", "flags": "", "reason": "gpufleet r2"}),
        ("gpu04", {"node": "gpu04", "state": "idle", "flags": "*", "reason": ""}),
    ],
)
def test_parse_sinfo(node, expected):
    assert sl.parse_sinfo(SINFO, node) == expected


def test_unknown_node_names_the_fix():
    with pytest.raises(DrainError, match=r"does not know node 'gpu9'.*gpufleet_slurm_node"):
        sl.parse_sinfo(SINFO, "gpu9")


def test_parse_squeue():
    jobs = sl.parse_squeue("2|root|wrap|RUNNING|0:05\n4712|bob|eval run|RUNNING|1:02:03\n")
    assert [j["id"] for j in jobs] == ["2", "4712"] and jobs[1]["name"] == "eval run" and jobs[0]["time"] == "0:05"


def view(state, reason=""):
    return {"node": "gpu01", "state": state, "flags": "", "reason": reason}


@pytest.mark.parametrize(
    ("want", "state", "reason", "action"),
    [
        ("drained", "idle", "", "drain"),
        ("drained", "mixed", "", "drain"),
        ("drained", "allocated", "", "drain"),
        ("drained", "draining", "gpufleet r1", None),
        ("drained", "drained", "disk replacement", None),
        ("resumed", "drained", "gpufleet r1", "resume"),
        ("resumed", "draining", "gpufleet r0", "resume"),
        ("resumed", "drained", "disk replacement", None),
        ("resumed", "idle", "", None),
        # down for a hardware ticket: neither drained over (its reason kept) nor resumed
        ("drained", "down", "GPU 3 fell off the bus", None),
        ("resumed", "down", "GPU 3 fell off the bus", None),
        ("drained", "fail", "PSU", None),
    ],
)
def test_plan(want, state, reason, action):
    assert sl.plan(want, view(state, reason))[0] == action


def test_someone_elses_drain_is_reported():
    assert "by someone else (reason 'disk replacement')" in sl.plan("resumed", view("drained", "disk replacement"))[1]


def test_argv():
    assert sl.drain_argv("gpu01", "gpufleet r1") == [
        "scontrol",
        "update",
        "nodename=gpu01",
        "state=drain",
        "reason=gpufleet r1",
    ]
    assert sl.resume_argv("gpu01") == ["scontrol", "update", "nodename=gpu01", "state=resume"]


# --------------------------------------------------------------------------- the module, with stand-in commands

STANDIN = r'''#!PYTHON
"""Stand-in for sinfo / scontrol / squeue over a JSON state file (SLURM_STANDIN)."""
import json, os, sys
path = os.environ["SLURM_STANDIN"]
st = json.load(open(path))
tool, args = os.path.basename(sys.argv[0]), sys.argv[1:]
st.setdefault("calls", []).append([tool] + args)
node = st["node"]
if tool == "sinfo":
    # Each look lets one running job end, as time would.
    if st["jobs"] and st["state"] == "draining" and st.get("ends_jobs", True):
        st["jobs"].pop(0)
        if not st["jobs"]:
            st["state"] = "drained"
    if "--nodes=" + st["name"] in args:
        print(f"{st['name']}|{st['state']}|{st['reason'] or 'none'}")
elif tool == "squeue":
    for j in st["jobs"]:
        print("|".join(j))
elif tool == "scontrol":
    want = args[2]
    if want == "state=drain":
        st["reason"] = args[3].split("=", 1)[1]
        st["state"] = "draining" if st["jobs"] else "drained"
    elif want == "state=resume":
        st["reason"] = ""
        st["state"] = "mixed" if st["jobs"] else "idle"
json.dump(st, open(path, "w"))
'''


@pytest.fixture
def cluster(tmp_path, monkeypatch):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for tool in ("sinfo", "scontrol", "squeue"):
        exe = bindir / tool
        exe.write_text(STANDIN.replace("PYTHON", sys.executable))
        exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    state = tmp_path / "slurm.json"
    monkeypatch.setenv("SLURM_STANDIN", str(state))
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")

    def setup(**kw):
        doc = {"node": "gpu01", "name": "gpu01", "state": "mixed", "reason": "", "jobs": [], **kw}
        state.write_text(json.dumps(doc))
        return lambda: json.loads(state.read_text())

    return setup


def call(args, check=False, diff=False):
    args = dict({"node": "gpu01", "host": "gpu01.lab", "interval_s": 0.01, "timeout_s": 2}, **args)
    args.update(_ansible_check_mode=check, _ansible_diff=diff)
    with patch_module_args(args), pytest.raises((Exit, Fail)) as info:
        drain_slurm.main()
    return info.type is Exit, info.value.args[0]


def updates(now):
    return [c for c in now()["calls"] if c[0] == "scontrol"]


def test_drain_waits_for_jobs_then_resumes(cluster):
    now = cluster(state="mixed", jobs=[["4711", "alice", "train", "RUNNING", "1:00"]] * 2)
    ok, res = call({"run_id": "r1"})
    assert ok and res["changed"] and res["node_state"]["state"] == "drained", res
    assert res["previous"]["state"] == "mixed" and res["jobs"] == []
    assert updates(now) == [["scontrol", "update", "nodename=gpu01", "state=drain", "reason=gpufleet r1"]]
    ok, again = call({"run_id": "r1"})
    assert ok and not again["changed"]
    ok, back = call({"state": "resumed"})
    assert ok and back["changed"] and now()["state"] == "idle" and now()["reason"] == ""


def test_drain_timeout_names_host_and_jobs(cluster):
    now = cluster(state="allocated", jobs=[["4711", "alice", "train", "RUNNING", "1:02:03"]], ends_jobs=False)
    ok, res = call({"run_id": "r1", "timeout_s": 0.1})
    assert not ok
    assert res["msg"].startswith("gpu01.lab: Slurm node gpu01 is still draining after")
    assert "job 4711 (alice, train, RUNNING, 1:02:03)" in res["msg"] and "gpufleet_drain_timeout_s" in res["msg"]
    # The rollback's resume finds gpufleet's reason and puts the node back.
    ok, back = call({"state": "resumed"})
    assert ok and back["changed"] and now()["state"] == "mixed"


def test_someone_elses_drain_stays_drained_after_the_run(cluster):
    now = cluster(state="drained", reason="disk replacement")
    ok, res = call({"run_id": "r1"})
    assert ok and not res["changed"] and "someone else" in res["msg"]
    ok, back = call({"state": "resumed"})
    assert ok and not back["changed"] and "left drained" in back["msg"]
    assert updates(now) == [] and now()["reason"] == "disk replacement"


@pytest.mark.parametrize(("state", "reason"), [("drained", "fan replacement"), ("down", "GPU 3 fell off the bus")])
def test_a_node_found_out_of_service_is_refused_unless_told_and_never_put_back(cluster, state, reason):
    now = cluster(state=state, reason=reason)
    ok, res = call({"run_id": "r1", "found_drained": "refuse"})
    assert not ok and not res["changed"] and res["drained_by"] == "other", res
    assert res["msg"] == (
        f"gpu01.lab: Slurm node gpu01 was {state} (reason {reason!r}) before this run, not by gpufleet; it stays so"
        " and is not upgraded (nothing was drained or undrained); fix: set gpufleet_upgrade_drained_hosts=true to"
        " upgrade it anyway (it stays out of service after the upgrade and after a rollback), or put it back into"
        " service first"
    )
    ok, res = call({"run_id": "r1", "found_drained": "upgrade"})
    assert ok and not res["changed"] and res["drained_by"] == "other" and res["waited_s"] == 0
    ok, back = call({"state": "resumed"})
    assert ok and not back["changed"]
    assert updates(now) == [] and now()["state"] == state and now()["reason"] == reason


def test_drained_by_says_who_took_the_node_out(cluster):
    cluster(state="idle")
    assert call({"run_id": "r1", "found_drained": "refuse"})[1]["drained_by"] == "run"
    assert call({"run_id": "r1", "found_drained": "refuse"})[1]["drained_by"] == "gpufleet"
    assert call({"state": "resumed"})[1]["drained_by"] == ""


def test_a_killed_runs_drain_is_resumed(cluster):
    now = cluster(state="drained", reason="gpufleet r0")
    ok, back = call({"state": "resumed"})
    assert ok and back["changed"] and now()["state"] == "idle"


def test_check_mode_runs_no_update(cluster):
    now = cluster(state="idle")
    ok, res = call({"run_id": "r1"}, check=True, diff=True)
    assert ok and res["changed"] and res["diff"]["after"] == "gpu01: draining gpufleet r1\n", res
    assert updates(now) == [] and now()["state"] == "idle"


def test_unknown_node_fails_with_the_fix(cluster):
    cluster(name="gpu77")
    ok, res = call({})
    assert not ok and "gpu01.lab: Slurm does not know node 'gpu01'" in res["msg"]


# --------------------------------------------------------------------------- a real Slurm (lab/slurm.py)


@pytest.fixture(scope="module")
def real_slurm():
    import shutil
    import subprocess

    if shutil.which("slurmctld") is None or shutil.which("slurmd") is None:
        pytest.skip("slurmctld/slurmd are not installed (apt-get install slurmctld slurmd slurm-client munge)")
    repo = str(Path(__file__).resolve().parents[4])
    if repo not in sys.path:
        sys.path.insert(0, repo)
    from lab import slurm as lab_slurm

    name = f"unit-slurm-{os.getpid()}"
    try:
        info = lab_slurm.start(name, local=True)
    except (RuntimeError, subprocess.CalledProcessError) as exc:
        lab_slurm.stop(name)
        pytest.fail(f"the one-node Slurm cluster did not start: {exc}")
    yield info
    lab_slurm.stop(name)


def test_real_slurm_drain_waits_for_a_job_and_resumes(real_slurm, monkeypatch):
    import subprocess

    for key, value in real_slurm["env"].items():
        monkeypatch.setenv(key, value)
    node = real_slurm["node"]
    job = subprocess.run(
        ["sbatch", "--parsable", "--output=/dev/null", "--wrap", "sleep 4"], capture_output=True, text=True, check=True
    )
    job_id = job.stdout.strip().split(";")[0]
    deadline = time.monotonic() + 20
    squeue = ["squeue", "-h", "-j", job_id, "-o", "%T"]
    while "RUNNING" not in subprocess.run(squeue, capture_output=True, text=True, check=False).stdout:
        assert time.monotonic() < deadline, "the job did not start"
        time.sleep(0.2)
    t0 = time.monotonic()
    ok, res = call({"node": node, "host": node, "run_id": "r1", "timeout_s": 30, "interval_s": 0.5})
    assert ok and res["changed"], res
    assert res["previous"]["state"] in ("allocated", "mixed") and res["node_state"]["state"] == "drained", res
    assert time.monotonic() - t0 > 1.0, "DRAINED before the running job ended"
    ok, back = call({"node": node, "host": node, "state": "resumed"})
    assert ok and back["changed"] and back["node_state"]["state"] == "idle", back
    subprocess.run(["scontrol", "update", f"nodename={node}", "state=drain", "reason=disk replacement"], check=True)
    ok, res = call({"node": node, "host": node, "run_id": "r2"})
    assert ok and not res["changed"] and "someone else" in res["msg"], res
    ok, back = call({"node": node, "host": node, "state": "resumed"})
    assert ok and not back["changed"] and back["node_state"]["reason"] == "disk replacement", back
    subprocess.run(["scontrol", "update", f"nodename={node}", "state=resume"], check=True)


def test_out_of_service_reads_drains_downs_and_silence():
    text = "g1|idle|none\ng2|down*|GPU 3 fell off the bus\ng3|drained|gpufleet r1\ng4|mixed*|none\ng5|allocated|none\n"
    assert sl.nodes_view(text) == {
        "g1": "",
        "g2": "Slurm down (GPU 3 fell off the bus)",
        "g3": "Slurm drained (gpufleet r1)",
        "g4": "Slurm: not responding",
        "g5": "",
    }
    assert sl.sinfo_all_argv(["g1", "g2"])[3] == "--nodes=g1,g2" and "--nodes" not in " ".join(sl.sinfo_all_argv())


def test_query_reads_without_changing(cluster):
    now = cluster(state="down", reason="PSU")
    ok, res = call({"state": "query", "nodes": ["gpu01"], "node": None})
    assert ok and not res["changed"] and res["out_of_service"] == {"gpu01": "Slurm down (PSU)"}, res
    assert updates(now) == []
