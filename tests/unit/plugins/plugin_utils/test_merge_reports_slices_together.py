# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Two slices of a sliced run started together on one controller (docs/awx.md, "What is safe when slices run at
once"): each ansible-playbook process has its own run folder and fleet cache over the same wheelhouse, neither
replaces or stops the other's; a host both slices name is held by the first and refused to the second."""

from __future__ import annotations

import concurrent.futures
import subprocess
import urllib.request

import pytest

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _state
from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _fleet_cache as fc

WHEEL = "six-1.17.0-py3-none-any.whl"


@pytest.fixture
def controller(tmp_path):
    wheels = tmp_path / "wheelhouse"
    wheels.mkdir()
    (wheels / WHEEL).write_bytes(b"w" * 4096)
    # The two slices' ansible-playbook processes: each cache ends with the process that started it.
    owners = [subprocess.Popen(["sleep", "120"]), subprocess.Popen(["sleep", "120"])]
    yield tmp_path, wheels, owners
    for run in ("runs/slice-a", "runs/slice-b"):
        fc.stop(str(tmp_path / run))
    for owner in owners:
        owner.kill()
        owner.wait()


def _fetch(state):
    with urllib.request.urlopen(f"http://127.0.0.1:{state['port']}/wheels/{WHEEL}", timeout=5) as resp:
        return resp.read()


def test_two_slices_started_together_keep_their_own_caches(controller):
    root, wheels, owners = controller
    runs = [str(root / "runs" / "slice-a"), str(root / "runs" / "slice-b")]

    def start(i):
        return fc.start(runs[i], {"wheels": str(wheels)}, bind="127.0.0.1", watch_pid=owners[i].pid)

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        first, second = pool.map(start, range(2))
    assert first["pid"] != second["pid"] and first["port"] != second["port"]
    assert fc.ours(first["pid"]) and fc.ours(second["pid"])
    assert _fetch(first) == _fetch(second) == b"w" * 4096

    # A later host of slice a reuses slice a's server; slice b's is untouched.
    again = fc.start(runs[0], {"wheels": str(wheels)}, bind="127.0.0.1", watch_pid=owners[0].pid)
    assert again["reused"] and again["pid"] == first["pid"] and fc.ours(second["pid"])

    # Slice a ends: its cache stops and counts only its own requests; slice b still serves.
    done = fc.stop(runs[0])
    assert done["stopped"] and done["served"]["requests"] == 1 and not fc.alive(first["pid"])
    assert _fetch(second) == b"w" * 4096


def test_a_host_in_both_slices_is_held_by_the_first():
    lock = {"run_id": "20261207T031500Z-111111", "controller": "ctl", "pid": 4242, "pid_start": 1}
    verdict, message = _state.judge_lock(lock, "20261207T031500Z-222222", "ctl", holder_alive=lambda pid, start: True)
    assert verdict == "held" and "20261207T031500Z-111111" in message and "fix:" in message
    # A job in another container (another controller host name) cannot check the holder: held, with the way out.
    verdict, message = _state.judge_lock(lock, "20261207T031500Z-222222", "awx-job-2", holder_alive=lambda p, s: True)
    assert verdict == "held" and "gpufleet_lock_break=20261207T031500Z-111111" in message
