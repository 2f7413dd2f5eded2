# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A projection of a fleet rollout from measured parts: wall time, drained time per host, the largest share of a
serving group down at once and the controller's CPU busy share, for 100, 500 and 2,000 hosts, per batch (each batch
prepares, then drains, switches, checks, undrains) and with prepare-ahead (every host prepared before the rollout,
bounded by the site cache's throughput; the batches then only drain, switch, check and undrain).

    python bench/fleet_projection.py [--hosts 100,500,2000] [--forks 16,100] [--model-load-s 120] [--json]

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
- The controller: each host costs ``cpu_s_per_host`` CPU seconds, spread over min(cores, forks) cores; a batch takes at
  least hosts * cpu / min(cores, forks) seconds. When that bound is longer than the hosts' own time, the batch (and its
  drained time) stretches by the ratio.
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
    # docs/drain.md: compileall of 5,339 modules took 2.77 s with 16 workers on an H100 host; the real venv of
    # cu130-sglang0523 holds 34,514 .py files (bench/real_stack.py): the same rate.
    bytecode_s = round(2.77 * 34_514 / 5_339, 1)
    return {
        "cpu_s_per_host": Input(
            11.9,
            "CPU s",
            "bench/controller_cpu.py on the lab (2026-12-07): the controller's process tree CPU of a first upgrade,"
            " 191.05 s for N = 16 (11.9 s a host; the straight line through N = 1, 4, 16 gives 11.0 s a host plus"
            " 14.6 s a run; 13.4 s a host before the task cuts of that day)",
        ),
        "wheel_bytes": Input(
            4.37 * GB, "B", "bench/real_stack.py on the default index (2026-12-07): 208 wheels, 4.37 GB (the lock)"
        ),
        "toolkit_bytes": Input(
            _toolkit_bytes(), "B", "stacks/cu130.yml components summed in tests/data/redist/redistrib_13.0.2.json"
        ),
        "install_s": Input(
            411.0,
            "s",
            "bench/real_stack.py (2026-12-07): uv's unpack of the 208 wheels, 6 m 51 s on a lab node of a loaded"
            " 2-core machine (load 9-15): an upper bound for a GPU host",
        ),
        "bytecode_s": Input(
            bytecode_s, "s", "docs/drain.md: 2.77 s per 5,339 modules, 16 workers, H100; x 34,514 files"
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
        "group_max": Input("25%", "hosts", "playbooks/plays/batches.yml: gpufleet_batch_group_max default"),
        # Assumptions: not measured here.
        "model_load_s": Input(120.0, "s", "assumption (parameter): the engine loads its model and answers /health"),
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
        "group_size": Input(16, "hosts", "assumption (parameter): hosts per serving group (gpufleet_batch_by)"),
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


def _stretched(host_s, hosts, cpu_s, cores, forks):
    """A stage's wall and its stretch: the hosts' own time, or the controller's CPU bound when that is longer."""
    controller_s = hosts * cpu_s / max(1, min(cores, forks))
    wall = max(host_s, controller_s)
    return wall, (wall / host_s if host_s else 1.0)


def project(n, forks, ahead, p, with_groups=True, lock_file=False) -> dict:
    """One case: ``p`` maps each input's name to its value. Returns the wall, the drained time per host (mean over
    hosts), the largest group share down, the controller CPU and its busy share, and the batches."""
    hosts, groups = fleet(n, p["group_size"])
    batches = _batches.plan(hosts, p["batch_size"], groups if with_groups else None, p["group_max"])
    plain = _batches.plan(hosts, p["batch_size"], None)
    nbytes = p["wheel_bytes"] + p["toolkit_bytes"]
    install = p["install_s"] + p["bytecode_s"]
    drained_part = p["drain_wait_s"] + p["import_s"] + p["model_load_s"] + p["postcheck_s"]
    cores, cpu = p["controller_cores"], p["cpu_s_per_host"]
    wall = 0.0 if lock_file else p["plan_s"]
    cpu_total, prepare_wall = 0.0, 0.0
    if ahead:
        pf = p["prepare_forks"]
        for batch in _batches.plan(hosts, p["prepare_batch_size"]):
            size = len(batch)
            host_s = fetch_s(size, pf, nbytes, p["cache_bytes_per_s"], p["host_link_bytes_per_s"])
            host_s += waves(size, pf) * (p["preflight_backup_toolkit_s"] + install)
            prepare_wall += _stretched(host_s, size, cpu * p["prepare_cpu_share"], cores, pf)[0]
        wall += prepare_wall
        cpu_total += n * cpu * p["prepare_cpu_share"]
    drained_sum = 0.0
    for batch in batches:
        size, w = len(batch), waves(len(batch), forks)
        before = w * p["preflight_backup_toolkit_s"]
        if not ahead:
            before += fetch_s(size, forks, nbytes, p["cache_bytes_per_s"], p["host_link_bytes_per_s"]) + w * install
        batch_wall, stretch = _stretched(before + w * drained_part, size, cpu, cores, forks)
        wall += batch_wall
        drained_sum += size * w * drained_part * stretch
        cpu_total += size * cpu
    return {
        "hosts": n,
        "forks": forks,
        "mode": "prepare-ahead" if ahead else "per batch",
        "batches": len(batches),
        "largest_batch": max(len(b) for b in batches),
        "wall_s": round(wall, 1),
        "prepare_wall_s": round(prepare_wall, 1),
        "drained_s_per_host": round(drained_sum / n, 1),
        "group_share_down": round(group_share(batches, groups), 3),
        "group_share_down_plain_serial": round(group_share(plain, groups), 3),
        "controller_cpu_s": round(cpu_total, 1),
        "controller_busy": round(cpu_total / (wall * cores), 3) if wall else 0.0,
    }


# --- output ------------------------------------------------------------------------------------------------------


def table(rows) -> str:
    head = (
        "| hosts | forks | mode | batches (largest) | wall | of it prepare-ahead | drained per host | largest group"
        " share down (batch_by / plain serial) | controller CPU busy |"
    )
    lines = [head, "|" + "---|" * 9]
    for r in rows:
        lines.append(
            f"| {r['hosts']:,} | {r['forks']} | {r['mode']} | {r['batches']} ({r['largest_batch']})"
            f" | {seconds(r['wall_s'])} | {seconds(r['prepare_wall_s']) if r['prepare_wall_s'] else '-'}"
            f" | {seconds(r['drained_s_per_host'])}"
            f" | {r['group_share_down']:.0%} / {r['group_share_down_plain_serial']:.0%} | {r['controller_busy']:.0%} |"
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
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    settable = [n for n, i in inputs.items() if "assumption" in i.source or n in ("install_s", "cpu_s_per_host")]
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
    values = {name: item.value for name, item in inputs.items()}
    rows = [
        project(int(n), int(f), ahead, values, lock_file=args.lock_file)
        for n in args.hosts.split(",")
        for f in args.forks.split(",")
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
