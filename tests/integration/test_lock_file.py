# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fleet's desired state is a reviewed lock file, on one lab node and private copies of the lab indexes.

After an upgrade, the index publishes a newer kernel build that satisfies the profile (as an index does every day).
Nothing changes because of it: the audit still finds the host in sync (it judges against the lock the upgrade
recorded on the host), a re-run with the upgrade's lock file changes nothing and asks no index anything (the private
indexes' access logs stay empty). plan.yml then shows exactly that build in its diff (--check writes nothing), and
applying the new lock file upgrades the host to it. A lock file made for another profile, or whose wheels are gone
from the wheelhouse, is refused before the host changes; so are a wheel replaced in the controller's wheelhouse by
other bytes of the same size with its mtime put back, a lock file edited by hand, and a wheel URL off the profile's
indexes (at the audit, before anything is fetched).

The indexes are private copies (lab.mirrors.PrivateServer) so that publishing a build changes nothing for other
tests that use the shared mirrors, and so that their access logs count only this test's requests.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path

import pytest
import yaml

from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _lock_file as lf
from lab import wheels as lab_wheels
from lab.common import MIRRORS
from lab.mirrors import PrivateServer

pytestmark = [pytest.mark.integration, pytest.mark.slow]

NEW_KERNEL = "0.3.22+cu130"
STATE = "/var/lib/gpufleet/state.json"


@pytest.fixture(scope="module")
def fleet(lab_fleet):
    return lab_fleet(1, name="lockfile")


@pytest.fixture(scope="module")
def indexes(tmp_path_factory, lab_mirrors):
    """Copies of lab-main (PEP 691 on) and lab-stale, file dates kept, each served with its own access log."""
    base = tmp_path_factory.mktemp("indexes")
    servers = {}
    try:
        for name, extra in (("lab-main", ["--pep691"]), ("lab-stale", [])):
            root = base / name
            shutil.copytree(MIRRORS / name, root, copy_function=shutil.copy2)
            args = ["--kind", "pypi", "--root", str(root), *extra]
            servers[name] = PrivateServer(f"lockfile-{name}", args, "/simple", base / f"{name}.jsonl")
            servers[name].root = root
            servers[name].log = base / f"{name}.jsonl"
        yield servers
    finally:
        for server in servers.values():
            server.stop()


def requests(indexes, since: float) -> list[str]:
    """Every request either index answered since ``since`` (time.time())."""
    out = []
    for name, server in indexes.items():
        if server.log.exists():
            for line in server.log.read_text().splitlines():
                entry = json.loads(line)
                if entry["ts"] >= since:
                    out.append(f"{name} {entry['method']} {entry['path']}")
    return out


def publish_kernel(indexes, work: Path) -> Path:
    """A newer lab-sgl-kernel build satisfying the profile (>=0.3.21, +cu130, for the locked lab-torch 2.11.0),
    built as the lab builds its wheels and dated yesterday."""
    spec = lab_wheels.load_catalog()["projects"]["lab-sgl-kernel"]
    build = {"version": NEW_KERNEL, "requires": ["lab-torch==2.11.0"], "info": {"cuda": "13.0", "torch": "2.11.0"}}
    wheel = lab_wheels._build_one("lab-sgl-kernel", spec, build, indexes["lab-main"].root, work)
    stamp = time.time() - 86400
    os.utime(wheel, (stamp, stamp))
    return wheel


def run(run_playbook, fleet, indexes, playbook, lock=None, check=False, **extra):
    extravars = {
        "gpufleet_index_urls": {name: server.url for name, server in indexes.items()},
        "gpufleet_batch_size": 1,
        **extra,
    }
    if lock:
        extravars["gpufleet_lock_file"] = str(lock)
    return run_playbook(playbook, fleet.inventory, extravars=extravars, check=check, diff=check)


def refusal(result) -> str:
    return result.task("Read the lock file, refusing one of another profile or whose wheels are not at hand").res["msg"]


def report(result, node):
    return result.task("Publish the host's report", node).res["ansible_facts"]["gpufleet_upgrade_report"]


