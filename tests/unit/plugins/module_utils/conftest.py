"""Fixtures of the module_utils tests: HTTP servers on loopback, and the lab's SGLang stand-in served in-process.

Also makes lab_sglang (lab/wheels/lab-sglang/src) importable, under .venv/bin/python and .venv/sglang/bin/python
alike: the stand-in needs only the standard library.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[4] / "lab" / "wheels" / "lab-sglang" / "src"))

from lab_sglang.server import Config, make_server

# Ready at once, EAGLE-3 on, no prefill time: a test's timing is its rates and TTFT alone.
STAND_IN = {
    "host": "127.0.0.1",
    "port": 0,
    "model_path": "/m",
    "served_model_name": "lab-model",
    "speculative_algorithm": "EAGLE3",
    "speculative_draft_model_path": "/d",
    "startup_s": 0.0,
    "prefill_s_per_token": 0.0,
}


@pytest.fixture
def loopback():
    """run(server) -> its URL: serves an http.server on a daemon thread; every one is shut down after the test."""
    servers = []

    def run(server):
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield run
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.fixture
def stand_in_config():
    """Config fields every stand-in of a test module gets (rates at least): override this fixture in the module."""
    return {}


@pytest.fixture
def serve(loopback, stand_in_config):
    """start(**fields) -> (server, url): a stand-in of STAND_IN, the module's stand_in_config, then fields."""

    def start(**fields):
        server = make_server(Config(**{**STAND_IN, **stand_in_config, **fields}))
        return server, loopback(server)

    return start
