# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""bench/fleet_projection.py: the model's arithmetic on small fleets worked by hand, its batches from the
collection's own planner (plugin_utils/_batches.py), and its inputs read from the checkout with their sources."""

from __future__ import annotations

import json

import pytest

from ansible_collections.gpufleet.upgrade.bench import fleet_projection as fp
from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _batches

# A fleet of 4 hosts in 2 serving groups of 2, figures small enough to follow by hand.
SMALL = {
    "wheel_bytes": 8,
    "toolkit_bytes": 2,  # 10 B per host
    "install_s": 3,
    "bytecode_s": 1,  # install 4 s
    "drain_wait_s": 1,
    "import_s": 0,
    "model_load_s": 2,
    "postcheck_s": 3,  # drained part 6 s
    "preflight_backup_toolkit_s": 5,
    "cache_bytes_per_s": 10,
    "host_link_bytes_per_s": 10,
    "controller_cores": 1,
    "cpu_s_per_host": 0.5,
    "plan_s": 7,
    "batch_size": [2],
    "group_max": "50%",
    "group_size": 2,
    "prepare_forks": 4,
    "prepare_batch_size": [0],  # one batch of every host
    "prepare_cpu_share": 0.5,
}


def test_waves_and_fetch_by_hand():
    assert fp.waves(10, 4) == 3 and fp.waves(8, 4) == 2 and fp.waves(0, 4) == 0
    # 5 hosts, 2 forks: waves of 2, 2, 1; 10 B each; cache 4 B/s, host link 3 B/s.
    # 2 hosts: 20 B at min(6, 4) = 4 B/s -> 5 s (twice); 1 host: 10 B at min(3, 4) -> 3.33 s.
    assert fp.fetch_s(5, 2, 10, 4, 3) == pytest.approx(5 + 5 + 10 / 3)


def test_per_batch_by_hand():
    row = fp.project(4, 2, False, SMALL)
    # batch_by caps each group at 50 % (1 of 2) per batch: [gpu-0, gpu-2], [gpu-1, gpu-3].
    # Per batch (one wave): preflight 5 + fetch 20 B at 10 B/s = 2 + install 4 + drained 6 = 17 s; the controller's
    # 2 hosts x 0.5 s on 1 core = 1 s is shorter. Two batches and the plan: 7 + 2 x 17 = 41 s.
    assert row["batches"] == 2 and row["largest_batch"] == 2
    assert row["wall_s"] == 41.0
    assert row["drained_s_per_host"] == 6.0
    assert row["group_share_down"] == 0.5 and row["group_share_down_plain_serial"] == 1.0
    assert row["controller_cpu_s"] == 2.0 and row["controller_busy"] == round(2 / 41, 3)
    assert fp.project(4, 2, False, SMALL, lock_file=True)["wall_s"] == 34.0


def test_prepare_ahead_by_hand():
    row = fp.project(4, 2, True, SMALL)
    # Prepare-ahead, 4 forks: fetch 40 B at min(40, 10) = 4 s + one wave of (5 + 4) = 13 s (controller: 4 x 0.25 s).
    # Rollout: per batch preflight 5 + drained 6 = 11 s, twice. 7 + 13 + 22 = 42 s.
    assert row["prepare_wall_s"] == 13.0 and row["wall_s"] == 42.0
    assert row["drained_s_per_host"] == 6.0
    assert row["controller_cpu_s"] == 3.0  # 4 x 0.5 x 0.5 before, 4 x 0.5 in the rollout


def test_prepare_ahead_runs_in_its_own_batches():
    row = fp.project(4, 2, True, dict(SMALL, prepare_batch_size=["50%"], prepare_forks=2))
    # Two prepare batches of 2 hosts, 2 forks: fetch 20 B at 10 B/s = 2 s + one wave of (5 + 4) = 11 s, twice.
    assert row["prepare_wall_s"] == 22.0 and row["wall_s"] == 7 + 22 + 22.0


def test_a_busy_controller_stretches_the_batch_and_its_drained_time():
    slow = dict(SMALL, cpu_s_per_host=20)
    row = fp.project(4, 2, False, slow)
    # Per batch the controller needs 2 x 20 s on 1 core = 40 s against the hosts' 17 s: stretched by 40 / 17.
    assert row["wall_s"] == 7 + 2 * 40.0
    assert row["drained_s_per_host"] == round(6 * 40 / 17, 1)
    assert row["controller_busy"] == round(4 * 20 / 87, 3)


def test_more_hosts_than_forks_take_waves():
    row = fp.project(4, 1, False, SMALL)
    # One fork: each batch of 2 runs every phase in 2 waves: 2 x 5 + fetch (2 waves of 10 B at 10 B/s) 2
    # + 2 x 4 + 2 x 6 = 32 s; drained from the first wave's drain to the undrain: 2 x 6 = 12 s.
    assert row["wall_s"] == 7 + 2 * 32.0
    assert row["drained_s_per_host"] == 12.0


def test_batches_come_from_the_collections_planner(monkeypatch):
    calls = []
    real = _batches.plan

    def spy(hosts, serial=None, groups=None, group_max=None):
        calls.append((len(hosts), serial, groups is not None, group_max))
        return real(hosts, serial, groups, group_max)

    monkeypatch.setattr(fp._batches, "plan", spy)
    row = fp.project(40, 16, False, dict(SMALL, batch_size=[1, "10%", "25%"], group_max="25%", group_size=8))
    assert (40, [1, "10%", "25%"], True, "25%") in calls and (40, [1, "10%", "25%"], False, None) in calls
    # Ansible's serial over 40 hosts: 1, 4, 10, 10, 10, 5; no batch holds more than 2 of a group of 8.
    assert row["batches"] == len(real(*fp.fleet(40, 8)[:1], [1, "10%", "25%"], fp.fleet(40, 8)[1], "25%"))
    assert row["group_share_down"] == 0.25


def test_inputs_are_read_from_the_checkout_with_their_sources():
    inputs = fp.measured_inputs()
    device = json.loads((fp.DEVICE / "h100-beside-server-summary.json").read_text())
    assert inputs["postcheck_s"].value == device["runs"][0]["playbook_wall_s"]
    assert inputs["toolkit_bytes"].value == 1_049_359_896
    assert inputs["forks"].value == fp._forks_in_cfg()
    assert all(item.source for item in inputs.values())
    assert inputs["model_load_s"].source.startswith("assumption")


def test_the_script_prints_inputs_and_the_table(capsys):
    assert fp.main(["--hosts", "100", "--forks", "16", "--model-load-s", "300"]) == 0
    out = capsys.readouterr().out
    assert "| model_load_s | 300.0 s | given on the command line |" in out
    assert "| 100 | 16 | per batch |" in out and "| 100 | 16 | prepare-ahead |" in out


def test_the_batch_policy_is_a_parameter(capsys):
    assert fp.main(["--hosts", "40", "--forks", "8", "--batch-size", "5,50%", "--group-max", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    # 40 hosts in groups of 16 (16, 16, 8), at most 1 of a group per batch: batches of at most 3 hosts.
    hosts, groups = fp.fleet(40, 16)
    expected = _batches.plan(hosts, ["5", "50%"], groups, "1")
    assert out["rows"][0]["batches"] == len(expected) and out["rows"][0]["largest_batch"] == 3
    assert out["inputs"]["batch_size"]["value"] == ["5", "50%"]
