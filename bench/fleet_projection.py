# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A projection of a fleet rollout from measured parts: wall time, drained time per host, the largest share of a
serving group down at once and the controller's CPU busy share, for 100, 500 and 2,000 hosts, per batch (each batch
prepares, then drains, switches, checks, undrains) and with prepare-ahead (every host prepared before the rollout,
bounded by the site cache's throughput; the batches then only drain, switch, check and undrain).

    python bench/fleet_projection.py [--hosts 100,500,2000] [--forks 16,100] [--slices 1,4] [--model-load-s 120]
                                     [--json]
    python bench/fleet_projection.py --hour 500          slices and cores 500 hosts need for an hour, and what bounds it
    python bench/fleet_projection.py --lab-run .lab/bench/sliced/<stamp>/sliced_run.json   the lab run beside the model

A PROJECTION, not a measurement. Pure Python, no lab. The batches are the collection's own (plugin_utils/_batches.py
``plan``, as playbooks/plays/batches.yml calls it), with serving groups from ``gpufleet_batch_by``. Every input is
printed beside its source; those marked "assumption" were not measured here and are parameters.

The model (each point is an assumption, printed with the table):
- Ansible's linear strategy: a task ends on every host of the batch before the next starts, and runs on at most
  ``forks`` hosts at a time, so a host phase of d seconds takes ceil(hosts / forks) * d for the batch (waves).
- Per batch: fetch (the stack's bytes per host through the site cache, a wave of k hosts at min(k * host link, cache
  throughput)), then per wave: preflight + backup + toolkit, install (unpack, bytecode), then the drained part: drain
  wait, switch + restart (the import with bytecode + the model load), post-check. A host is drained from the drain task
  to the undrain task, which waits for every wave: drained time = waves * (drain + switch + post-check).
- The controller: each host costs ``cpu_s_per_host`` CPU seconds (the whole process tree: main process, workers,
  connections), spread over min(cores / slices, forks) cores; of it ``main_cpu_s_per_host`` is the main process's,
  which is one thread: one core per ``ansible-playbook``, whatever the cores, less the share its strategy loop burns
  polling while hosts wait (``idle_main_cpu_per_s``). A batch takes at least the longer of the two bounds; when that
  is longer than the hosts' own time, the batch (and its drained time) stretches by the ratio.
- Slices (``slices``, AWX job slicing or separate jobs): each is one ``ansible-playbook`` over whole serving groups
  (group i to slice i mod slices, ``--limit`` by group as docs/awx.md advises), planning its own batches with the
  group cap; no group is in two slices, so the cap holds across them. They run at once and share the controller's
  cores and the site cache; the rollout ends with the last slice. Beside it, the share a group could lose if the
  slices split each group's hosts among them (AWX's own split): each slice's cap, added up.
- Prepare-ahead: a first run (``gpufleet_stop_after: prepare``) in batches of ``prepare_batch_size`` (nothing is
  drained, so no serving-group cap) with ``prepare_forks``: per batch fetch through the cache, then per wave
  preflight + backup + toolkit and install; it costs ``prepare_cpu_share`` of a host's controller CPU. The rollout
  then pays the full per-host CPU again (its tasks still run; the prepare phase finds the venv verified) and per wave
  preflight + the drained part.
- The collection prepares a host while it serves, before the drain, in both modes: prepare-ahead shortens the
  rollout (the window in which hosts change), not the drained time per host, unless the controller stretches it.
- Without a lock file the run plans once on the controller first (plan wall); with one, no plan.
- Controller CPU busy share: all controller CPU seconds / (wall * cores).
- Serving groups: contiguous runs of ``group_size`` hosts in inventory order (the worst case for a plain serial); the
  largest share down is the most hosts of one group in one batch over the group's size, with gpufleet_batch_by (the
  collection caps it at gpufleet_batch_group_max) and without it (plain serial).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
try:
    from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _batches
