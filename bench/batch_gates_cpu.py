# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Controller CPU of what the budget and the fleet gate add to a rollout, per host and per batch.

    python bench/batch_gates_cpu.py [--hosts 16] [--batch 4] [--repeat 3]

1. The logic alone: filter fleet_gate (a batch of --batch hosts against a fleet of --hosts hosts' pre-upgrade runs,
   3 runs of 2 concurrency levels each) and filter batch_admit (the rollout's --hosts hosts, 4 serving groups), each
   timed over 200 calls.
2. The tasks as the batched play runs them: ansible-playbook over --hosts local hosts (connection local), batches of
   --batch, once with the tasks upgrade_hosts.yml gained (the budget's 2 run_once tasks and its per-host block, the
   fleet gate's per-host block and its 2 run_once tasks, the drain's set_fact) and once with a placeholder task
   only; the difference of the CPU of ansible-playbook and its workers (user+sys of the children), divided by
   the hosts. The drain provider's look (one HAProxy or Slurm call per batch) is not in it: it runs on the load
   balancer or the Slurm host, 2 socket commands or one sinfo.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / ".venv" / "collections"))  # make setup links the checkout there

PLAY = """
- hosts: all
  gather_facts: false
  serial: {batch}
  vars:
    gpufleet_batch_by: grp
    __gpufleet_budget_deferred: "{{{{ (hostvars['localhost']['__b'] | default({{}})).deferred | default({{}}) }}}}"
    __gpufleet_fleet_gate: "{{{{ (hostvars['localhost']['__g'] | default({{}})).verdict | default({{}}) }}}}"
  tasks:
{tasks}
"""
ADDED = """
    - name: Fit the batch to the serving groups' budget
      ansible.builtin.set_fact:
        __b: >-
          {{ ansible_play_batch | gpufleet.upgrade.batch_admit(hostvars, ansible_play_hosts_all, 'grp', '25%', {},
             '') }}
      delegate_to: localhost
      delegate_facts: true
      run_once: true
    - name: Leave the host for a later run
      when: inventory_hostname in __gpufleet_budget_deferred
      block:
        - ansible.builtin.meta: end_host
    - name: Leave the host after the fleet gate
      when: not __gpufleet_fleet_gate.passed | default(true)
      block:
        - ansible.builtin.meta: end_host
    - name: Note who drained the host
      ansible.builtin.set_fact:
        serving_drained_by: "{{ __r.drained_by | default('') }}"
    - name: Judge the batch (fleet gate)
      ansible.builtin.set_fact:
        __g: >-
          {{ ansible_play_batch | gpufleet.upgrade.fleet_gate(hostvars, 'grp', 3,
             (hostvars['localhost']['__g'] | default({})).fleet_runs | default({}), 1) }}
      delegate_to: localhost
      delegate_facts: true
      run_once: true
    - name: Say why the rollout stops
      ansible.builtin.debug:
        msg: "{{ hostvars['localhost']['__g'].verdict.message }}"
      run_once: true
      when: not hostvars['localhost']['__g'].verdict.passed
"""
PLACEHOLDER = """
    - name: Placeholder
      ansible.builtin.debug:
        msg: one
"""


def bench_result(seed):
    runs = [{"output_tok_s": 54.1 + (seed % 7) * 0.1 + r * 0.05} for r in range(3)]
    return {"levels": [{"concurrency": c, "runs": runs, "output_tok_s": {"mean": 54.1}} for c in (1, 4)]}


def logic(hosts, batch):
    from ansible_collections.gpufleet.upgrade.plugins.filter.batches import batch_admit
    from ansible_collections.gpufleet.upgrade.plugins.filter.fleet_gate import fleet_gate

    names = [f"h{i}" for i in range(hosts)]
    hv = {
        h: {
            "grp": f"g{i % 4}",
            "postcheck_baseline": bench_result(i),
            "postcheck_result": {"passed": True, "bench": bench_result(i + 1)},
        }
        for i, h in enumerate(names)
    }
    fleet = {h: {1: [54.1, 54.2, 54.0], 4: [54.1, 54.2, 54.0]} for h in names}
    out = {}
    for label, call in (
        ("fleet_gate", lambda: fleet_gate(names[:batch], hv, "grp", 3, fleet, 2)),
        ("batch_admit", lambda: batch_admit(names[:batch], hv, names, "grp", "25%", {"h5": "HAProxy maint"}, "")),
    ):
        t0 = time.process_time()
        for _ in range(200):
            call()
        out[label] = (time.process_time() - t0) / 200 * 1000
    return out


def playbook_cpu(hosts, batch, tasks):
    with tempfile.TemporaryDirectory() as tmp:
        inv = Path(tmp) / "hosts.ini"
        inv.write_text(
            "[all]\n"
            + "".join(
                f"h{i} ansible_connection=local grp=g{i % 4} ansible_python_interpreter={sys.executable}\n"
                for i in range(hosts)
            )
        )
        play = Path(tmp) / "play.yml"
        play.write_text(PLAY.format(batch=batch, tasks=tasks))
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.monotonic()
        env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"))
        subprocess.run(
            [str(ROOT / ".venv/bin/ansible-playbook"), "-i", str(inv), str(play)],
            check=True,
            capture_output=True,
            env=env,
            cwd=ROOT,
        )
        wall = time.monotonic() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        return after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, wall


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", type=int, default=16)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    for label, ms in logic(a.hosts, a.batch).items():
        print(f"{label}: {ms:.2f} ms a call ({a.hosts} hosts, batch of {a.batch})")
    rows = {"placeholder": [], "added": []}
    for _ in range(a.repeat):  # alternate, so the machine's other load falls on both
        rows["placeholder"].append(playbook_cpu(a.hosts, a.batch, PLACEHOLDER))
        rows["added"].append(playbook_cpu(a.hosts, a.batch, ADDED + PLACEHOLDER))
    for label, vals in rows.items():
        cpu = sorted(v[0] for v in vals)[len(vals) // 2]
        wall = sorted(v[1] for v in vals)[len(vals) // 2]
        print(f"{label}: controller CPU {cpu:.2f} s, wall {wall:.2f} s (median of {a.repeat})")
    d_cpu = (
        sorted(v[0] for v in rows["added"])[a.repeat // 2] - sorted(v[0] for v in rows["placeholder"])[a.repeat // 2]
    )
    d_wall = (
        sorted(v[1] for v in rows["added"])[a.repeat // 2] - sorted(v[1] for v in rows["placeholder"])[a.repeat // 2]
    )
    print(f"added: {d_cpu / a.hosts * 1000:.0f} ms controller CPU and {d_wall / a.hosts * 1000:.0f} ms wall a host")


if __name__ == "__main__":
    main()
