# Copyright: (c) 2026, gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A real Slurm cluster for the lab (Debian's slurm-wlm and munge): slurmctld on the machine, slurmd on the lab nodes.

    python -m lab.slurm start --name drain          # slurmctld here, one slurmd per node of lab fleet `drain`
    python -m lab.slurm start --name unit --local   # slurmctld and one slurmd here (no lab fleet needed)
    python -m lab.slurm stop --name drain

Fleet mode: slurmctld and a munged run on the machine, on loopback; each node of the lab fleet is a Slurm node named
like the node (its NodeName is the inventory name and the container's host name, so ``drain_slurm``'s default,
``inventory_hostname_short``, finds it). The nodes share the machine's network, so every slurmd gets its own port
(slurm.conf ``Port=`` per node, all at ``NodeAddr=127.0.0.1``); a slurmd finds its node by its host name
(``NodeHostname``). Each node's munged and slurmd are Debian's units in the node's systemd, started with the
machine's munge key and a copy of the cluster's slurm.conf (the image leaves both off; lab/image.py). Jobs run in the
node's container.

Local mode is the former one-node cluster (the node named after the machine), for tests that need a real scontrol
and a real job but no lab nodes.

Clients find the cluster through ``SLURM_CONF`` (the returned ``env``). Everything on the machine lives under
``.lab/<name>/slurm/``; ``stop`` ends exactly the daemons ``start`` started (their pid files, and the units on the
nodes it listed in slurm.json).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from lab import nodes
from lab.common import free_port, log, podman, write_atomic
from lab.haproxy import end_daemon

DAEMONS = ("munged", "slurmctld", "slurmd")
MUNGE_KEY = Path("/etc/munge/munge.key")
# Where Debian's packages keep things on a node (the units' PIDFile, the munge socket munged's unit makes).
NODE_PATHS = {
    "munge_socket": "/run/munge/munge.socket.2",
    "spool": "/var/lib/slurm/slurmd",
    "pid": "/run/slurmd.pid",
    "log": "/var/log/slurm/slurmd.log",
}
NODE_CONF = "/etc/slurm/slurm.conf"
NODE_KEY = "/etc/munge/munge.key"
UP_STATES = ("idle", "mixed", "allocated")
START_TIMEOUT = 60.0


def slurm_dir(name: str) -> Path:
    return nodes.lab_dir(name) / "slurm"


def controller_name() -> str:
    return socket.gethostname().split(".")[0]


def render(folder: Path, slurm_nodes: dict[str, int], ctld_port: int, cpus: int, on_node: bool, local: bool) -> str:
    """slurm.conf of a cluster of ``slurm_nodes`` ({NodeName: slurmd port}) whose slurmctld runs here.

    ``on_node``: the copy a lab node reads (its munge socket and slurmd files are where Debian's units keep them);
    otherwise the machine's copy (slurmctld, the clients, and in ``local`` mode the one slurmd). The two copies
    differ only in those paths, so the hash slurmd reports differs from slurmctld's: NO_CONF_HASH keeps that out of
    the logs.
    """
    here = {
        "munge_socket": str(folder / "munge.socket"),
        "spool": str(folder / "spool"),
        "pid": str(folder / "slurmd.pid"),
        "log": str(folder / "slurmd.log"),
    }
    paths = NODE_PATHS if on_node else here
    lines = [
        "# Rendered by lab/slurm.py; rewritten on every start.",
        "ClusterName=gpufleetlab",
        f"SlurmctldHost={controller_name()}(127.0.0.1)",
        f"SlurmctldPort={ctld_port}",
        # The port of the one slurmd of local mode; in fleet mode every node has its own (Port= below).
        f"SlurmdPort={min(slurm_nodes.values())}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        f"AuthInfo=socket={paths['munge_socket']}",
        f"StateSaveLocation={folder / 'state'}",
        f"SlurmdSpoolDir={paths['spool']}",
        f"SlurmctldPidFile={folder / 'slurmctld.pid'}",
        f"SlurmdPidFile={paths['pid']}",
        f"SlurmctldLogFile={folder / 'slurmctld.log'}",
        f"SlurmdLogFile={paths['log']}",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "ReturnToService=2",
        "MpiDefault=none",
    ]
    if not local:
        lines.append("DebugFlags=NO_CONF_HASH")
    for node, port in sorted(slurm_nodes.items()):
        where = "NodeAddr=127.0.0.1" if local else f"NodeHostname={node} NodeAddr=127.0.0.1 Port={port}"
        lines.append(f"NodeName={node} {where} CPUs={cpus} State=UNKNOWN")
    lines += [f"PartitionName=lab Nodes={','.join(sorted(slurm_nodes))} Default=YES MaxTime=INFINITE State=UP", ""]
    return "\n".join(lines)