except ImportError:  # run as a script from the checkout: the set-up links it as the collection
    sys.path.insert(0, str(REPO / ".venv" / "collections"))
    from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _batches
from ansible_collections.gpufleet.upgrade.plugins.plugin_utils._fleet_report import seconds  # noqa: E402

GB = 1e9
DEVICE = REPO / "tests" / "data" / "device"


class Input:
    """A figure the model takes, with where it comes from."""

    def __init__(self, value, unit, source):
        self.value, self.unit, self.source = value, unit, source

    def __repr__(self):
        return f"Input({self.value!r}, {self.unit!r})"


def _json_field(path, *keys, default=None):
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
        for key in keys:
            doc = doc[key]
        return doc
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return default


def _toolkit_bytes():
    """The cu130 profile's toolkit components summed from the recorded 13.0.2 manifest (linux-x86_64)."""
    import yaml

    try:
        manifest = json.loads((REPO / "tests/data/redist/redistrib_13.0.2.json").read_text(encoding="utf-8"))
        profile = yaml.safe_load((REPO / "stacks/cu130.yml").read_text(encoding="utf-8"))
        return sum(int(manifest[c]["linux-x86_64"]["size"]) for c in profile["cuda"]["components"])
    except (OSError, ValueError, KeyError, TypeError):
        return 1_049_359_896


def _forks_in_cfg():
    for line in (REPO / "ansible.cfg").read_text(encoding="utf-8").splitlines():
        if line.strip().startswith("forks"):
            return int(line.split("=", 1)[1])
    return 5


