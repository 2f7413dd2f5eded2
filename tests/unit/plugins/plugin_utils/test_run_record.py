# Copyright: (c) 2026, gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the controller knows of a host that lost its state.json (plugin_utils/_run_record.py, lookup last_run)."""

from __future__ import annotations

import json
import os

import pytest
from ansible.errors import AnsibleLookupError

from ansible_collections.gpufleet.upgrade.plugins.lookup.last_run import LookupModule
from ansible_collections.gpufleet.upgrade.plugins.module_utils._version import COLLECTION_VERSION
from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _outcome as o
from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _run_record as rr

B1 = "20261206T220000Z-1a2b3c4d"
B2 = "20261206T230000Z-5e6f7a8b"


def report(root, run_id, host, stamp, **doc):
    path = root / "runs" / run_id / f"{host}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(dict({"run_id": run_id, "check_mode": False, "outcome_kind": "upgraded"}, **doc)))
    os.utime(path, (stamp, stamp))
    return path


def test_the_newest_acting_run_and_the_backup_copies(tmp_path):
    report(tmp_path, "r1", "n1", 100, outcome="upgraded", backup_id=B1, profile="lab")
    newest = report(tmp_path, "r2", "n1", 200, outcome="rolled back: after venv_rebuild", backup_id=B2, profile="lab")
    report(tmp_path, "audit", "n1", 300, outcome="would upgrade", check_mode=True)
    report(tmp_path, "r3", "n2", 400, outcome="upgraded")
    # Another host's damaged report is no concern of n1's.
    (tmp_path / "runs" / "r4").mkdir()
    (tmp_path / "runs" / "r4" / "n2.json").write_text("not json")
    for backup in (B2, B1, ".partial-x"):
        (tmp_path / "backups" / "n1" / backup).mkdir(parents=True)
    known = rr.last_known(str(tmp_path), "n1")
    assert known == {
        "run_id": "r2",
        "outcome": "rolled back: after venv_rebuild",
        "backup_id": B2,
        "profile": "lab",
        "path": str(newest),
        "backups": [B1, B2],
    }
    assert rr.missing_record_note("/s.json", known) == (
        f"the host's run record /s.json is missing; last known from the controller: run r2: rolled back: after "
        f"venv_rebuild (backup {B2}); backup copies {B1}, {B2}"
    )


def test_a_host_the_controller_never_saw_is_not_called_lost(tmp_path):
    known = rr.last_known(str(tmp_path), "n9")
    assert known["run_id"] is None and known["backups"] == []
    assert rr.missing_record_note("/s.json", known) == ""
    assert rr.describe_last_known(known) == "nothing (no run report, no backup copy)"


def test_lookup_returns_one_answer_per_host_with_its_note(tmp_path):
    report(tmp_path, "r1", "n1", 100, outcome="upgraded", backup_id=B1)
    out = LookupModule().run(["n1", "n2"], variables={}, controller_dir=str(tmp_path), state_path="/v/state.json")
    assert out[0]["note"].startswith("the host's run record /v/state.json is missing; last known from the controller:")
    assert "run r1: upgraded (backup " + B1 + ")" in out[0]["note"]
    assert out[1]["note"] == ""


def test_the_report_the_collection_writes_carries_its_schema_and_is_read_back(tmp_path):
    doc = o.host_report(o.outcome("upgraded"), "n1", "r1", "lab", backup_id=B1)
    assert doc["schema"] == o.RUN_RECORD_SCHEMA and doc["collection_version"] == COLLECTION_VERSION
    assert rr.validate_run_record(doc, "/c/runs/r1/n1.json") is doc
    # Written before reports carried a schema: read as schema 1 when its kind is known.
    legacy = {k: v for k, v in doc.items() if k not in ("schema", "collection_version")}
    assert rr.validate_run_record(legacy, "/c/runs/r1/n1.json") is legacy


@pytest.mark.parametrize(
    ("doc", "words"),
    [
        ({"schema": 2, "outcome_kind": "upgraded", "collection_version": "9.0.0"}, "holds schema 2, this collection"),
        ({"schema": 1, "outcome_kind": "teleported"}, "holds outcome_kind 'teleported', not one of"),
        ({"outcome_kind": "upgraded", "check_mode": "no"}, "holds check_mode 'no', expected true or false"),
        (["r1"], "holds a list, expected a JSON object"),
    ],
)
def test_a_report_the_collection_cannot_act_on_is_refused_naming_file_value_and_fix(tmp_path, doc, words):
    path = tmp_path / "runs" / "r9" / "n1.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(doc))
    report(tmp_path, "r1", "n1", 100, outcome="upgraded", backup_id=B1)
    with pytest.raises(rr.RunRecordError) as err:
        rr.last_known(str(tmp_path), "n1")
    msg = str(err.value)
    assert msg.startswith(f"the controller's run record {path} {words}"), msg
    assert (
        f"nothing was changed; fix: read it with the version that wrote it, or move it out of {tmp_path / 'runs'}"
        in msg
    )
    with pytest.raises(AnsibleLookupError, match=f"^n1: the controller's run record {path}"):
        LookupModule().run(["n1"], variables={}, controller_dir=str(tmp_path))


def test_a_damaged_report_of_the_host_is_refused_not_skipped(tmp_path):
    report(tmp_path, "r1", "n1", 100, outcome="upgraded", backup_id=B1)
    (tmp_path / "runs" / "r2").mkdir()
    (tmp_path / "runs" / "r2" / "n1.json").write_text("not json")
    with pytest.raises(rr.RunRecordError, match=r"run record .*/runs/r2/n1\.json is not valid JSON"):
        rr.last_known(str(tmp_path), "n1")
