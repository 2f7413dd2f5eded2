# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A plan made now against the lock a host runs: what changed (newer, older, republished, added, removed) and
whether the host is refused (it runs that lock in sync, the profile did not change) or upgraded as before."""

from __future__ import annotations

import copy

import pytest

from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _lock_file as lf
from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _lock_moves as lm

PROFILE = {
    "name": "lab",
    "python": {"version": "3.11"},
    "wheels": {"packages": [{"name": "lab-sgl-kernel", "spec": ">=0.3.21", "local_tag": "cu130"}]},
}
OLD = "a" * 64
NEW = "e" * 64
PLATFORM = "x86_64-manylinux_2_36"
VENV = "lab-aaaaaaaaaaaa"
SERVING = "/opt/gpufleet/serving"


def pkg(name, version, sha):
    """What the judgement reads of a lock's package (a lock file keeps more: url, index, size, role)."""
    return {
        "name": name,
        "version": version,
        "sha256": sha,
        "filename": f"{name.replace('-', '_')}-{version}-py3-none-any.whl",
    }


OLD_PACKAGES = [pkg("lab-sgl-kernel", "0.3.21+cu130", "1" * 64), pkg("six", "1.17.0", "2" * 64)]


def lock_text(packages, digest=OLD, venv=VENV):
    lines = [f"# {venv}: lock {digest}"]
    lines += [f"{p['name']}=={p['version']} --hash=sha256:{p['sha256']}" for p in packages]
    lines.append(f"# tool: uv==0.13.8 --hash=sha256:{'c' * 64}")
    return "\n".join(lines) + "\n"


def located(packages=None, current=f"{SERVING}/venvs/{VENV}", verified=OLD, profile="lab"):
    return {
        "platform": PLATFORM,
        "current": current,
        "venvs": [{"name": VENV, "path": f"{SERVING}/venvs/{VENV}", "mtime": 1.0, "verified": verified}],
        "recorded": {
            "state_path": "/var/lib/gpufleet/state.json",
            "lock": {"venv_name": VENV, "hash": OLD, "profile": profile, "file": "/c/locks/x.lock.yml"},
            "lock_text": lock_text(packages or OLD_PACKAGES),
            "lock_text_path": f"{SERVING}/locks/{VENV}.txt",
        },
    }


def plan(packages, digest=NEW, platform=PLATFORM):
    return {
        "hash": digest,
        "venv_name": f"lab-{digest[:12]}",
        "platform": platform,
        "python": "3.11",
        "packages": packages,
    }


def write_controller_copy(tmp_path, profile=None, platform=PLATFORM):
    """The lock file the controller wrote when it planned the host's lock (action wheel_plan)."""
    lock = {
        "platform": platform,
        "python": "3.11",
        "hash": OLD,
        "hash12": OLD[:12],
        "venv_name": VENV,
        # A lock file keeps each wheel's URL too.
        "packages": [dict(p, url=f"http://127.0.0.1:38100/packages/{p['filename']}") for p in OLD_PACKAGES],
        "tools": [],
        "overrides": [],
        "lock_rules": {},
    }
    (tmp_path / "locks").mkdir(exist_ok=True)
    lf.write(
        str(tmp_path / "locks" / f"{VENV}.lock.yml"),
        lf.dumps(lf.make_document(profile or PROFILE, [lock], "2026-12-01")),
    )
    return str(tmp_path)


def republished():
    return [pkg("lab-sgl-kernel", "0.3.21+cu130", "9" * 64), pkg("six", "1.17.0", "2" * 64)]