def client_env(name: str) -> dict[str, str]:
    return {"SLURM_CONF": str(slurm_dir(name) / "slurm.conf")}


def _wait(what: str, check, timeout: float = 30.0, log_file: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            tail = log_file.read_text()[-1500:] if log_file and log_file.exists() else ""
            raise RuntimeError(f"{what} did not come up in {timeout:.0f}s\n{tail}")
        time.sleep(0.3)


def node_states(env: dict[str, str]) -> dict[str, str]:
    """{node: sinfo's state} of every node the cluster has (flags such as ``*`` kept)."""
    res = subprocess.run(["sinfo", "-h", "-N", "-o", "%N|%T"], capture_output=True, text=True, env=env, check=False)
    if res.returncode != 0:
        return {}
    return dict(line.split("|", 1) for line in res.stdout.split() if "|" in line)


def fleet_nodes(name: str) -> list[str]:
    state = nodes.load_state(name)
    if not state["nodes"]:
        raise RuntimeError(f"lab {name} has no nodes; run `python -m lab up N --name {name}` first (or use --local)")
    return sorted(state["nodes"])


def start_munged(folder: Path) -> None:
    subprocess.run(
        [
            "munged",
            "--force",
            f"--socket={folder / 'munge.socket'}",
            f"--key-file={MUNGE_KEY}",
            f"--pid-file={folder / 'munged.pid'}",
            f"--log-file={folder / 'munged.log'}",
            f"--seed-file={folder / 'munged.seed'}",
        ],
        check=True,
        capture_output=True,
    )
    _wait("munged", lambda: (folder / "munge.socket").exists(), log_file=folder / "munged.log")


def start_on_node(node: str, node_conf: Path) -> None:
    """Put the machine's munge key and the cluster's slurm.conf on the node, then start its munge and slurmd units."""
    if nodes.node_exec(node, ["test", "-x", "/usr/sbin/slurmd"], check=False).returncode != 0:
        raise RuntimeError(
            f"node {node} has no slurmd: it runs an image older than lab/image.py's (RECIPE_REVISION 3); "
            "recreate the lab (python -m lab down / up) to get the current image"
        )
    podman("cp", str(MUNGE_KEY), f"{node}:{NODE_KEY}")
    podman("cp", str(node_conf), f"{node}:{NODE_CONF}")
    script = (
        f"chown munge:munge {NODE_KEY} && chmod 0400 {NODE_KEY} && chmod 0644 {NODE_CONF} "
        "&& systemctl restart munge.service && systemctl restart slurmd.service"
    )
    res = nodes.node_exec(node, script, check=False)
    if res.returncode != 0:
        journal = nodes.node_exec(node, "journalctl -n 30 -u munge -u slurmd --no-pager", check=False).stdout
        raise RuntimeError(f"slurmd did not start on {node}: {res.stderr.strip()}\n{journal}")


def stop_on_node(node: str) -> bool:
    """Stop the node's slurmd and munge units and remove the cluster's files; False when the node is gone."""
    if nodes.container_state(node) != "running":
        return False
    nodes.node_exec(
        node,
        f"systemctl stop slurmd.service munge.service; rm -f {NODE_CONF} {NODE_KEY}",
        check=False,
    )
    return True


def start(name: str, local: bool = False) -> dict:
    """Start the cluster of lab ``name`` (its nodes, or with ``local`` one node here); replaces a running one."""
    need = ["munged", "slurmctld", "scontrol", "sinfo"] + (["slurmd"] if local else [])
    missing = [t for t in need if shutil.which(t) is None]
    if missing or not MUNGE_KEY.exists():
        raise RuntimeError(
            f"missing {missing or [str(MUNGE_KEY)]}; run scripts/setup.sh (apt-get install slurmctld slurmd munge)"
        )
    stop(name)
    folder = slurm_dir(name)
    for sub in ("state", "spool"):
        shutil.rmtree(folder / sub, ignore_errors=True)
        (folder / sub).mkdir(parents=True)
    names = [controller_name()] if local else fleet_nodes(name)
    slurm_nodes = {node: free_port() for node in names}
    ctld_port, cpus = free_port(), os.cpu_count() or 1
    conf = folder / "slurm.conf"
    write_atomic(conf, render(folder, slurm_nodes, ctld_port, cpus, on_node=False, local=local), mode=0o644)
    node_conf = folder / "slurm.node.conf"
    if not local:
        write_atomic(node_conf, render(folder, slurm_nodes, ctld_port, cpus, on_node=True, local=False), mode=0o644)
    # Written before anything starts: stop() finds the nodes even when start fails half-way.
    info = {
        "mode": "local" if local else "fleet",
        "nodes": {node: node for node in names},
        "node": names[0],
        "env": client_env(name),
        "config": str(conf),
        "munge_socket": str(folder / "munge.socket"),
    }
    write_atomic(folder / "slurm.json", json.dumps(info, indent=2) + "\n")
    env = {**os.environ, **client_env(name)}
    start_munged(folder)
    subprocess.run(["slurmctld", "-f", str(conf)], check=True, capture_output=True, env=env)
    if local:
        subprocess.run(["slurmd", "-f", str(conf)], check=True, capture_output=True, env=env)
    else:
        with ThreadPoolExecutor(max_workers=min(8, len(names))) as pool:
            list(pool.map(lambda node: start_on_node(node, node_conf), names))

    def all_up() -> bool:
        states = node_states(env)
        return all(states.get(node, "").rstrip("*~#%!@^$") in UP_STATES for node in names)

    _wait(f"slurm nodes {', '.join(names)}", all_up, timeout=START_TIMEOUT, log_file=folder / "slurmctld.log")
    log(f"lab {name}: slurm nodes {', '.join(names)} idle, SLURM_CONF={conf}")
    return info


def stop(name: str) -> list[str]:
    """Stop slurmd on the nodes this lab started it on, then end the daemons here (by their pid files)."""
    folder = slurm_dir(name)
    stopped = []
    try:
        info = json.loads((folder / "slurm.json").read_text())
    except (OSError, ValueError):
        info = {}
    if info.get("mode") == "fleet":
        stopped += [f"slurmd@{node}" for node in sorted(info.get("nodes", {})) if stop_on_node(node)]
    return stopped + [daemon for daemon in reversed(DAEMONS) if end_daemon(folder / f"{daemon}.pid")]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab.slurm", description="a Slurm cluster of the lab's nodes")
    ap.add_argument("action", choices=["start", "stop"])
    ap.add_argument("--name", default="lab")
    ap.add_argument("--local", action="store_true", help="one node on this machine instead of the lab fleet's nodes")
    args = ap.parse_args(argv)
    try:
        out = start(args.name, local=args.local) if args.action == "start" else {"stopped": stop(args.name)}
    except (RuntimeError, subprocess.CalledProcessError) as exc:
        log(f"error: {exc}")
        return 1
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
