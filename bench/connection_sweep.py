# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A sweep of forks and of the SSH connection settings (pipelining, ControlPersist) on a lab fleet.

    python bench/connection_sweep.py [--hosts 16] [--rounds 2] [--playbook audit|converged] [--keep] [--lab NAME]

Brings up lab cs-<N> at the old stack (upgrades it first for --playbook converged), then runs the playbook once per
setting per round, the settings interleaved round by round so that the machine's drift hits them alike. Prints,
per setting, the median wall time and controller CPU seconds (the playbook's own and its children's) and the ratio
to the checkout's ansible.cfg (forks 16, pipelining on, ControlPersist 60s), as JSON. The lab's nodes run on the
same cores as the controller, so forks beyond the cores mostly queue here; on a fleet they run on the hosts.
--lab NAME sweeps a lab that is already up (e.g. hs-16, kept by bench/host_state.py --keep) and leaves it up.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from lab import mirrors, nodes  # noqa: E402
from lab.common import mirror_ports  # noqa: E402
from lab.harness import run_playbook  # noqa: E402

PERSIST = "-o ControlMaster=auto -o ControlPersist=60s"
NO_PERSIST = "-o ControlMaster=no"
SETTINGS = {
    "default (forks 16, pipelining, persist)": {},
    "forks 5": {"ANSIBLE_FORKS": "5"},
    "forks 32": {"ANSIBLE_FORKS": "32"},
    "forks 64": {"ANSIBLE_FORKS": "64"},
    "no pipelining": {"ANSIBLE_PIPELINING": "false"},
    "no ControlPersist": {"ANSIBLE_SSH_ARGS": NO_PERSIST},
    "no pipelining, no ControlPersist": {"ANSIBLE_PIPELINING": "false", "ANSIBLE_SSH_ARGS": NO_PERSIST},
}


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_once(lab: str, playbook: str, env: dict) -> tuple[float, float]:
    inventory = REPO / ".lab" / lab / "inventory.yml"
    cpu0, t0 = children_cpu(), time.monotonic()
    check = playbook == "audit"
    path = "playbooks/audit.yml" if check else "playbooks/upgrade.yml"
    res = run_playbook(path, inventory, check=check, extravars={"gpufleet_batch_size": 0}, envvars=env)
    wall, cpu = time.monotonic() - t0, children_cpu() - cpu0
    if res.rc != 0:
        raise SystemExit(f"{path} failed with {env}:\n{res}")
    return wall, cpu


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--playbook", choices=["audit", "converged"], default="audit")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--lab", help="an existing lab to sweep (left up); default: bring up cs-<hosts>")
    args = ap.parse_args(argv)
    lab = args.lab or f"cs-{args.hosts}"
    ports = mirror_ports()
    mirrors.build()
    mirrors.start(ports)
    if args.lab:
        args.keep = True
        args.hosts = len(nodes.load_state(lab)["nodes"])
        if not args.hosts:
            raise SystemExit(f"lab {lab} has no nodes: bring it up first (python -m lab up N --name {lab})")
    else:
        nodes.up(args.hosts, lab, ports)
    samples = {name: [] for name in SETTINGS}
    try:
        if args.playbook == "converged":
            run_once(lab, "upgrade", {})
        for _ in range(args.rounds):
            for name, env in SETTINGS.items():
                samples[name].append(run_once(lab, args.playbook, env))
    finally:
        if not args.keep:
            nodes.down(lab)
    base = statistics.median(w for w, _ in samples[next(iter(SETTINGS))])
    report = {"hosts": args.hosts, "rounds": args.rounds, "playbook": args.playbook, "settings": {}}
    for name, runs in samples.items():
        wall = statistics.median(w for w, _ in runs)
        report["settings"][name] = {
            "wall_s": round(wall, 1),
            "cpu_s": round(statistics.median(c for _, c in runs), 1),
            "vs_default": round(wall / base, 2),
        }
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
