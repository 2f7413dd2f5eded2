# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The serving role's /health wait (roles/serving/files/wait_healthy.py), run as the role runs it: a real process
against a loopback HTTP server made by the test, with a `systemctl` on PATH that reports the unit's state."""

from __future__ import annotations

import http.server
import importlib.util
import itertools
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "roles" / "serving" / "files" / "wait_healthy.py"

_spec = importlib.util.spec_from_file_location("wait_healthy", SCRIPT)
wh = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(wh)


def test_the_poll_is_fast_for_the_first_ten_seconds_then_once_a_second():
    got = list(itertools.islice(wh.poll_intervals(), 103))
    assert got == [0.1] * 100 + [1.0] * 3


class Health:
    """A /health that answers 503 for the first `not_ready` requests, then 200; counts the requests."""

    def __init__(self, not_ready):
        self.not_ready = not_ready
        self.requests = 0
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                outer.requests += 1
                self.send_response(200 if outer.requests > outer.not_ready else 503)
                self.end_headers()

            def log_message(self, *_args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/health"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def systemctl(tmp_path):
    """A `systemctl show` that prints the unit state written to <tmp>/unit-state."""
    state = tmp_path / "unit-state"
    state.write_text("ActiveState=activating\nSubState=start\nResult=success\nNRestarts=0\nExecMainStatus=0\n")
    binary = tmp_path / "bin" / "systemctl"
    binary.parent.mkdir()
    binary.write_text(f"#!/bin/sh\ncat {state}\n")
    binary.chmod(0o755)
    return state


def wait_for(not_ready, timeout, tmp_path):
    """Run the wait against a /health that answers 503 `not_ready` times; (exit code, its JSON line, requests seen)."""
    health = Health(not_ready)
    env = dict(os.environ, PATH=f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    try:
        proc = subprocess.run(
            # As the role runs it: python -c <the file> (tasks/wait.yml).
            [sys.executable, "-c", SCRIPT.read_text(), health.url, "gpufleet-serving.service", str(timeout)],
            capture_output=True,
            text=True,
            env=env,
            check=False,
        )
    finally:
        health.close()
    return proc.returncode, json.loads(proc.stdout), health


def test_a_server_that_comes_up_is_reported_healthy_after_the_polls_it_needed(tmp_path, systemctl):
    rc, out, health = wait_for(3, 30, tmp_path)
    assert (rc, out["healthy"], health.requests) == (0, True, 4)
    # Three fast polls (0.3 s of sleep), not three whole seconds.
    assert out["waited_s"] < 3.0, out


def test_a_unit_that_failed_is_reported_at_once_with_its_state(tmp_path, systemctl):
    systemctl.write_text("ActiveState=failed\nSubState=failed\nResult=exit-code\nNRestarts=0\nExecMainStatus=1\n")
    rc, out, _health = wait_for(10**6, 30, tmp_path)
    assert rc == 3
    assert out["healthy"] is False
    assert "is failed/failed (result exit-code, exit status 1" in out["reason"]


def test_no_answer_within_the_timeout_is_reported_with_the_last_answer(tmp_path, systemctl):
    rc, out, health = wait_for(10**6, 0.3, tmp_path)
    assert rc == 2
    assert out["reason"].startswith(f"no 200 from {health.url} within 0.3s (last: HTTP 503)")
