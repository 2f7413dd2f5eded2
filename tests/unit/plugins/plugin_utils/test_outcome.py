# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

import pytest

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _state
from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _outcome as o


@pytest.mark.parametrize(
    "phase, completed, expected",
    [
        ("preflight", False, ("preflight", "refuse", "failed_preflight")),
        # A completed preflight followed by a failing hook: still nothing changed.
        ("preflight", True, ("preflight", "refuse", "failed_preflight")),
        ("recover", False, ("recover", "recovery_failed", "rollback_failed")),
        # Recovery done: the host is back at a verified backup, this run changed nothing yet.
        ("recover", True, ("preflight", "refuse", "failed_preflight")),
        ("backup", False, ("backup", "refuse", "failed_before_change")),
        # The backup completed: from here on the host may change, whatever fails next.
        ("backup", True, ("after backup", "rollback", "rolled_back")),
        ("drain", False, ("drain", "rollback", "rolled_back")),
        ("cuda_toolkit", False, ("cuda_toolkit", "rollback", "rolled_back")),
        ("venv_rebuild", True, ("after venv_rebuild", "rollback", "rolled_back")),
        ("postcheck", False, ("postcheck", "rollback", "rolled_back")),
        ("undrain", False, ("undrain", "rollback", "rolled_back")),
        (None, False, ("preflight", "refuse", "failed_preflight")),
    ],
)
def test_classify_failure(phase, completed, expected):
    got = o.classify_failure(phase, completed)
    assert (got["failed_phase"], got["action"], got["kind"]) == expected


def test_every_recorded_phase_is_classified_and_reported_in_order():
    # A phase the state file knows but this module does not would fall through to "rollback" silently and be
    # printed last in the summary: keep the two lists in step.
    for phase in _state.PHASES:
        assert phase in o.REPORT_ORDER
        o.classify_failure(phase, False)


def test_outcome_texts_and_meaning():
    assert o.outcome("upgraded") == {
        "kind": "upgraded",
        "text": "upgraded",
        "ok": True,
        "counts_as_failure": False,
        "state_result": "upgraded",
    }
    rolled = o.outcome("rolled_back", "cuda_toolkit: Install:   boom\n  here")
    assert rolled["text"] == "rolled back: cuda_toolkit: Install: boom here"
    assert not rolled["ok"] and rolled["counts_as_failure"] and rolled["state_result"] == "rolled_back"
    assert o.outcome("not_started", "the rollout stopped")["counts_as_failure"] is False
    assert o.outcome("would_upgrade")["text"].startswith("would upgrade")


def test_failed_rollback_names_the_fix_with_host_and_backup():
    text = o.outcome("rollback_failed", "venv: boom; rollback: disk full", host="n1", backup_id="B1")["text"]
    assert text == (
        "ROLLBACK FAILED: venv: boom; rollback: disk full; fix: inspect the host, then run "
        "playbooks/rollback.yml -l n1 -e rollback_backup_id=B1"
    )


def test_unknown_kind_is_refused_with_the_known_ones():
    with pytest.raises(o.OutcomeError, match=r"'upgradd' is not one of .*upgraded"):
        o.outcome("upgradd")


def test_every_kind_with_a_state_result_records_a_valid_one():
    for name, kind in o.KINDS.items():
        assert kind.state_result is None or kind.state_result in _state.RESULTS, name


def test_failure_reason_prefers_failed_loop_items_and_adds_stderr():
    loop = {
        "msg": "One or more items failed",
        "results": [{"failed": False, "msg": "fine"}, {"failed": True, "msg": "a"}, {"failed": True, "msg": "b"}],
    }
    assert o.failure_reason("Copy wheels", loop) == "Copy wheels: a; b"
    plain = {"msg": "non-zero return code", "stderr": "  injected fault\n after_venv \n"}
    assert o.failure_reason("Inject", plain) == "Inject: non-zero return code injected fault after_venv"
    assert o.failure_reason(None, None) == "a task:"
    long = o.failure_reason("T", {"msg": "x" * 1000})
    assert len(long) == o.REASON_LIMIT and long.endswith("...")