def measured_inputs() -> dict:
    """The model's inputs: measured figures found in the checkout (each with its source) and the assumptions."""
    postcheck_cold = _json_field(
        DEVICE / "h100-beside-server-summary.json", "runs", 0, "playbook_wall_s", default=141.5
    )
    postcheck_h200 = _json_field(DEVICE / "h200-summary.json", "runs", 0, "playbook_wall_s", default=108.7)
    return {
        "cpu_s_per_host": Input(
            33.0,
            "CPU s",
            "measured (lab): bench/controller_cpu.py --hosts 1,4, twice (issue 46, load 7-23 on 2 cores): the"
            " process tree's CPU of a first upgrade, 19.6-33.0 s a host; the upper end (11.9 s a host at load 3.5-6"
            " on 2026-12-07)",
        ),
        "main_cpu_s_per_host": Input(
            15.0,
            "CPU s",
            "measured (lab): the same runs (issue 46): ansible-playbook's main process alone, 6-15 s a host; the"
            " upper end",
        ),
        "idle_main_cpu_per_s": Input(
            0.0,
            "CPU s/s",
            "measured (controller): bench/idle_cost.py --hosts 1,4 --wait-s 20 (load 17-25 on 2 cores), the main"
            " process while hosts wait: 0.001-0.0065 CPU-s a second with ansible.cfg's internal_poll_interval = 0.05"
            " (noise: a CPU tick is 0.01 s), 0.022-0.036 at Ansible's default 0.001; a second run (--wait-s 30, load"
            " 10.6-12.5): 0.000-0.002 against 0.025-0.036 (--idle-main-cpu-per-s 0.03 for a run without the setting)",
        ),
        "slices": Input(1, "slices", "parameter: ansible-playbook processes at once (AWX job_slice_count)"),
        "wheel_bytes": Input(
            4_363_467_244,
            "B",
            "bench/real_stack.py --hosts 4 (2026-12-08, docs/profiles.md, real stack at real size): the lock file's"
            " 208 wheels, what each host pulled through the site cache besides the toolkit (4.45 GB a host with the"
            " lab's 84 MB of archives; the cache fetched each file once)",
        ),
        "toolkit_bytes": Input(
            _toolkit_bytes(), "B", "stacks/cu130.yml components summed in tests/data/redist/redistrib_13.0.2.json"
        ),
        "install_s": Input(
            1_663.0,
            "s",
            "bench/real_stack.py --hosts 4 (2026-12-08): the role's build on each of 3 lab hosts at once, from the"
            " host's wheelhouse: venv 1.1-1.5 s, uv pip sync 1,291-1,331 s (unpack and bytecode), verify 275-306 s"
            " (imports of every compiled package); the slowest host's sum, on a 2-core machine at load 11-19: an"
            " upper bound for a GPU host (the pull is the fetch below)",
        ),
        "bytecode_s": Input(
            0.0,
            "s",
            "included in install_s: the role's uv pip sync compiles (--compile-bytecode); the 2026-12-07 inputs"
            " added 17.9 s for it on top of an install that already compiled",
        ),
        "postcheck_s": Input(
            postcheck_cold,
            "s",
            "tests/data/device/h100-beside-server-summary.json runs[0]: post-check playbook beside the serving"
            f" engine, cold JIT, H100 (H200 alone: {postcheck_h200} s, h200-summary.json)",
        ),
        "import_s": Input(2.54, "s", "docs/drain.md: torch+transformers+triton import with bytecode, H100 host"),
        "plan_s": Input(
            158.0, "s", "bench/real_stack.py (2026-12-07): the plan on the default index (0 with a lock file)"
        ),
        "forks": Input(_forks_in_cfg(), "forks", "ansible.cfg forks"),
        "batch_size": Input([1, "10%", "25%"], "serial", "playbooks/plays/batches.yml: gpufleet_batch_size default"),
        "group_max": Input("10%", "hosts", "playbooks/plays/batches.yml: gpufleet_batch_group_max default"),
        # Assumptions: not measured here.
        "model_load_s": Input(
            120.0,
            "s",
            "assumption (parameter): the engine loads its model and answers /health (no return-to-service figure of"
            " a real model recorded yet: --report <report.json> reads the hosts' serving return edges instead)",
        ),
        "drain_wait_s": Input(60.0, "s", "assumption (parameter): requests in flight end after the drain"),
        "preflight_backup_toolkit_s": Input(
            60.0, "s", "assumption (parameter): preflight, backup and the toolkit's unpack on the host"
        ),
        "cache_bytes_per_s": Input(
            1.25 * GB, "B/s", "assumption (parameter): one site cache serving 10 Gbit/s (nginx proxy_cache)"
        ),
        "host_link_bytes_per_s": Input(3.125 * GB, "B/s", "assumption (parameter): a host's 25 Gbit/s link"),
        "controller_cores": Input(16, "cores", "assumption (parameter): the controller's cores"),
        "prepare_forks": Input(100, "forks", "assumption (parameter): forks of the prepare-ahead run"),
        "prepare_batch_size": Input(
            ["25%"], "serial", "docs/operator-guide.md, Prepare the fleet ahead: gpufleet_batch_size=25%"
        ),
        "prepare_cpu_share": Input(
            0.6, "share", "assumption (parameter): share of a host's controller CPU spent before the drain"
        ),
        "group_size": Input(
            16,
            "hosts",
            "assumption (parameter): hosts per serving group (gpufleet_batch_by); the cap is at least 1 host: at"
            " 10 % a group of 16 loses 1 (6 %), of 20 loses 2, of 4 (500 hosts' last group of 16) loses 1 (25 %)",
        ),
    }


# --- the model ---------------------------------------------------------------------------------------------------


def waves(hosts, forks):
    """Ansible runs a task on at most ``forks`` hosts at once: the task's waves over ``hosts``."""
    return math.ceil(hosts / max(1, forks)) if hosts else 0


def fetch_s(hosts, forks, nbytes, cache_rate, host_rate):
    """Seconds for ``hosts`` to pull ``nbytes`` each in one task: wave by wave, a wave of k hosts at min(k * host
    link, cache throughput)."""
    out, left = 0.0, hosts
    while left > 0:
        k = min(left, forks)
        out += k * nbytes / min(k * host_rate, cache_rate)
        left -= k
    return out