def test_a_wheel_republished_under_its_file_name_is_refused_with_both_hashes_and_the_fix(tmp_path):
    judged = lm.judge(located(), plan(republished()), PROFILE, "node-1", write_controller_copy(tmp_path))
    assert judged["status"] == lm.MOVED and judged["refuse"]
    assert [c["kind"] for c in judged["changes"]] == [lm.REPUBLISHED]
    assert judged["lines"] == [
        "lab-sgl-kernel 0.3.21+cu130 republished (lab_sgl_kernel-0.3.21+cu130-py3-none-any.whl: the same file name"
        f" with other bytes, sha256 {'1' * 64} -> {'9' * 64})"
    ]
    message = judged["message"]
    assert message.startswith(
        f"node-1: the indexes changed since this host's lock {VENV}, which it runs; the plan made now, lab-{NEW[:12]}:"
        " lab-sgl-kernel 0.3.21+cu130 republished"
    )
    assert "1" * 64 in message and "9" * 64 in message
    assert "(playbooks/plan.yml, then playbooks/upgrade.yml, with -e gpufleet_lock_file=<file>)" in message
    assert "-e gpufleet_accept_new_plan=true" in message
    assert message.endswith("Nothing was changed")
    # What the run's summary keeps of it (a reason is cut at 700 characters, the failed task's name before it).
    assert len(f"failed preflight: Refuse to move a host off its lock because an index changed: {message}") <= 700


def test_without_the_controller_copy_the_same_version_with_other_bytes_is_still_republished():
    judged = lm.judge(located(), plan(republished()), PROFILE, "node-1", "/nonexistent")
    assert judged["refuse"] and judged["changes"][0]["kind"] == lm.REPUBLISHED
    assert "the same version with other bytes" in judged["lines"][0]
    assert judged["message"].endswith("Nothing was changed") and judged["notes"] == []


@pytest.mark.parametrize(
    ("new", "kinds", "line"),
    [
        (
            [pkg("lab-sgl-kernel", "0.3.22+cu130", "3" * 64), OLD_PACKAGES[1]],
            [lm.NEWER],
            "lab-sgl-kernel 0.3.21+cu130 -> 0.3.22+cu130 (newer build)",
        ),
        (
            [pkg("lab-sgl-kernel", "0.3.16+cu130", "3" * 64), OLD_PACKAGES[1]],
            [lm.OLDER],
            "lab-sgl-kernel 0.3.21+cu130 -> 0.3.16+cu130 (older build)",
        ),
        ([*OLD_PACKAGES, pkg("idna", "3.10", "4" * 64)], [lm.ADDED], "idna 3.10 added"),
        ([OLD_PACKAGES[0]], [lm.REMOVED], "six 1.17.0 removed"),
    ],
)
def test_each_change_is_classified(new, kinds, line):
    judged = lm.judge(located(), plan(new), PROFILE, "node-1")
    assert [c["kind"] for c in judged["changes"]] == kinds
    assert judged["lines"] == [line] and judged["refuse"]
    assert line in judged["message"]


def test_a_version_that_does_not_parse_counts_as_a_newer_build_not_as_no_change():
    judged = lm.judge(located(), plan([pkg("lab-sgl-kernel", "not a version", "3" * 64), OLD_PACKAGES[1]]), PROFILE)
    assert judged["changes"][0]["kind"] == lm.NEWER and judged["refuse"]


def test_the_operator_may_take_the_new_plan():
    judged = lm.judge(located(), plan(republished()), PROFILE, "node-1", accept=True)
    assert judged["status"] == lm.MOVED and not judged["refuse"] and judged["lines"]


def test_the_plan_of_the_lock_the_host_runs_is_no_move():
    judged = lm.judge(located(), plan(OLD_PACKAGES, digest=OLD), PROFILE)
    assert judged == {"status": lm.SAME, "changes": [], "lines": [], "notes": [], "refuse": False, "message": ""}


@pytest.mark.parametrize(
    ("host", "status"),
    [
        ({**located(), "recorded": {"state_path": "/var/lib/gpufleet/state.json", "lock": None}}, lm.NO_LOCK),
        (located(profile="lab-cu128"), lm.NO_LOCK),  # another profile's lock: a real upgrade
        (located(current=f"{SERVING}/venvs/lab-cu128-seed"), lm.NOT_RUNNING),
        (located(verified=None), lm.NOT_RUNNING),  # the venv of the lock was never verified
        (located(current=None), lm.NOT_RUNNING),
        ({}, lm.NO_LOCK),
    ],
)
def test_a_host_that_does_not_run_its_recorded_lock_of_this_profile_is_upgraded_as_before(host, status):
    judged = lm.judge(host, plan(republished()), PROFILE, "node-1")
    assert judged["status"] == status and not judged["refuse"] and judged["message"] == ""


