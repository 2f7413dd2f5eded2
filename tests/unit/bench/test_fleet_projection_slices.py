# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""bench/fleet_projection.py's slices: one core per ansible-playbook's main process, whole serving groups a slice (the
group cap holds across slices), what bounds the wall, the slices an hour needs, the serving return read from reports
and the model beside a lab run of bench/sliced_run.py; figures worked by hand."""

from __future__ import annotations

import json

from ansible_collections.gpufleet.upgrade.bench import fleet_projection as fp
from ansible_collections.gpufleet.upgrade.tests.unit.bench.test_fleet_projection import SMALL


def test_slices_take_whole_groups_round_robin():
    hosts, groups = fp.fleet(10, 2)  # groups 0..4 of 2 hosts
    parts = fp.slice_hosts(hosts, groups, 2)
    assert parts == [hosts[0:2] + hosts[4:6] + hosts[8:10], hosts[2:4] + hosts[6:8]]
    assert not set(groups[h] for h in parts[0]) & set(groups[h] for h in parts[1])


def test_the_main_process_is_one_core_a_slice():
    slow = dict(SMALL, main_cpu_s_per_host=20)
    one = fp.project(4, 2, False, slow)
    # One slice: batches [gpu-0, gpu-2], [gpu-1, gpu-3]; hosts' own 17 s a batch, the main process 2 x 20 s on its
    # one core (16 cores would not help): 7 + 2 x 40 = 87 s.
    assert one["wall_s"] == 87.0 and one["slices"] == 1
    two = fp.project(4, 2, False, dict(slow, slices=2))
    # Two slices, a group each: batches of 1 host, 2 in series; per batch 5 + fetch 10 B at the cache's half
    # (5 B/s) 2 s + install 4 + drained 6 = 17 s, the main process 20 s: 7 + 2 x 20 = 47 s.
    assert two["wall_s"] == 47.0 and two["batches_per_slice"] == 2
    assert two["drained_s_per_host"] == round(6 * 20 / 17, 1)


def test_the_idle_poll_takes_its_share_of_the_main_process():
    row = fp.project(4, 2, False, dict(SMALL, slices=2, main_cpu_s_per_host=10, idle_main_cpu_per_s=0.5))
    # 10 s of work on a core half taken by the strategy loop's polling: 20 s a batch.
    assert row["wall_s"] == 7 + 2 * 20.0


def test_the_group_cap_holds_across_slices_with_whole_groups():
    row = fp.project(4, 2, False, dict(SMALL, slices=2))
    # Whole groups a slice: at most 1 of a group's 2 hosts down (50 %); slices splitting each group (host i to slice
    # i mod 2) each take 1 of the group at once: 2 of 2.
    assert row["group_share_down"] == 0.5 and row["group_share_down_groups_split"] == 1.0


def test_bounds_and_the_slices_an_hour_needs():
    slow = dict(SMALL, main_cpu_s_per_host=20)
    limits = fp.bounds(4, 2, False, dict(slow, slices=2))
    assert limits["main process (one core a slice)"] == 40.0
    assert limits["group cap and forks (the hosts' own batch times in series, in waves of forks)"] == 34.0
    assert limits["controller cores (all CPU)"] == 2.0 and limits["plan"] == 7
    plan = fp.hour(4, 2, False, slow, target_s=50)
    assert (plan["met"], plan["slices"], plan["wall_s"], plan["cores"]) == (True, 2, 47.0, 2)
    assert plan["bounding"] == "main process (one core a slice)" and plan["rounds"] == 2
    missed = fp.hour(4, 2, False, slow, target_s=30)
    # 2 groups: no more than 2 slices; 47 s is the best, bounded by the main process.
    assert (missed["met"], missed["slices"], missed["wall_s"]) == (False, 2, 47.0)


def test_the_serving_return_from_reports_replaces_the_assumed_model_load(tmp_path):
    report = tmp_path / "report.json"
    hosts = [{"host": "a", "return": {"total_s": 30.0}}, {"host": "b", "return": {"total_s": 50.0}}, {"host": "c"}]
    report.write_text(json.dumps({"hosts": hosts}))
    inputs = fp.measured_inputs()
    fp.return_inputs(inputs, [str(report)])
    assert inputs["model_load_s"].value == 40.0 and inputs["import_s"].value == 0.0
    assert inputs["model_load_s"].source.startswith("measured: median serving return (total_s) of 2 host(s)")


def test_the_model_beside_a_lab_run():
    def part(hosts, wall, durations, **more):
        return {
            "hosts": hosts,
            "tree_cpu_s": 20,
            "main_cpu_s": 10,
            "wall_s": wall,
            "host_duration_s": durations,
            **more,
        }

    run = {
        "groups": {"a": "group-0", "b": "group-0", "c": "group-1", "d": "group-1"},
        "group_max": "10%",
        "cores": 2,
        "slice1": part(["a", "b"], 100, {"a": 40, "b": 50}),
        "slice2": part(["c", "d"], 110, {"c": 45, "d": 55}, batch_started_s={"batch 1": 10.0, "batch 2": 60.0}),
    }
    out = fp.lab_predict(run)
    # The median host 47.5 s; 1 of a group of 2 at once: 2 batches of 1 in series; the controller's 10 s a host on
    # 1 core, 5 s of it the main process: shorter. 95 s against 100; slice 2 started its first batch after 10 s.
    one, two = out["slices"]["slice1"], out["slices"]["slice2"]
    assert one["batches"] == [1, 1] and one["before_first_batch_s"] == 0.0
    assert one["predicted_wall_s"] == 95.0 and one["error"] == -0.05
    assert two["predicted_wall_s"] == 105.0 and two["error"] == round(105 / 110 - 1, 3)