def current(node_exec, node) -> str:
    return node_exec(node, "readlink -f /opt/gpufleet/serving/current", check=True).stdout.strip()


def kernel(node_exec, node) -> str:
    return node_exec(
        node, "/opt/gpufleet/serving/current/bin/python -c 'import lab_sgl_kernel as k; print(k.__version__)'"
    ).stdout.strip()


@pytest.fixture(scope="module")
def scenario(fleet, indexes, tmp_path_factory):
    """The whole story once; each test below asserts one part of it. Timings are kept for the note."""
    from lab.harness import run_playbook
    from lab.nodes import node_exec

    node = fleet.nodes[0]
    work = tmp_path_factory.mktemp("lockfile")
    out = {"node": node, "seconds": {}}

    def timed(key, *args, **kwargs):
        start = time.monotonic()
        result = run(run_playbook, fleet, indexes, *args, **kwargs)
        out["seconds"][key] = round(time.monotonic() - start, 1)
        return result

    out["upgrade"] = timed("upgrade", "playbooks/upgrade.yml")
    assert out["upgrade"].rc == 0, out["upgrade"]
    out["venv_before"] = current(node_exec, node)
    out["audit_before"] = timed("audit_before", "playbooks/audit.yml", check=True)

    out["published"] = publish_kernel(indexes, work)
    since = time.time()
    out["audit_after"] = timed("audit_after", "playbooks/audit.yml", check=True)
    out["audit_after_requests"] = requests(indexes, since)

    made = out["upgrade"].task("Show the plan").res["msg"][0]
    out["made_lock"] = Path(made.split("written to ", 1)[1].split(";", 1)[0])
    since = time.time()
    out["rerun"] = timed("rerun_with_lock", "playbooks/upgrade.yml", lock=out["made_lock"])
    out["rerun_requests"] = requests(indexes, since)
    out["venv_after_rerun"] = current(node_exec, node)

    # The operator's copy of the lock, committed beside the inventory; plan.yml rewrites it in place.
    fleet_lock = work / "fleet.lock.yml"
    shutil.copy(out["made_lock"], fleet_lock)
    out["fleet_lock_before"] = fleet_lock.read_text()
    out["plan_check"] = timed("plan_check", "playbooks/plan.yml", lock=fleet_lock, check=True)
    out["fleet_lock_after_check"] = fleet_lock.read_text()
    out["plan"] = timed("plan", "playbooks/plan.yml", lock=fleet_lock)
    out["fleet_lock"] = fleet_lock

    since = time.time()
    out["apply"] = timed("apply_new_lock", "playbooks/upgrade.yml", lock=fleet_lock)
    out["apply_requests"] = requests(indexes, since)
    out["venv_after_apply"] = current(node_exec, node)
    out["kernel_after_apply"] = kernel(node_exec, node)
    out["audit_new"] = timed("audit_after_apply", "playbooks/audit.yml", check=True)
    out["audit_old_lock"] = timed("audit_old_lock", "playbooks/audit.yml", lock=out["made_lock"], check=True)
    print("\nlock-file scenario seconds:", json.dumps(out["seconds"]))
    return out


def test_the_upgrade_without_a_lock_says_the_lock_was_made_now_and_where(scenario):
    msg = scenario["upgrade"].task("Show the plan").res["msg"]
    assert msg[0].startswith("lock made now by this run (no gpufleet_lock_file given), written to "), msg[0]
    assert scenario["made_lock"].exists() and scenario["made_lock"].name.endswith(".lock.yml")
    doc = yaml.safe_load(scenario["made_lock"].read_text())
    assert doc["profile"]["name"] == "lab" and len(doc["entries"]) == 1
    made = report(scenario["upgrade"], scenario["node"])
    assert made["outcome"] == "upgraded"
    # The run's report keeps where the lock came from.
    assert f"(lock made now by this run, written to {scenario['made_lock']})" in made["phases"]["prepare"], made


def test_a_newer_build_on_the_index_leaves_the_audit_in_sync_and_asks_no_index(scenario):
    for key in ("audit_before", "audit_after"):
        result = scenario[key]
        assert result.rc == 0, result
        verdict = result.audit_reports()[scenario["node"]]
        assert verdict["in_sync"], (key, verdict["drift"])
    assert scenario["audit_after_requests"] == []