def group_share(batches, groups):
    """The largest share of one serving group in one batch (hosts of the group in the batch / the group's size)."""
    size = {}
    for group in groups.values():
        size[group] = size.get(group, 0) + 1
    worst = 0.0
    for batch in batches:
        count = {}
        for host in batch:
            count[groups[host]] = count.get(groups[host], 0) + 1
        worst = max([worst] + [n / size[g] for g, n in count.items()])
    return worst


def fleet(n, group_size):
    hosts = [f"gpu-{i:05d}" for i in range(n)]
    return hosts, {h: f"group-{i // group_size:04d}" for i, h in enumerate(hosts)}


def _stretched(host_s, hosts, cpu_s, cores, forks, main_cpu_s=0.0, idle=0.0):
    """A stage's wall and its stretch: the hosts' own time, or the controller's CPU bound when that is longer: the
    process tree's CPU over min(cores, forks) cores, or the main process's on its one core (less the share its
    strategy loop burns polling, ``idle`` CPU-s a second)."""
    controller_s = hosts * cpu_s / max(1e-9, min(cores, forks))
    main_s = hosts * main_cpu_s / max(1e-9, 1.0 - idle)
    wall = max(host_s, controller_s, main_s)
    return wall, (wall / host_s if host_s else 1.0)


def slice_hosts(hosts, groups, slices):
    """``slices`` lists of hosts: whole serving groups, group i (in inventory order) to slice i mod slices."""
    order = list(dict.fromkeys(groups[h] for h in hosts))
    return [[h for h in hosts if order.index(groups[h]) % slices == k] for k in range(slices)]


def split_group_share(hosts, groups, p, slices):
    """The share of a group that could be down at once if the slices split each group's hosts among them (host i to
    slice i mod slices, AWX's own split): each slice's largest share of the group in one batch, added up."""
    worst = {}
    size = {}
    for g in groups.values():
        size[g] = size.get(g, 0) + 1
    for k in range(slices):
        part = hosts[k::slices]
        for batch in _batches.plan(part, p["batch_size"], groups, p["group_max"]) if part else []:
            seen = {}
            for h in batch:
                seen[groups[h]] = seen.get(groups[h], 0) + 1
            for g, c in seen.items():
                worst.setdefault(g, {})[k] = max(worst.get(g, {}).get(k, 0), c)
    return max((sum(per.values()) / size[g] for g, per in worst.items()), default=0.0)


def _slice_rollout(batches, forks, ahead, p, cores):
    """One slice's rollout after the plan: its wall, drained seconds summed over hosts, CPU, main-process CPU."""
    nbytes = p["wheel_bytes"] + p["toolkit_bytes"]
    install = p["install_s"] + p["bytecode_s"]
    drained_part = p["drain_wait_s"] + p["import_s"] + p["model_load_s"] + p["postcheck_s"]
    cpu, main, idle = p["cpu_s_per_host"], p.get("main_cpu_s_per_host", 0.0), p.get("idle_main_cpu_per_s", 0.0)
    cache = p["cache_bytes_per_s"] / p.get("slices", 1)
    wall = drained = cpu_total = 0.0
    for batch in batches:
        size, w = len(batch), waves(len(batch), forks)
        before = w * p["preflight_backup_toolkit_s"]
        if not ahead:
            before += fetch_s(size, forks, nbytes, cache, p["host_link_bytes_per_s"]) + w * install
        batch_wall, stretch = _stretched(before + w * drained_part, size, cpu, cores, forks, main, idle)
        wall += batch_wall
        drained += size * w * drained_part * stretch
        cpu_total += size * cpu
    return wall, drained, cpu_total


