# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a waiting host costs the controller: ansible-playbook's CPU while its hosts only wait, by
``internal_poll_interval``, and what the interval costs a run in wall (each task's end is seen up to one interval late).

    python bench/idle_cost.py [--hosts 1,4] [--wait-s 20] [--intervals 0.001,0.005,0.05] [--tasks 60] [--json]

Controller only, no lab: the hosts are aliases of this machine (``ansible_connection: local``), so a host's wait is a
process sleeping on this machine, as a host's module sleeping over SSH is to the controller (one worker blocked on its
connection). Per case, playbooks written to a temporary folder with their own ansible.cfg (the setting has no
environment variable):

- wait: one task per host, ``ansible.builtin.command: sleep <wait-s>`` (a synchronous wait, as role serving's /health
  wait and the drain modules are), and the same task with ``sleep 0``; the CPU the wait adds, over its seconds, is
  the idle cost: CPU seconds per second of wall, of the main process (the strategy loop, /proc/<pid>/stat sampled
  until it ends) and of the whole process tree (wait4: main process, workers, connections);
- async: the same wait as ``async`` + ``poll: 5`` (each poll is one more module run on the host, a worker fork and a
  round trip): what async polling would cost instead;
- tasks: ``--tasks`` trivial tasks (``ansible.builtin.command: "true"``) on one host: the wall each interval adds per
  task.

Figures depend on the machine and its load (printed beside them); run it twice and compare, not once.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PLAYBOOK = REPO / ".venv" / "bin" / "ansible-playbook"
ASYNC_POLL_S = 5


def inventory(hosts: int) -> str:
    local = f"{{ansible_connection: local, ansible_python_interpreter: {sys.executable}}}"
    return "\n".join(["all:", "  hosts:", *(f"    idle-{i}: {local}" for i in range(hosts))]) + "\n"


def wait_play(seconds: float, run_async: bool) -> str:
    task = [
        "    - name: Wait as a host's long step does",
        "      ansible.builtin.command: sleep " + str(seconds),
        "      changed_when: false",
    ]
    if run_async:
        task += [f"      async: {int(seconds) + 60}", f"      poll: {ASYNC_POLL_S}"]
    return "\n".join(["- name: Wait", "  hosts: all", "  gather_facts: false", "  tasks:", *task]) + "\n"


def tasks_play(count: int) -> str:
    body = []
    for i in range(count):
        body += [f"    - name: Trivial task {i}", '      ansible.builtin.command: "true"', "      changed_when: false"]
    return "\n".join(["- name: Tasks", "  hosts: all", "  gather_facts: false", "  tasks:", *body]) + "\n"


def cfg(interval: float) -> str:
    return (
        "[defaults]\nforks = 16\nhost_key_checking = False\nretry_files_enabled = False\n"
        f"internal_poll_interval = {interval}\nstdout_callback = default\n"
    )


def own_cpu_s(pid: int) -> float | None:
    """The process's own user + system CPU seconds (not its children's), from /proc/<pid>/stat."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def measure(folder: Path, play: str, hosts: int, interval: float) -> dict:
    """One ansible-playbook: wall, its main process's own CPU and its process tree's CPU."""
    (folder / "ansible.cfg").write_text(cfg(interval))
    (folder / "hosts.yml").write_text(inventory(hosts))
    (folder / "play.yml").write_text(play)
    env = dict(os.environ, ANSIBLE_CONFIG=str(folder / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    load = os.getloadavg()[0]
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [str(PLAYBOOK), "-i", str(folder / "hosts.yml"), str(folder / "play.yml")],
        cwd=folder,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    main = 0.0
    while True:
        own = own_cpu_s(proc.pid)
        main = own if own is not None else main
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        time.sleep(0.1)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return {
        "rc": proc.returncode,
        "wall_s": round(time.monotonic() - t0, 2),
        "main_cpu_s": round(main, 2),
        "tree_cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
        "load": round(load, 1),
    }


def idle_case(folder: Path, hosts: int, interval: float, wait_s: float, run_async: bool = False) -> dict:
    """The wait's own cost: the run with the wait less the run without, per second of the wait."""
    base = measure(folder, wait_play(0, False), hosts, interval)
    waited = measure(folder, wait_play(wait_s, run_async), hosts, interval)
    return {
        "hosts": hosts,
        "interval_s": interval,
        "mode": f"async poll {ASYNC_POLL_S}" if run_async else "sync",
        "wait_s": wait_s,
        "without_wait": base,
        "with_wait": waited,
        "main_cpu_per_wait_s": round((waited["main_cpu_s"] - base["main_cpu_s"]) / wait_s, 4),
        "tree_cpu_per_wait_s": round((waited["tree_cpu_s"] - base["tree_cpu_s"]) / wait_s, 4),
    }


def task_case(folder: Path, count: int, interval: float) -> dict:
    run = measure(folder, tasks_play(count), 1, interval)
    return {"interval_s": interval, "tasks": count, **run, "wall_s_per_task": round(run["wall_s"] / count, 3)}


def summary(rows: list[dict], tasks: list[dict]) -> list[str]:
    out = []
    for r in rows:
        out.append(
            f"{r['hosts']} host(s), internal_poll_interval {r['interval_s']} s, {r['mode']}: while the hosts wait the"
            f" main process burns {r['main_cpu_per_wait_s']:.4f} CPU-s per second, the process tree"
            f" {r['tree_cpu_per_wait_s']:.4f} (load {r['with_wait']['load']})"
        )
    for t in tasks:
        out.append(
            f"{t['tasks']} trivial tasks, internal_poll_interval {t['interval_s']} s: {t['wall_s']} s wall,"
            f" {t['wall_s_per_task']} s a task, main process {t['main_cpu_s']} CPU-s (load {t['load']})"
        )
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", default="1,4")
    ap.add_argument("--wait-s", type=float, default=20.0)
    ap.add_argument("--intervals", default="0.001,0.005,0.05", help="internal_poll_interval values (0.001: default)")
    ap.add_argument("--tasks", type=int, default=60, help="trivial tasks for the per-task wall (0: skip)")
    ap.add_argument("--no-async", action="store_true", help="skip the async + poll case")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    intervals = [float(x) for x in args.intervals.split(",")]
    rows, tasks = [], []
    with tempfile.TemporaryDirectory(prefix="idle-cost-") as tmp:
        folder = Path(tmp)
        for hosts in (int(h) for h in args.hosts.split(",")):
            for interval in intervals:
                rows.append(idle_case(folder, hosts, interval, args.wait_s))
            if not args.no_async:
                rows.append(idle_case(folder, hosts, intervals[-1], args.wait_s, run_async=True))
        if args.tasks:
            tasks = [task_case(folder, args.tasks, interval) for interval in intervals]
    report = {"rows": rows, "tasks": tasks, "summary": summary(rows, tasks)}
    print(json.dumps(report, indent=1) if args.json else "\n".join(report["summary"]))
    return 0 if all(r["with_wait"]["rc"] == 0 and r["without_wait"]["rc"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
