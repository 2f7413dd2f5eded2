# Copyright: (c) 2026, gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A real one-node Slurm cluster (Debian's slurmctld, slurmd, munge) on the machine itself, on loopback.

Not yet a cluster of the lab's nodes: slurmctld and one slurmd run on the controller, the node named after the
machine's short host name. It lets ``drain_slurm`` be tested against real ``scontrol``/``sinfo``/``squeue`` and a
real job that must end before the node is DRAINED.

    python -m lab.slurm start --name drain    # prints the node, SLURM_CONF and the munge socket
    python -m lab.slurm stop --name drain

Clients find the cluster through ``SLURM_CONF`` (the returned ``env``). Everything lives under
``.lab/<name>/slurm/``; ``stop`` ends exactly the processes ``start`` started (their pid files).
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
from pathlib import Path

from lab import nodes
from lab.common import free_port, log, write_atomic
from lab.haproxy import end_daemon

DAEMONS = ("munged", "slurmctld", "slurmd")
MUNGE_KEY = Path("/etc/munge/munge.key")


def slurm_dir(name: str) -> Path:
    return nodes.lab_dir(name) / "slurm"


def node_name() -> str:
    return socket.gethostname().split(".")[0]


def render(folder: Path, node: str, ctld_port: int, slurmd_port: int, cpus: int) -> str:
    """slurm.conf of a one-node cluster whose every file lives in ``folder``."""
    return "\n".join(
        [
            "# Rendered by lab/slurm.py; rewritten on every start.",
            "ClusterName=gpufleetlab",
            f"SlurmctldHost={node}(127.0.0.1)",
            f"SlurmctldPort={ctld_port}",
            f"SlurmdPort={slurmd_port}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            f"AuthInfo=socket={folder / 'munge.socket'}",
            f"StateSaveLocation={folder / 'state'}",
            f"SlurmdSpoolDir={folder / 'spool'}",
            f"SlurmctldPidFile={folder / 'slurmctld.pid'}",
            f"SlurmdPidFile={folder / 'slurmd.pid'}",
            f"SlurmctldLogFile={folder / 'slurmctld.log'}",
            f"SlurmdLogFile={folder / 'slurmd.log'}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "ReturnToService=2",
            "MpiDefault=none",
            f"NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN",
            f"PartitionName=lab Nodes={node} Default=YES MaxTime=INFINITE State=UP",
            "",
        ]
    )


def client_env(name: str) -> dict[str, str]:
    return {"SLURM_CONF": str(slurm_dir(name) / "slurm.conf")}


def _wait(what: str, check, timeout: float = 30.0, log_file: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            tail = log_file.read_text()[-1500:] if log_file and log_file.exists() else ""
            raise RuntimeError(f"{what} did not come up in {timeout:.0f}s\n{tail}")
        time.sleep(0.3)


def start(name: str) -> dict:
    missing = [t for t in ("munged", "slurmctld", "slurmd", "scontrol") if shutil.which(t) is None]
    if missing or not MUNGE_KEY.exists():
        need = missing or [str(MUNGE_KEY)]
        raise RuntimeError(f"missing {need}; run scripts/setup.sh (apt-get install slurmctld slurmd munge)")
    stop(name)
    folder = slurm_dir(name)
    for sub in ("state", "spool"):
        shutil.rmtree(folder / sub, ignore_errors=True)
        (folder / sub).mkdir(parents=True)
    node = node_name()
    conf = folder / "slurm.conf"
    write_atomic(conf, render(folder, node, free_port(), free_port(), os.cpu_count() or 1), mode=0o644)
    env = {**os.environ, **client_env(name)}
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
    for daemon in ("slurmctld", "slurmd"):
        subprocess.run([daemon, "-f", str(conf)], check=True, capture_output=True, env=env)
    log_file = folder / "slurmctld.log"

    def node_up() -> bool:
        res = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], capture_output=True, text=True, env=env)
        return res.returncode == 0 and res.stdout.strip().rstrip("*") in ("idle", "mixed", "allocated")

    _wait(f"slurm node {node}", node_up, log_file=log_file)
    info = {"node": node, "env": client_env(name), "config": str(conf), "munge_socket": str(folder / "munge.socket")}
    write_atomic(folder / "slurm.json", json.dumps(info, indent=2) + "\n")
    log(f"lab {name}: slurm node {node} idle, SLURM_CONF={conf}")
    return info


def stop(name: str) -> list[str]:
    """End the daemons this lab started (by their pid files), slurmd first."""
    folder = slurm_dir(name)
    return [daemon for daemon in reversed(DAEMONS) if end_daemon(folder / f"{daemon}.pid")]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab.slurm", description="a one-node Slurm cluster for the lab")
    ap.add_argument("action", choices=["start", "stop"])
    ap.add_argument("--name", default="lab")
    args = ap.parse_args(argv)
    try:
        out = start(args.name) if args.action == "start" else {"stopped": stop(args.name)}
    except (RuntimeError, subprocess.CalledProcessError) as exc:
        log(f"error: {exc}")
        return 1
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