def _slice_prepare(hosts, p, cores):
    """One slice's prepare-ahead run (no drain, no group cap): its wall."""
    pf, install = p["prepare_forks"], p["install_s"] + p["bytecode_s"]
    nbytes = p["wheel_bytes"] + p["toolkit_bytes"]
    cache = p["cache_bytes_per_s"] / p.get("slices", 1)
    share = p["prepare_cpu_share"]
    wall = 0.0
    for batch in _batches.plan(hosts, p["prepare_batch_size"]) if hosts else []:
        size = len(batch)
        host_s = fetch_s(size, pf, nbytes, cache, p["host_link_bytes_per_s"])
        host_s += waves(size, pf) * (p["preflight_backup_toolkit_s"] + install)
        main = p.get("main_cpu_s_per_host", 0.0) * share
        idle = p.get("idle_main_cpu_per_s", 0.0)
        wall += _stretched(host_s, size, p["cpu_s_per_host"] * share, cores, pf, main, idle)[0]
    return wall


def project(n, forks, ahead, p, with_groups=True, lock_file=False) -> dict:
    """One case: ``p`` maps each input's name to its value (``slices``: ansible-playbook processes at once, 1 unless
    given). Returns the wall, the drained time per host (mean over hosts), the largest group share down (with whole
    groups per slice, and with the slices splitting groups), the controller CPU and its busy share, and the
    batches."""
    slices = int(p.get("slices", 1))
    hosts, groups = fleet(n, p["group_size"])
    parts = [part for part in slice_hosts(hosts, groups, slices) if part]
    cores = p["controller_cores"]
    per_slice_cores = cores / len(parts)
    plans = [_batches.plan(part, p["batch_size"], groups if with_groups else None, p["group_max"]) for part in parts]
    batches = [b for plan in plans for b in plan]
    plain = _batches.plan(hosts, p["batch_size"], None)
    wall = 0.0 if lock_file else p["plan_s"]
    prepare_wall = max(_slice_prepare(part, p, per_slice_cores) for part in parts) if ahead else 0.0
    wall += prepare_wall
    cpu_total = n * p["cpu_s_per_host"] * p["prepare_cpu_share"] if ahead else 0.0
    rollouts = [_slice_rollout(plan, forks, ahead, p, per_slice_cores) for plan in plans]
    rollout_wall = max(r[0] for r in rollouts)
    wall += rollout_wall
    cpu_total += sum(r[2] for r in rollouts)
    main_total = n * p.get("main_cpu_s_per_host", 0.0) * ((1 + p["prepare_cpu_share"]) if ahead else 1)
    return {
        "hosts": n,
        "forks": forks,
        "slices": len(parts),
        "mode": "prepare-ahead" if ahead else "per batch",
        "batches": len(batches),
        "batches_per_slice": max(len(plan) for plan in plans),
        "largest_batch": max(len(b) for b in batches),
        "wall_s": round(wall, 1),
        "prepare_wall_s": round(prepare_wall, 1),
        "rollout_wall_s": round(rollout_wall, 1),
        "drained_s_per_host": round(sum(r[1] for r in rollouts) / n, 1),
        "group_share_down": round(group_share(batches, groups), 3),
        "group_share_down_groups_split": round(split_group_share(hosts, groups, p, len(parts)), 3)
        if with_groups
        else None,
        "group_share_down_plain_serial": round(group_share(plain, groups), 3),
        "controller_cpu_s": round(cpu_total, 1),
        "main_cpu_s_per_slice": round(main_total / len(parts), 1),
        "controller_busy": round(cpu_total / (wall * cores), 3) if wall else 0.0,
    }


# --- what bounds the hour ----------------------------------------------------------------------------------------