def test_a_rerun_with_the_lock_changes_nothing_and_asks_no_index(scenario):
    rerun = scenario["rerun"]
    assert rerun.rc == 0, rerun
    assert [f"{r.host}: {r.task}" for r in rerun.changed_tasks()] == []
    assert report(rerun, scenario["node"])["outcome"] == "already at lab (in sync)"
    assert scenario["venv_after_rerun"] == scenario["venv_before"]
    assert scenario["rerun_requests"] == []


def test_plan_shows_exactly_the_new_build_and_check_mode_writes_nothing(scenario):
    check = scenario["plan_check"]
    assert check.rc == 0, check
    assert scenario["fleet_lock_after_check"] == scenario["fleet_lock_before"]
    plan = scenario["plan"]
    assert plan.rc == 0, plan
    for result in (check, plan):
        lines = result.task("Show what the lock file changes against the previous one").res["msg"]
        changes = [line for line in lines if line.startswith("  ")]
        assert len(changes) == 1, lines
        assert changes[0].startswith("  ~ lab-sgl-kernel 0.3.21+cu130 (sha256 ") and f"-> {NEW_KERNEL} " in changes[0]
    doc = yaml.safe_load(scenario["fleet_lock"].read_text())
    (entry,) = doc["entries"]
    locked = {p["name"]: p for p in entry["packages"]}
    assert locked["lab-sgl-kernel"]["filename"] == scenario["published"].name
    assert Path(str(scenario["fleet_lock"])[: -len(".yml")] + ".report.txt").exists()


def test_applying_the_new_lock_upgrades_to_exactly_that_build_without_asking_an_index(scenario):
    apply = scenario["apply"]
    assert apply.rc == 0, apply
    applied = report(apply, scenario["node"])
    assert applied["outcome"].startswith("upgraded"), applied
    assert f"(lock from lock file {scenario['fleet_lock']})" in applied["phases"]["prepare"], applied
    entry = yaml.safe_load(scenario["fleet_lock"].read_text())["entries"][0]
    assert os.path.basename(scenario["venv_after_apply"]) == entry["venv_name"]
    assert scenario["kernel_after_apply"] == NEW_KERNEL
    assert scenario["apply_requests"] == []
    # The audit without a lock now judges against the new lock the host recorded; against the old lock file the
    # host has drifted (it runs the new venv).
    assert scenario["audit_new"].audit_reports()[scenario["node"]]["in_sync"]
    old = scenario["audit_old_lock"].audit_reports()[scenario["node"]]
    assert not old["in_sync"] and any(line.startswith("serving venv link: current is ") for line in old["drift"])


def test_a_lock_of_another_profile_or_with_a_missing_wheel_is_refused_before_the_host_changes(
    scenario, fleet, indexes, run_playbook, node_exec, tmp_path
):
    node = scenario["node"]
    state = node_exec(node, f"stat -c %Y {STATE}", check=True).stdout.strip()
    doc = yaml.safe_load(scenario["fleet_lock"].read_text())
    other = tmp_path / "other-profile.lock.yml"
    # Sealed with a digest, as plan.yml writes it: the profile's hash is what differs.
    other.write_text(lf.dumps(lf.seal(dict(doc, profile={"name": "lab", "hash": "0" * 64}))))
    refused = run(run_playbook, fleet, indexes, "playbooks/upgrade.yml", lock=other)
    assert refused.rc != 0
    assert "the profile changed since the plan" in refusal(refused), refused

    wheelhouse = Path(doc["entries"][0]["packages"][0]["filename"])
    inventory = yaml.safe_load(Path(fleet.inventory).read_text())
    controller = Path(inventory["all"]["children"]["gpufleet_lab"]["vars"]["gpufleet_controller_dir"])
    kept = controller / "wheelhouse" / wheelhouse
    moved = tmp_path / wheelhouse.name
    shutil.move(kept, moved)
    try:
        refused = run(run_playbook, fleet, indexes, "playbooks/upgrade.yml", lock=scenario["fleet_lock"])
    finally:
        shutil.move(moved, kept)
    assert refused.rc != 0
    assert "no longer holds every wheel" in refusal(refused) and wheelhouse.name in refusal(refused), refused
    assert node_exec(node, f"stat -c %Y {STATE}", check=True).stdout.strip() == state
    assert current(node_exec, node) == scenario["venv_after_apply"]


