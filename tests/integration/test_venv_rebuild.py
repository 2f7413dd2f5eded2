# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Role venv_rebuild on two lab nodes in the OLD state (lab-cu128-seed venv, serving unit running from it).

Order matters (one fleet for the module): check mode and every bad input first — each must leave the old venv
untouched and still serving — then the real run (switch, restart, fetch economy), then the four-step pattern's
second half (check mode and apply again report no change).
"""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from lab.common import free_port
from lab.mirrors import PrivateServer

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
PLAYBOOK = "tests/integration/playbooks/venv_rebuild.yml"
SERVING = "/opt/gpufleet/serving"
SEED = f"{SERVING}/venvs/lab-cu128-seed"
UNIT = "gpufleet-serving"


@pytest.fixture(scope="module")
def fleet(lab_fleet):
    return lab_fleet(2, name="venv-it")


@pytest.fixture(scope="module")
def controller_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("controller")


def server_info(port: int, timeout: float = 60) -> dict:
    deadline = time.time() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/get_server_info", timeout=5) as resp:
                return json.loads(resp.read())["gpufleet_lab"]
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(0.5)


def snapshot(node_exec, node: str) -> dict:
    """What must not move: current's target, the seed venv's files (name, size, mtime), the unit's pid."""
    tree = node_exec(node, f"find {SEED} -printf '%P %s %T@\\n' | sort | sha256sum", check=True).stdout.split()[0]
    return {
        "current": node_exec(node, f"readlink -f {SERVING}/current", check=True).stdout.strip(),
        "seed_tree": tree,
        "pid": node_exec(node, f"systemctl show -p MainPID --value {UNIT}", check=True).stdout.strip(),
    }


def profile_file(tmp_path: Path, edit) -> str:
    data = yaml.safe_load((REPO / "stacks" / "lab.yml").read_text())
    edit(data)
    path = tmp_path / "lab-bad.yml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


@pytest.fixture(scope="module")
def private_main(tmp_path_factory, lab_mirrors):
    """A private copy of lab-main (same wheels, PEP 691 JSON on) whose access log only this test writes to."""
    log = tmp_path_factory.mktemp("private-main") / "access.jsonl"
    args = ["--kind", "pypi", "--root", str(REPO / ".lab" / "mirrors" / "lab-main"), "--pep691"]
    with PrivateServer("venv-private-main", args, "/simple", log) as server:
        yield {"url": server.url, "log": log}


@pytest.fixture(scope="module")
def before(fleet):
    from lab.nodes import node_exec

    return {node: snapshot(node_exec, node) for node in fleet.nodes}


def assert_untouched(fleet, node_exec, before):
    for node in fleet.nodes:
        assert snapshot(node_exec, node) == before[node], node
        info = server_info(fleet.serving_port(node))
        assert info["distributions"]["lab-torch"] == "2.9.1+cu128"


def test_check_mode_on_old_hosts_shows_the_package_diff_and_changes_nothing(
    fleet, before, run_playbook, node_exec, controller_dir
):
    assert before[fleet.nodes[0]]["current"] == SEED
    res = run_playbook(
        PLAYBOOK, fleet.inventory, {"gpufleet_controller_dir": str(controller_dir)}, check=True, diff=True
    )
    assert res.rc == 0, res
    diff = res.task("Compare the current venv with the lock", fleet.nodes[0])
    assert diff.changed
    text = json.dumps(diff.res)
    assert "lab-torch==2.9.1+cu128" in text and "lab-torch==2.11.0+cu130" in text
    assert res.task("Pull the locked wheels, build the new venv and verify it", fleet.nodes[0]).changed
    assert res.task("Switch current to the new venv (a new link renamed over the old one)", fleet.nodes[0]).changed
    assert not (controller_dir / "locks").exists()  # check mode writes no lock
    assert_untouched(fleet, node_exec, before)
    listing = node_exec(fleet.nodes[0], f"ls {SERVING}/venvs", check=True).stdout.split()
    assert listing == ["lab-cu128-seed"]