def bounds(n, forks, ahead, p, lock_file=False) -> dict:
    """Lower bounds of the wall (seconds), each from one input alone, for ``p["slices"]`` slices: the group cap (the
    most batches one slice runs in series, each the hosts' own batch time), the main process (one core a slice), the
    controller's cores (all CPU), the site cache (every host's bytes), the plan."""
    slices = int(p.get("slices", 1))
    hosts, groups = fleet(n, p["group_size"])
    parts = [part for part in slice_hosts(hosts, groups, slices) if part]
    free = dict(p, cpu_s_per_host=0.0, main_cpu_s_per_host=0.0)
    hosts_own = max(
        _slice_rollout(_batches.plan(part, p["batch_size"], groups, p["group_max"]), forks, ahead, free, 1)[0]
        for part in parts
    )
    share = (1 + p["prepare_cpu_share"]) if ahead else 1
    idle = p.get("idle_main_cpu_per_s", 0.0)
    nbytes = p["wheel_bytes"] + p["toolkit_bytes"]
    return {
        "group cap and forks (the hosts' own batch times in series, in waves of forks)": round(hosts_own, 1),
        "main process (one core a slice)": round(
            max(len(part) for part in parts) * p.get("main_cpu_s_per_host", 0.0) * share / max(1e-9, 1 - idle), 1
        ),
        "controller cores (all CPU)": round(n * p["cpu_s_per_host"] * share / p["controller_cores"], 1),
        "site cache (every host's bytes)": round(n * nbytes / p["cache_bytes_per_s"], 1),
        "plan": 0.0 if lock_file else p["plan_s"],
    }


def hour(n, forks, ahead, p, target_s=3600.0, lock_file=False, most=64) -> dict:
    """The fewest slices whose projected wall is within ``target_s``, the cores they need (one a slice for the main
    process, and the whole CPU over the wall), and which input bounds the wall; or, when no slice count reaches it,
    the bound that no slicing moves."""
    rows = []
    for slices in range(1, most + 1):
        rows.append((slices, project(n, forks, ahead, dict(p, slices=slices), lock_file=lock_file)))
        if rows[-1][1]["wall_s"] <= target_s or rows[-1][1]["slices"] < slices:  # met, or more slices than groups
            break
    # Not met: the fewest slices within 1 % of the shortest wall (more slices no longer help).
    shortest = min(r["wall_s"] for _s, r in rows)
    slices, row = next((s, r) for s, r in rows if r["wall_s"] <= max(target_s, shortest * 1.01))
    limits = bounds(n, forks, ahead, dict(p, slices=slices), lock_file)
    cores = max(slices, math.ceil(row["controller_cpu_s"] / row["wall_s"]) if row["wall_s"] else slices)
    return {
        "hosts": n,
        "mode": row["mode"],
        "target_s": target_s,
        "met": row["wall_s"] <= target_s,
        "slices": slices,
        "cores": cores,
        "wall_s": row["wall_s"],
        "rollout_wall_s": row["rollout_wall_s"],
        "bounds": limits,
        "bounding": max(limits, key=limits.get),
        "rounds": row["batches_per_slice"],
        "round_s_for_target": round(target_s / row["batches_per_slice"], 1),
        "group_share_down": row["group_share_down"],
        "group_share_down_groups_split": row["group_share_down_groups_split"],
        "row": row,
    }


# --- measured inputs from runs --------------------------------------------------------------------------------


def _median(values):
    values = sorted(v for v in values if isinstance(v, (int, float)))
    if not values:
        return None
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


def return_inputs(inputs, reports) -> None:
    """The restart's inputs from runs' report.json: the median over hosts of the serving return (``return.total_s``:
    stop -> process up -> /health -> warm, role serving's serving_return and the post-check's warm-up) replaces the
    import and the model load, labelled measured with the reports named."""
    totals = []
    for path in reports:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
        totals += [(h.get("return") or {}).get("total_s") for h in doc.get("hosts", [])]
    total = _median(totals)
    if total is None:
        return
    where = ", ".join(str(r) for r in reports)
    count = sum(1 for t in totals if isinstance(t, (int, float)))
    inputs["model_load_s"] = Input(total, "s", f"measured: median serving return (total_s) of {count} host(s), {where}")
    inputs["import_s"] = Input(0.0, "s", "measured: inside model_load_s (the serving return from the stop)")