def test_a_repair_of_the_lock_runs_that_lock():
    host = located(current=f"{SERVING}/venvs/{VENV}.repair-r1")
    host["venvs"].append({"name": f"{VENV}.repair-r1", "path": host["current"], "mtime": 2.0, "verified": OLD})
    assert lm.judge(host, plan(republished()), PROFILE)["refuse"]


def test_a_profile_edited_under_the_same_name_is_named_and_still_refused(tmp_path):
    """The lock's wheels move either way: the operator says whether the profile's edit is what moved them."""
    before = copy.deepcopy(PROFILE)
    before["wheels"]["packages"][0]["spec"] = "==0.3.21+cu130"
    controller = write_controller_copy(tmp_path, profile=before)
    new = [pkg("lab-sgl-kernel", "0.3.22+cu130", "3" * 64), OLD_PACKAGES[1]]
    judged = lm.judge(located(), plan(new), PROFILE, "node-1", controller)
    assert judged["status"] == lm.MOVED and judged["refuse"]
    was, now = lf.profile_hash(before)[:12], lf.profile_hash(PROFILE)[:12]
    assert judged["notes"] == [f"the profile changed too since that lock was planned, hash {was} -> {now}"]
    assert judged["message"].endswith(f"Nothing was changed ({judged['notes'][0]})")


def test_a_plan_for_another_platform_is_named(tmp_path):
    controller = write_controller_copy(tmp_path, platform="x86_64-manylinux_2_39")
    judged = lm.judge(located(), plan(republished()), PROFILE, "node-1", controller)
    assert judged["refuse"]
    assert judged["notes"] == [f"that lock was planned for x86_64-manylinux_2_39, this plan for {PLATFORM}"]


def test_the_same_version_from_another_file_is_named_with_both_files(tmp_path):
    controller = write_controller_copy(tmp_path)
    other = pkg("lab-sgl-kernel", "0.3.21+cu130", "9" * 64)
    other["filename"] = "lab_sgl_kernel-0.3.21+cu130-cp310-abi3-manylinux2014_x86_64.whl"
    judged = lm.judge(located(), plan([other, OLD_PACKAGES[1]]), PROFILE, "node-1", controller)
    assert [c["kind"] for c in judged["changes"]] == [lm.OTHER_FILE] and judged["refuse"]
    line = judged["lines"][0]
    assert (
        "from another file (lab_sgl_kernel-0.3.21+cu130-py3-none-any.whl -> lab_sgl_kernel-0.3.21+cu130-cp310" in line
    )


def test_the_same_wheels_under_another_lock_hash_move_nothing_to_refuse():
    judged = lm.judge(located(), plan(OLD_PACKAGES), PROFILE)
    assert judged["status"] == lm.SAME_WHEELS and not judged["refuse"]


def test_only_the_controller_locks_folder_is_read_for_a_host_named_lock(tmp_path):
    (tmp_path / "secret.lock.yml").write_text("not a lock")
    assert lm.planned_file(str(tmp_path / "c"), "../secret") is None
    assert lm.planned_file(str(tmp_path), "lab-x") is None
    assert lm.planned_file(None, VENV) is None


def test_the_host_lock_text_gives_each_package_its_sha256_and_leaves_tools_out():
    hashes = lm.recorded_hashes(lock_text(OLD_PACKAGES))
    assert hashes == {"lab-sgl-kernel": "1" * 64, "six": "2" * 64}
    assert lm.recorded_hashes(None) == {}


def test_a_package_whose_recorded_sha256_is_unknown_changes_only_by_version():
    old = [{"name": "six", "version": "1.17.0", "sha256": None, "filename": None}]
    assert lm.classify(old, [dict(old[0], sha256="2" * 64)]) == []