def controller_wheelhouse(fleet) -> Path:
    inventory = yaml.safe_load(Path(fleet.inventory).read_text())
    return Path(inventory["all"]["children"]["gpufleet_lab"]["vars"]["gpufleet_controller_dir"]) / "wheelhouse"


def test_a_tampered_wheel_a_hand_edit_and_a_file_url_are_refused_before_the_host_changes(
    fleet, indexes, run_playbook, node_exec, tmp_path
):
    """Issue 42: each is refused by the lock file's play, naming what was found, before any host changes."""
    node = fleet.nodes[0]
    made = run(run_playbook, fleet, indexes, "playbooks/upgrade.yml")
    assert made.rc == 0, made
    text = made.task("Show the plan").res["msg"][0]
    lock = Path(text.split("written to ", 1)[1].split(";", 1)[0])
    before = (node_exec(node, f"stat -c %Y {STATE}", check=True).stdout.strip(), current(node_exec, node))
    doc = lf.read(str(lock))
    kernel = next(p for p in doc["entries"][0]["packages"] if p["name"] == "lab-sgl-kernel")

    # Other bytes of the same size with the wheel's mtime put back (cp -p): the controller reads it again.
    held = controller_wheelhouse(fleet) / kernel["filename"]
    kept = tmp_path / "kept.whl"
    shutil.copy2(held, kept)
    stat = held.stat()
    body = bytearray(held.read_bytes())
    body[-1] ^= 0xFF
    held.write_bytes(bytes(body))
    os.utime(held, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    try:
        refused = run(run_playbook, fleet, indexes, "playbooks/upgrade.yml", lock=lock)
    finally:
        shutil.copy2(kept, held)  # put back with cp -p: taken again (hashed anew)
    assert refused.rc != 0
    found = hashlib.sha256(bytes(body)).hexdigest()
    messages = [refusal(refused)]
    assert f"{kernel['filename']} (locked sha256 {kernel['sha256']}, the file there has {found})" in messages[0]

    # A version edited by hand.
    base, _plus, local = kernel["version"].partition("+")
    by_hand = f"{base}.1+{local}"
    text = lock.read_text()
    start = text.index(f"filename: {kernel['filename']}")
    end = text.find("- filename:", start)
    block = text[start:end].replace(f"version: {kernel['version']}", f"version: {by_hand}", 1)
    edited = tmp_path / "edited.lock.yml"
    edited.write_text(text[:start] + block + text[end:] if end != -1 else text[:start] + block)
    refused = run(run_playbook, fleet, indexes, "playbooks/upgrade.yml", lock=edited)
    assert refused.rc != 0
    messages.append(refusal(refused))
    assert f"package lab-sgl-kernel: version {by_hand}, but its file {kernel['filename']}" in messages[1], messages[1]

    # A file: URL in a lock sealed with its digest: the audit refuses it (nothing is read from it).
    forged = tmp_path / "forged.lock.yml"
    kernel["url"] = "file:///etc/shadow"
    forged.write_text(lf.dumps(lf.seal(doc)))
    audit = run(run_playbook, fleet, indexes, "playbooks/audit.yml", lock=forged, check=True)
    assert audit.rc != 0
    messages.append(refusal(audit))
    assert "package lab-sgl-kernel: file:///etc/shadow" in messages[2], messages[2]

    assert (node_exec(node, f"stat -c %Y {STATE}", check=True).stdout.strip(), current(node_exec, node)) == before
    again = run(run_playbook, fleet, indexes, "playbooks/upgrade.yml", lock=lock)
    assert again.rc == 0, again
    print("\nissue-42 refusals:\n" + "\n".join(messages))