def lab_predict(run) -> dict:
    """The model over a lab run of bench/sliced_run.py (its JSON): the same hosts, groups, slices and cap, the
    collection's own batches, each batch the median host's own time (measured: the reports' duration_s), the
    controller's CPU a host (measured: each slice's process tree and main process) on the lab's cores shared by
    the slices, after the plays before the first batch (measured: when the slice's first batch line appeared, 0 when
    the run did not record it); the slices' predicted walls beside the measured ones."""
    groups = run.get("groups") or {}
    names = [k for k in run if k.startswith("slice") and isinstance(run[k], dict)]
    cores = run.get("cores") or 2
    out = {"cores": cores, "slices": {}}
    durations = [d for k in names for d in run[k]["host_duration_s"].values()]
    host_s = _median(durations)
    for name in names:
        sl = run[name]
        hosts = sl["hosts"]
        cpu, main = sl["tree_cpu_s"] / len(hosts), (sl.get("main_cpu_s") or 0.0) / len(hosts)
        plan = _batches.plan(hosts, [len(hosts)], groups or None, run.get("group_max") or "10%")
        in_batches = sum(_stretched(host_s, len(b), cpu, cores / len(names), 16, main)[0] for b in plan)
        before = min((sl.get("batch_started_s") or {"": 0.0}).values())
        wall = before + in_batches
        out["slices"][name] = {
            "batches": [len(b) for b in plan],
            "before_first_batch_s": before,
            "predicted_batches_s": round(in_batches, 1),
            "host_s": host_s,
            "cpu_s_per_host": round(cpu, 1),
            "main_cpu_s_per_host": round(main, 1),
            "predicted_wall_s": round(wall, 1),
            "measured_wall_s": sl["wall_s"],
            "error": round(wall / sl["wall_s"] - 1, 3) if sl.get("wall_s") else None,
        }
    return out


# --- output ------------------------------------------------------------------------------------------------------


def table(rows) -> str:
    head = (
        "| hosts | forks | mode | slices | batches (largest) | wall | of it prepare-ahead | drained per host | largest"
        " group share down (batch_by, whole groups a slice / groups split over slices / plain serial) | main process"
        " CPU a slice | controller CPU busy |"
    )
    lines = [head, "|" + "---|" * 11]
    for r in rows:
        split = r["group_share_down_groups_split"]
        lines.append(
            f"| {r['hosts']:,} | {r['forks']} | {r['mode']} | {r['slices']} | {r['batches']} ({r['largest_batch']})"
            f" | {seconds(r['wall_s'])} | {seconds(r['prepare_wall_s']) if r['prepare_wall_s'] else '-'}"
            f" | {seconds(r['drained_s_per_host'])}"
            f" | {r['group_share_down']:.0%} / {'-' if split is None else f'{split:.0%}'}"
            f" / {r['group_share_down_plain_serial']:.0%} | {seconds(r['main_cpu_s_per_slice'])}"
            f" | {r['controller_busy']:.0%} |"
        )
    return "\n".join(lines)


def hour_text(h) -> str:
    head = (
        f"{h['hosts']:,} hosts, {h['mode']}: "
        + (
            f"{h['slices']} slice(s) and {h['cores']} core(s) make it in {seconds(h['wall_s'])}"
            if h["met"]
            else f"not within {seconds(h['target_s'])} at any slice count; best {seconds(h['wall_s'])} with"
            f" {h['slices']} slice(s) and {h['cores']} core(s)"
        )
        + (
            f" (the rollout {seconds(h['rollout_wall_s'])} after {seconds(h['wall_s'] - h['rollout_wall_s'])} of"
            " prepare-ahead, while the hosts serve)"
            if h["mode"] == "prepare-ahead"
            else ""
        )
        + f"; the wall is bounded by the {h['bounding']}; a group loses at most {h['group_share_down']:.0%} at once"
        f" (whole groups a slice; {h['group_share_down_groups_split']:.0%} if the slices split the groups)"
    )
    lines = [head] + [f"  - {name}: {seconds(v)}" for name, v in h["bounds"].items()]
    lines.append(
        f"  - a slice runs {h['rounds']} batches in series (the group cap): each must take at most"
        f" {seconds(h['round_s_for_target'])} for {seconds(h['target_s'])}"
    )
    return "\n".join(lines)


