# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""preflight_probe: one call reads what every preflight gate judges (state file, Python, du/df, drained check, mirrors
from the host), on this machine's real sh, du and df, and a loopback HTTP server; it changes nothing."""

from __future__ import annotations

import http.server
import json
import os
import threading

import pytest
from ansible.module_utils.testing import patch_module_args
from module_harness import Exit, Fail

from ansible_collections.gpufleet.upgrade.plugins.module_utils._version import COLLECTION_VERSION
from ansible_collections.gpufleet.upgrade.plugins.modules import preflight_probe


def call(args, check=False):
    args = dict(args, _ansible_check_mode=check)
    with patch_module_args(args), pytest.raises((Exit, Fail)) as info:
        preflight_probe.main()
    return info.type is Exit, info.value.args[0]


@pytest.fixture
def host(tmp_path):
    """A serving root whose current links a venv, a toolkit root whose cuda links cuda-12.8 (cuda-13.0 not there)."""
    serving, toolkits = tmp_path / "serving", tmp_path / "local"
    (serving / "venvs" / "old" / "lib").mkdir(parents=True)
    (serving / "venvs" / "old" / "lib" / "torch.so").write_bytes(b"x" * 5000)
    (serving / "current").symlink_to(serving / "venvs" / "old")
    (toolkits / "cuda-12.8" / "bin").mkdir(parents=True)
    (toolkits / "cuda-12.8" / "bin" / "nvcc").write_bytes(b"y" * 3000)
    (toolkits / "cuda").symlink_to(toolkits / "cuda-12.8")
    return {
        "state_path": str(tmp_path / "state.json"),
        "run_id": "20261207T000000Z-1",
        "serving_root": str(serving),
        "toolkit_root": str(toolkits),
        "toolkit_version": "13.0",
    }


@pytest.fixture
def mirror():
    """A loopback server: /ok answers 200, anything else 404."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/ok" else 404)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_reads_every_gate_s_facts_in_one_call_and_writes_nothing(host, tmp_path, mirror):
    before = sorted(p.name for p in tmp_path.rglob("*"))
    ok, res = call(
        dict(
            host,
            python="sh",
            drained_check_cmd="echo busy >&2; exit 3",
            mirror_urls=[f"{mirror}/ok", f"{mirror}/gone", "http://127.0.0.1:9/closed"],
            mirror_timeout=2,
        ),
        check=True,
    )
    assert ok and not res["changed"], res
    assert res["state"]["previous"] == {} and res["state"]["recovery"]["action"] == "none"
    assert res["python"]["rc"] == 0 and res["python"]["path"].endswith("/sh")
    paths = res["disk"]["paths"]
    assert [p["exists"] for p in paths] == [True, True, False, True]
    assert paths[0]["lnk_source"] == os.path.realpath(host["serving_root"] + "/venvs/old")
    assert paths[1]["lnk_source"].endswith("/cuda-12.8") and paths[3]["lnk_source"] is None
    sizes = {line.split("\t")[1]: int(line.split("\t")[0]) for line in res["disk"]["du"]}
    assert sizes[paths[0]["lnk_source"]] >= 5000 and sizes[paths[1]["lnk_source"]] >= 3000
    assert res["disk"]["df"][0].split() == ["Mounted", "on", "Avail"] and len(res["disk"]["df"]) == 3
    assert res["drained"]["rc"] == 3 and "busy" in res["drained"]["stderr"]
    assert [m["status"] for m in res["mirrors"]] == [200, 404, -1], res["mirrors"]
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


def test_skips_the_gates_it_is_not_asked_for_and_a_missing_python_is_a_failed_lookup(host):
    ok, res = call(host)
    assert ok and res["python"] == {"skipped": True} and res["drained"] == {"skipped": True} and res["mirrors"] == []
    ok, res = call(dict(host, python="python-that-is-not-here"))
    assert ok and res["python"]["rc"] != 0 and res["python"]["path"] == ""


def test_reads_the_state_file_and_its_recovery(host, tmp_path):
    state = {
        "version": 1,
        "collection_version": COLLECTION_VERSION,
        "run_id": "20261206T000000Z-9",
        "phase": "venv_rebuild",
        "status": "started",
        "backup_id": "b1",
        "result": "in_progress",
        "history": [],
    }
    (tmp_path / "state.json").write_text(json.dumps(state))
    ok, res = call(host)
    assert ok and res["state"]["previous"]["run_id"] == "20261206T000000Z-9"
    assert res["state"]["recovery"]["action"] == "rollback", res["state"]["recovery"]


def test_an_unusable_state_file_fails_with_the_fix(host, tmp_path):
    (tmp_path / "state.json").write_text("{not json")
    ok, res = call(host)
    assert not ok and "state file unusable" in res["msg"] and "rollback.yml" in res["msg"], res


def test_a_missing_toolkit_root_fails_naming_it(host, tmp_path):
    ok, res = call(dict(host, toolkit_root=str(tmp_path / "nowhere")))
    assert not ok and str(tmp_path / "nowhere") in res["msg"] and "fix:" in res["msg"], res
