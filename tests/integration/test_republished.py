# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A wheel republished under the same file name with other bytes does not move a host without a lock file.

One lab node is upgraded without a lock file (the run plans, and the host records the lock it applied). The index
then republishes lab-sgl-kernel 0.3.21+cu130: the same file name and version, other bytes (as sgl-kernel's cu130
index did five times for one file). A plain re-run refuses the host before anything changes, naming "republished"
and both sha256, with the fix; the host keeps its venv, its current link and its server. With
gpufleet_accept_new_plan=true the run takes the new plan and the host runs the republished bytes.

The indexes are private copies (lab.mirrors.index_copies), so the republished wheel changes nothing for other tests.
"""

from __future__ import annotations

import hashlib
import time

import pytest

from lab import wheels as lab_wheels
from lab.mirrors import index_copies

pytestmark = [pytest.mark.integration, pytest.mark.slow]

KERNEL = "0.3.21+cu130"
WHEEL = f"lab_sgl_kernel-{KERNEL}-py3-none-any.whl"
SERVING = "/opt/gpufleet/serving"
REFUSE_TASK = "Refuse to move a host off its lock because an index changed"


@pytest.fixture(scope="module")
def fleet(lab_fleet):
    return lab_fleet(1, name="republished")


@pytest.fixture(scope="module")
def indexes(tmp_path_factory, lab_mirrors):
    with index_copies(tmp_path_factory.mktemp("indexes"), "republished") as servers:
        yield servers


def sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def republish_kernel(indexes, work) -> tuple[str, str]:
    """lab-sgl-kernel 0.3.21+cu130 built again with other bytes over the index's file of the same name; the old and
    the new sha256."""
    root = indexes["lab-main"].root
    old = sha256(root / WHEEL)
    spec = lab_wheels.load_catalog()["projects"]["lab-sgl-kernel"]
    build = {
        "version": KERNEL,
        "requires": ["lab-torch==2.11.0"],
        "info": {"cuda": "13.0", "torch": "2.11.0", "republished": "second upload"},
    }
    wheel = lab_wheels._build_one("lab-sgl-kernel", spec, build, root, work)
    assert wheel.name == WHEEL
    new = sha256(wheel)
    assert new != old
    return old, new


def upgrade(run_playbook, fleet, indexes, **extra):
    extravars = {"gpufleet_index_urls": {name: s.url for name, s in indexes.items()}, "gpufleet_batch_size": 1, **extra}
    return run_playbook("playbooks/upgrade.yml", fleet.inventory, extravars=extravars)


def report(result, node):
    return result.task("Publish the host's report", node).res["ansible_facts"]["gpufleet_upgrade_report"]


def host_view(node_exec, node) -> dict:
    """What a refused run must leave as it was: current, the venvs, the lock record, the server's pid."""

    def out(cmd):
        return node_exec(node, cmd, check=True).stdout.strip()

    return {
        "current": out(f"readlink -f {SERVING}/current"),
        "venvs": out(f"ls {SERVING}/venvs"),
        "lock": out('python3 -c \'import json; print(json.load(open("/var/lib/gpufleet/state.json"))["lock"])\''),
        "pid": out("systemctl show -p MainPID --value gpufleet-serving"),
    }


def republished_info(node_exec, node) -> str:
    code = "from lab_sgl_kernel._build_info import INFO; print(INFO.get('republished'))"
    return node_exec(node, f'{SERVING}/current/bin/python -c "{code}"', check=True).stdout.strip()


@pytest.fixture(scope="module")
def scenario(fleet, indexes, tmp_path_factory):
    from lab.harness import run_playbook
    from lab.nodes import node_exec

    node = fleet.nodes[0]
    out = {"node": node, "seconds": {}}

    def timed(key, **extra):
        start = time.monotonic()
        result = upgrade(run_playbook, fleet, indexes, **extra)
        out["seconds"][key] = round(time.monotonic() - start, 1)
        return result

    out["first"] = timed("upgrade")
    assert out["first"].rc == 0, out["first"]
    out["before"] = host_view(node_exec, node)
    out["old_sha"], out["new_sha"] = republish_kernel(indexes, tmp_path_factory.mktemp("republish"))
    out["refused"] = timed("rerun_refused")
    out["after_refusal"] = host_view(node_exec, node)
    # The post-check's return gate holds the restart to the first upgrade's time (wall clock): on a loaded lab machine
    # it judges the load, which is not what this test is about.
    out["accepted"] = timed("rerun_accepted", gpufleet_accept_new_plan=True, postcheck_return_max_ratio=100)
    out["after_accept"] = host_view(node_exec, node)
    out["kernel_info"] = republished_info(node_exec, node)
    print("\nrepublished scenario seconds:", out["seconds"])
    return out


def test_a_plain_rerun_refuses_naming_republished_and_both_hashes_and_changes_nothing(scenario):
    refused, node = scenario["refused"], scenario["node"]
    assert report(scenario["first"], node)["outcome"] == "upgraded"
    assert refused.rc != 0, refused
    msg = refused.task(REFUSE_TASK, node).res["msg"]
    assert f"lab-sgl-kernel {KERNEL} republished ({WHEEL}: the same file name with other bytes" in msg, msg
    assert f"sha256 {scenario['old_sha']} -> {scenario['new_sha']}" in msg, msg
    assert "-e gpufleet_lock_file=<file>" in msg and "-e gpufleet_accept_new_plan=true" in msg, msg
    assert msg.endswith("Nothing was changed"), msg
    outcome = report(refused, node)["outcome"]
    assert outcome.startswith("failed preflight: ") and "the indexes changed since this host's lock" in outcome
    # The run's summary carries the whole refusal, its fix included.
    assert "-e gpufleet_accept_new_plan=true. Nothing was changed" in outcome, outcome
    # Refused in the assess phase: no phase that changes the host ran.
    assert not refused.tasks("Pull the locked wheels, build the new venv and verify it", node)
    assert scenario["after_refusal"] == scenario["before"]


def test_accepting_the_new_plan_moves_the_host_to_the_republished_bytes(scenario):
    accepted, node = scenario["accepted"], scenario["node"]
    assert accepted.rc == 0, accepted
    assert accepted.task(REFUSE_TASK, node).status == "skipped"
    assert report(accepted, node)["outcome"] == "upgraded"
    assert scenario["after_accept"]["current"] != scenario["before"]["current"]
    assert scenario["kernel_info"] == "second upload"