BAD_INPUTS = {
    "not enough disk": ({"venv_rebuild_disk_factor": 10**9}, None, "not enough disk under /opt/gpufleet/serving"),
    "index unreachable": (
        {"gpufleet_index_urls": {"lab-main": f"http://127.0.0.1:{free_port()}/simple"}},
        None,
        "index 'lab-main'",
    ),
    "no build satisfies the spec": (
        {},
        lambda p: p["wheels"]["packages"][5].update(spec="==0.9.9"),
        "no build of lab-sglang satisfies spec ==0.9.9",
    ),
    "stale-only source": (
        {},
        lambda p: [pkg.update(indexes=["lab-stale"]) for pkg in p["wheels"]["packages"][1:4]],
        "stale source 'lab-stale'",
    ),
    "mismatched flashinfer trio": (
        {},
        lambda p: [
            p["wheels"]["packages"][1].update(spec="==0.6.4"),
            p["wheels"]["packages"][3].update(
                spec="==0.2.14", indexes=["lab-main"], local_tag="cu128", allow_stale=True
            ),
        ],
        "no version common to the same-version group",
    ),
    "host without the profile's Python": ({}, lambda p: p["python"].update(version="3.13"), "/usr/bin/python3.13"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_fails_clearly_and_the_old_venv_keeps_serving(case, fleet, before, run_playbook, node_exec, tmp_path):
    extra, edit, expected = BAD_INPUTS[case]
    extra = {"gpufleet_controller_dir": str(tmp_path / "controller"), **extra}
    if edit:
        extra["gpufleet_stack_profile"] = profile_file(tmp_path, edit)
    res = run_playbook(PLAYBOOK, fleet.inventory, extra)
    assert res.rc != 0, res
    failed = [r for rs in res.results.values() for r in rs if r.failed]
    assert failed, res
    assert any(expected in r.msg for r in failed), [r.msg for r in failed]
    assert_untouched(fleet, node_exec, before)


@pytest.mark.parametrize("distribution", ["pull", "push"])
def test_hash_mismatch_on_the_host_fails_before_any_switch(
    distribution, fleet, before, run_playbook, node_exec, tmp_path, controller_dir
):
    # A lock whose sha256 for one wheel is not the file's (the index listed a stale hash): pulled, the host's download
    # is refused by its checksum; pushed, uv refuses the copy. Either way nothing is installed or switched.
    ctl = {"gpufleet_controller_dir": str(tmp_path / "ctl"), "gpufleet_distribution": distribution}
    first = run_playbook(PLAYBOOK, fleet.inventory, dict(ctl, venv_rebuild_switch=False))
    assert first.rc == 0, first
    lock = first.task("Plan the serving wheels once", fleet.nodes[0]).res["lock"]
    bad = json.loads(json.dumps(lock))
    bad["packages"][0]["sha256"] = "0" * 64
    bad["venv_name"] = "lab-tampered"
    res = run_playbook(PLAYBOOK, fleet.inventory, dict(ctl, gpufleet_wheel_lock=bad))
    assert res.rc != 0, res
    failed = [r for rs in res.results.values() for r in rs if r.failed]
    refused = [
        r for r in failed if r.task.endswith("Fail when the new venv could not be built or did not pass its checks")
    ]
    assert len(refused) == len(fleet.nodes), [(r.task, r.msg) for r in failed]
    msg = refused[0].msg
    if distribution == "push":
        assert "failed at step sync" in msg and "Hash mismatch" in msg, msg
    else:
        assert "failed at step fetch" in msg, msg
        assert "checksum" in msg and "did not match" in msg and bad["packages"][0]["filename"] in msg, msg
    for node in fleet.nodes:
        assert node_exec(node, f"readlink -f {SERVING}/current", check=True).stdout.strip() == SEED
        node_exec(node, f"rm -rf {SERVING}/venvs/lab-tampered {SERVING}/venvs/{lock['venv_name']}", check=True)
    assert_untouched(fleet, node_exec, before)


def test_apply_switches_and_the_unit_runs_from_the_new_venv(
    fleet, before, run_playbook, node_exec, controller_dir, lab_mirrors, private_main
):
    urls = {"lab-main": private_main["url"], "lab-stale": lab_mirrors.urls["lab-stale"]}
    res = run_playbook(
        PLAYBOOK, fleet.inventory, {"gpufleet_controller_dir": str(controller_dir), "gpufleet_index_urls": urls}
    )
    assert res.rc == 0, res
    lock = json.loads(next((controller_dir / "locks").glob("lab-*.json")).read_text())
    new = f"{SERVING}/venvs/{lock['venv_name']}"
    for node in fleet.nodes:
        after = snapshot(node_exec, node)
        assert after["current"] == new
        assert after["seed_tree"] == before[node]["seed_tree"]  # the old venv was never modified
        assert after["pid"] != before[node]["pid"]  # restarted by the handler
        info = server_info(fleet.serving_port(node))
        assert info["distributions"] == {e["name"]: e["version"] for e in lock["packages"]}
        assert info["distributions"]["lab-flashinfer-jit-cache"] == "0.6.4+cu130"
        cmdline = node_exec(node, f"tr '\\0' ' ' < /proc/{after['pid']}/cmdline", check=True).stdout
        assert cmdline.startswith(f"{SERVING}/current/bin/python -m lab_sglang")
        assert node_exec(node, f"test -d {SEED}", check=False).returncode == 0
    # The plan read upload times from PEP 691/700 JSON here (the private index speaks it).
    assert {c["date_source"] for c in lock["report"]["lab-torch"]["candidates"]} == {"upload-time"}
    # Fetch economy: two hosts, yet every locked wheel left the index in full exactly once, and nothing else did.
    full = {}
    for line in private_main["log"].read_text().splitlines():
        req = json.loads(line)
        if req["path"].startswith("/packages/") and req["method"] == "GET" and req["status"] == 200:
            name = req["path"].rsplit("/", 1)[-1]
            full[name] = full.get(name, 0) + 1
    assert full == {e["filename"]: 1 for e in lock["packages"] + lock["tools"]}


def test_second_run_and_check_mode_report_no_change(fleet, run_playbook, node_exec, controller_dir):
    pids = {n: snapshot(node_exec, n)["pid"] for n in fleet.nodes}
    for check in (True, False):
        res = run_playbook(PLAYBOOK, fleet.inventory, {"gpufleet_controller_dir": str(controller_dir)}, check=check)
        assert res.rc == 0, res
        assert [r.task for r in res.changed_tasks()] == [], res
    assert {n: snapshot(node_exec, n)["pid"] for n in fleet.nodes} == pids