def test_phase_notes():
    facts = {
        "preflight_report": {"lock": "ok: no lock", "disk": "ok: 9 GiB", "gpu": "skipped: no GPU"},
        "backup_id": "B1",
        "backup_reused": False,
        "cuda_toolkit_home": "/usr/local/cuda-13.0",
        "venv_rebuild_path": "/opt/v",
        "postcheck_baseline": {"output_tok_s": 101.26},
        "postcheck_result": {"bench": {"bench": {"output_tok_s": 130.04}}},
        "preflight_recovery": {"action": "none"},
        "gpufleet_drain": "none",
    }
    assert o.phase_note("preflight", facts) == {"preflight": "ok: lock ok, disk ok, gpu skipped: no GPU"}
    lost = dict(facts, preflight_recovery={"action": "none", "note": "the host's run record /s.json is missing"})
    assert o.phase_note("preflight", lost)["preflight"].endswith(
        "gpu skipped: no GPU; the host's run record /s.json is missing"
    )
    assert o.phase_note("backup", facts) == {"backup": "ok: B1 (new)"}
    assert o.phase_note("backup", dict(facts, backup_reused=True)) == {"backup": "ok: B1 (reused)"}
    assert o.phase_note("cuda_toolkit", facts) == {"cuda_toolkit": "ok: /usr/local/cuda-13.0"}
    assert o.phase_note("venv_rebuild", facts) == {"venv_rebuild": "ok: current -> /opt/v"}
    assert o.phase_note("postcheck", facts) == {"postcheck": "ok: speculative decoding 101.3 -> 130.0 tok/s"}
    assert o.phase_note("postcheck", dict(facts, postcheck_baseline=None)) == {"postcheck": "ok"}
    assert o.phase_note("recover", facts) == {}
    recovered = dict(
        facts,
        preflight_recovery={"action": "rollback", "reason": "run r0 was interrupted"},
        rollback_outcome="rolled back to backup B0",
    )
    assert o.phase_note("recover", recovered) == {"recover": "run r0 was interrupted: rolled back to backup B0"}
    assert o.phase_note("drain", facts) == {}
    assert o.phase_note("drain", dict(facts, gpufleet_drain="stop")) == {"drain": "ok: stop"}


def test_host_report_and_rollout_failures():
    report = o.host_report(o.outcome("upgraded"), "n1", "r1", "lab", backup_id="B1", phases={"backup": "ok"})
    assert report["outcome"] == "upgraded" and report["outcome_kind"] == "upgraded" and report["ok"]
    assert report["backup_id"] == "B1" and report["phases"] == {"backup": "ok"} and report["check_mode"] is False
    # No outcome noted is never reported as a success.
    empty = o.host_report({}, "n2", "r1", "lab", check_mode=True)
    assert empty["outcome_kind"] == "unknown" and not empty["ok"] and "check mode" in empty["outcome"]
    reports = {
        "ok": report,
        "rolled": o.host_report(o.outcome("rolled_back", "x"), "rolled", "r1", "lab"),
        "waiting": o.host_report(o.outcome("not_started", "stop"), "waiting", "r1", "lab"),
        "silent": None,
        # A report whose kind this code does not know counts as failed: never guessed from its text.
        "odd": {"outcome": "upgraded"},
    }
    assert o.failed_hosts(list(reports), reports) == ["rolled", "silent", "odd"]


def test_run_outcome_from_the_host_model():
    assert o.run_outcome({"in_sync": True}, "lab")["text"] == "already at lab (in sync)"
    assert o.run_outcome({"in_sync": True}, "lab")["state_result"] is None  # nothing recorded: a silent run
    drifted = {"in_sync": False, "on_profile": True, "drift": ["serving venv: six 1.17.0 missing", "x.env: A is 1"]}
    repaired = o.run_outcome(drifted, "lab")
    assert repaired["text"] == "repaired: serving venv: six 1.17.0 missing; x.env: A is 1"
    assert repaired["state_result"] == "repaired" and repaired["ok"]
    assert o.run_outcome(drifted, "lab", check_mode=True)["kind"] == "would_repair"
    upgraded = o.run_outcome({"in_sync": False, "on_profile": False, "drift": ["toolkit absent"]}, "lab")
    assert upgraded["kind"] == "upgraded"
    assert o.run_outcome(None, "lab", check_mode=True)["kind"] == "would_upgrade"


def test_a_failure_in_the_assess_phase_changed_nothing():
    assert o.classify_failure("assess", False) == {
        "failed_phase": "preflight",
        "action": "refuse",
        "kind": "failed_preflight",
    }
    assert o.phase_note("assess", {"assess_result": {"in_sync": True}}) == {"assess": "in sync"}
    drifted = {"assess_result": {"drift": ["x: a", "y: b"], "drifted": ["toolkit", "serving venv"]}}
    assert o.phase_note("assess", drifted) == {"assess": "drift in toolkit, serving venv"}


def test_a_host_the_operator_skipped_is_ok_and_no_failure():
    skipped = o.outcome("skipped", "gpufleet_skip is set for this host")
    assert skipped["text"] == "skipped by operator (gpufleet_skip is set for this host)"
    assert skipped["ok"] and not skipped["counts_as_failure"] and skipped["state_result"] is None
    assert o.report_kind({"outcome_kind": "skipped"}).label == "skipped by operator"


@pytest.mark.parametrize(("phase", "completed"), [("backup", True), ("cuda_toolkit", False), ("venv_rebuild", False)])
def test_a_check_mode_failure_after_the_backup_is_reported_never_rolled_back(phase, completed):
    # Check mode took no backup and changed nothing: a rollback would only fail on the missing backup.
    got = o.classify_failure(phase, completed, check_mode=True)
    assert got["action"] == "refuse" and got["kind"] == "would_fail", got
    out = o.outcome("would_fail", f"{got['failed_phase']}: boom")
    assert out["text"].startswith("would fail (check mode: nothing changed):")
    assert o.KINDS["would_fail"].counts_as_failure and o.KINDS["would_fail"].state_result is None
    # The phases before the backup are judged as in a real run.
    assert o.classify_failure("preflight", False, check_mode=True)["kind"] == "failed_preflight"