def inputs_text(inputs) -> str:
    lines = ["| input | value | source |", "|---|---|---|"]
    for name, item in inputs.items():
        value = item.value
        if item.unit == "B":
            shown = f"{value / GB:.2f} GB"
        elif item.unit == "B/s":
            shown = f"{value / GB:.3f} GB/s"
        else:
            shown = f"{value} {item.unit}"
        lines.append(f"| {name} | {shown} | {item.source} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    inputs = measured_inputs()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", default="100,500,2000")
    parser.add_argument("--forks", default=f"{inputs['forks'].value},100", help="forks of the rollout, a list")
    parser.add_argument("--batch-size", help="gpufleet_batch_size as a comma list, e.g. 1,10%%,25%%")
    parser.add_argument("--group-max", help="gpufleet_batch_group_max, e.g. 25%% or 2")
    parser.add_argument("--lock-file", action="store_true", help="a reviewed lock file: no plan in the run")
    parser.add_argument("--slices", default="1", help="ansible-playbook processes at once (AWX slices), a list")
    parser.add_argument("--hour", type=int, help="the slices and cores this many hosts need for an hour, and the bound")
    parser.add_argument("--target-s", type=float, default=3600.0, help="the wall --hour aims at")
    parser.add_argument("--report", action="append", default=[], help="a run's report.json: its serving returns")
    parser.add_argument("--lab-run", help="a bench/sliced_run.py JSON: the model beside the lab run")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    own = ("install_s", "cpu_s_per_host", "main_cpu_s_per_host", "idle_main_cpu_per_s", "drain_wait_s")
    settable = [n for n, i in inputs.items() if "assumption" in i.source or n in own]
    for name in settable:
        parser.add_argument("--" + name.replace("_", "-"), type=float, default=None)
    args = parser.parse_args(argv)
    for name in settable:
        item, given = inputs[name], getattr(args, name)
        if given is not None:
            integer = isinstance(item.value, int)
            item.value = int(given) if integer else given
            item.source = "given on the command line"
    for name, given in (("batch_size", args.batch_size), ("group_max", args.group_max)):
        if given:
            inputs[name].value = given.split(",") if name == "batch_size" else given
            inputs[name].source = "given on the command line"
    if args.report:
        return_inputs(inputs, args.report)
    values = {name: item.value for name, item in inputs.items()}
    if args.lab_run:
        compared = lab_predict(json.loads(Path(args.lab_run).read_text(encoding="utf-8")))
        print(json.dumps(compared, indent=1))
        return 0
    if args.hour:
        forks = int(args.forks.split(",")[0])
        plans = [hour(args.hour, forks, ahead, values, args.target_s, args.lock_file) for ahead in (False, True)]
        if args.json:
            print(json.dumps({"inputs": {k: vars(v) for k, v in inputs.items()}, "hour": plans}, indent=1))
            return 0
        print(inputs_text(inputs) + "\n")
        print("\n".join(hour_text(h) for h in plans))
        return 0
    rows = [
        project(int(n), int(f), ahead, dict(values, slices=int(sl)), lock_file=args.lock_file)
        for n in args.hosts.split(",")
        for f in args.forks.split(",")
        for sl in args.slices.split(",")
        for ahead in (False, True)
    ]
    if args.json:
        print(json.dumps({"inputs": {k: vars(v) for k, v in inputs.items()}, "rows": rows}, indent=1))
        return 0
    model = __doc__[__doc__.index("The model") :].strip()
    print("A PROJECTION from measured parts, not a measurement.\n\n" + model + "\n")
    print(inputs_text(inputs) + "\n")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
