# Copyright: (c) 2026, gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Lab nodes: podman containers with systemd and sshd on the machine's network, seeded with the old stack."""

from __future__ import annotations

import json
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

from lab import image, mirrors
from lab.common import REPO, STATE, free_port, log, mirror_ports, mirror_urls, podman, port_open, run, write_atomic

LABEL = "gpufleet.lab"
SEED_SCRIPT = Path(__file__).resolve().parent / "seed" / "seed_old_stack.py"
DEFAULT_INVENTORY = REPO / "inventories" / "lab" / "hosts.yml"
BOOT_TIMEOUT = 90


def lab_dir(name: str) -> Path:
    return STATE / name


def node_names(name: str, n: int) -> list[str]:
    return [f"{name}-node{i}" for i in range(1, n + 1)]


def keygen(key: Path, comment: str) -> None:
    """A new ed25519 key pair at key / key.pub, made under a temporary name and renamed into place."""
    key.parent.mkdir(parents=True, exist_ok=True)
    tmp = key.with_name(f".{key.name}.tmp")
    tmp.unlink(missing_ok=True)
    tmp.with_suffix(".tmp.pub").unlink(missing_ok=True)
    run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(tmp)], capture=True)
    tmp.with_suffix(".tmp.pub").rename(key.with_name(key.name + ".pub"))
    tmp.rename(key)


def ensure_key(name: str) -> Path:
    key = lab_dir(name) / "id_ed25519"
    if not key.exists():
        keygen(key, f"gpufleet-lab-{name}")
    write_atomic(lab_dir(name) / "authorized_keys", key.with_suffix(".pub").read_text(), mode=0o644)
    return key


HOST_KEY_IN_NODE = "/etc/ssh/lab_host_ed25519_key"


def _sshd_dropin(port: int) -> str:
    return (
        "# Per-node sshd settings (bind-mounted by python -m lab up): nodes share the machine's network.\n"
        f"Port {port}\n"
        f"HostKey {HOST_KEY_IN_NODE}\n"
        "ListenAddress 127.0.0.1\n"
        "PermitRootLogin prohibit-password\n"
        "PasswordAuthentication no\n"
        "AuthorizedKeysFile .ssh/authorized_keys /etc/ssh/lab_authorized_keys\n"
        "UseDNS no\n"
    )


def host_key_path(name: str, node: str) -> Path:
    """The node's own ed25519 host key on the controller (its .pub beside it), made when the node is created."""
    return lab_dir(name) / "nodes" / node / "ssh_host_ed25519_key"


def known_hosts_path(name: str) -> Path:
    return lab_dir(name) / "known_hosts"


def write_known_hosts(name: str, state: dict) -> Path:
    """One line per node, `[127.0.0.1]:<ssh port> <its host key>`: the inventory pins each node's own key."""
    lines = []
    for node, nd in sorted(state["nodes"].items()):
        pub = host_key_path(name, node).with_name("ssh_host_ed25519_key.pub")
        if pub.exists():
            keytype, blob = pub.read_text().split()[:2]
            lines.append(f"[127.0.0.1]:{nd['ssh_port']} {keytype} {blob}")
    path = known_hosts_path(name)
    write_atomic(path, "".join(line + "\n" for line in lines), mode=0o644)
    return path


def ssh_pin_args(name: str) -> list[str]:
    """ssh options that accept exactly the lab's recorded host keys (no trust on first use, no /dev/null)."""
    return ["-o", f"UserKnownHostsFile={known_hosts_path(name)}", "-o", "StrictHostKeyChecking=yes"]


def load_state(name: str) -> dict:
    path = lab_dir(name) / "nodes.json"
    return json.loads(path.read_text()) if path.exists() else {"nodes": {}}


def ssh_ports(name: str) -> list[int]:
    """The SSH ports of lab ``name``'s nodes (what a bench meters the SSH traffic of)."""
    return [nd["ssh_port"] for nd in load_state(name)["nodes"].values()]


def container_state(node: str) -> str | None:
    res = podman("inspect", "--format", "{{.State.Status}}", node, check=False)
    return res.stdout.strip() if res.returncode == 0 else None


def _create(node: str, name: str, ssh_port: int, ref: str) -> None:
    ndir = lab_dir(name) / "nodes" / node
    ndir.mkdir(parents=True, exist_ok=True)
    write_atomic(ndir / "10-lab.conf", _sshd_dropin(ssh_port), mode=0o644)
    # A new host, a new identity: a fresh host key for every node created (also for a replaced one).
    keygen(host_key_path(name, node), f"root@{node}")
    podman(
        "run",
        "-d",
        "--name",
        node,
        "--hostname",
        node,
        "--network",
        "host",
        "--systemd",
        "always",
        "--label",
        f"{LABEL}={name}",
        "-v",
        f"{ndir / '10-lab.conf'}:/etc/ssh/sshd_config.d/10-lab.conf:ro",
        "-v",
        f"{lab_dir(name) / 'authorized_keys'}:/etc/ssh/lab_authorized_keys:ro",
        "-v",
        f"{host_key_path(name, node)}:{HOST_KEY_IN_NODE}:ro",
        ref,
        "/sbin/init",
    )


def node_exec(node: str, cmd: str | list[str], check: bool = True, input: str | None = None, timeout=None):
    """Run a command in a node through podman exec (shell string or argv)."""
    argv = ["bash", "-lc", cmd] if isinstance(cmd, str) else list(cmd)
    return podman(
        "exec", *(["-i"] if input is not None else []), node, *argv, check=check, input=input, timeout=timeout
    )


def wait_booted(node: str, ssh_port: int, key: Path, pin: list[str], timeout: float = BOOT_TIMEOUT) -> str:
    deadline = time.monotonic() + timeout
    state = ""
    while time.monotonic() < deadline:
        res = node_exec(node, ["systemctl", "is-system-running"], check=False)
        state = res.stdout.strip()
        if state in ("running", "degraded"):
            break
        time.sleep(0.3)
    else:
        raise RuntimeError(f"{node}: systemd did not finish booting in {timeout:.0f}s (state {state!r})")
    while not port_open(ssh_port):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{node}: sshd is not listening on 127.0.0.1:{ssh_port}")
        time.sleep(0.2)
    ssh = [
        "ssh",
        "-i",
        str(key),
        "-p",
        str(ssh_port),
        "-o",
        "BatchMode=yes",
        *pin,
        "-o",
        "ConnectTimeout=5",
        "root@127.0.0.1",
        "true",
    ]
    while (res := run(ssh, check=False, capture=True)).returncode != 0:
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"{node}: ssh root@127.0.0.1:{ssh_port} with the lab key and the node's pinned host key "
                f"({' '.join(pin)}) failed: {res.stderr.strip()}"
            )
        time.sleep(0.3)
    return state


def seed(node: str, serving_port: int, urls: dict[str, str]) -> dict:
    res = node_exec(
        node,
        [
            "python3",
            "-",
            "--redist-url",
            urls["redist"],
            "--index-url",
            urls["lab-main"],
            "--serving-port",
            str(serving_port),
        ],
        input=SEED_SCRIPT.read_text(),
        check=False,
        timeout=600,
    )
    if res.returncode != 0:
        raise RuntimeError(f"{node}: seeding the old stack failed (rc={res.returncode}):\n{res.stdout}\n{res.stderr}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def up(n: int, name: str = "lab", ports: dict[str, int] | None = None, do_seed: bool = True) -> dict:
    t0 = time.monotonic()
    ports = ports or mirror_ports()
    urls = mirror_urls(ports)
    ref = image.build_image()
    if do_seed:
        # Cached builds cost milliseconds; a changed lab wheel tree (e.g. lab-sglang) is rebuilt before seeding.
        mirrors.build()
        mirrors.start(ports)
    key = ensure_key(name)
    (lab_dir(name) / "controller").mkdir(parents=True, exist_ok=True)
    state = load_state(name)
    taken = {p for nd in state["nodes"].values() for p in (nd["ssh_port"], nd["serving_port"])}
    taken |= set(ports.values())
    wanted = node_names(name, n)
    fresh = []
    for node in wanted:
        nd = state["nodes"].get(node)
        if nd and container_state(node) == "running":
            continue
        if container_state(node) is not None:
            remove(node)
        ssh_port = free_port(taken)
        taken.add(ssh_port)
        serving_port = free_port(taken)
        taken.add(serving_port)
        state["nodes"][node] = {"ssh_port": ssh_port, "serving_port": serving_port, "seeded": False}
        _create(node, name, ssh_port, ref)
        fresh.append(node)
    # Extra nodes from an earlier, bigger `up` stay out of this inventory but keep running.
    state["nodes"] = {k: v for k, v in state["nodes"].items() if k in wanted or container_state(k) == "running"}
    t_created = time.monotonic()
    write_known_hosts(name, state)
    pin = ssh_pin_args(name)

    def _ready(node: str) -> None:
        nd = state["nodes"][node]
        nd["boot_state"] = wait_booted(node, nd["ssh_port"], key, pin)
        if do_seed and not nd.get("seeded"):
            nd["seed"] = seed(node, nd["serving_port"], urls)
            nd["seeded"] = True

    with ThreadPoolExecutor(max_workers=max(1, len(wanted))) as pool:
        list(pool.map(_ready, wanted))
    state.update({"name": name, "mirror_ports": ports, "image": ref})
    write_atomic(lab_dir(name) / "nodes.json", json.dumps(state, indent=2) + "\n")
    inv = write_inventory(name, wanted, state, key, urls)
    timing = {"create_s": round(t_created - t0, 1), "total_s": round(time.monotonic() - t0, 1)}
    log(f"lab {name}: {len(wanted)} nodes up ({len(fresh)} new) in {timing['total_s']}s; inventory {inv}")
    return {"name": name, "nodes": wanted, "inventory": str(inv), "timing": timing}


STATIC_GROUP_VARS = REPO / "inventories" / "lab" / "group_vars" / "gpufleet_lab.yml"


def inventory_data(name: str, nodes: list[str], state: dict, key: Path, urls: dict[str, str]) -> dict:
    """Self-contained inventory: the committed static group vars plus this run's ports, key and mirrors."""
    hosts = {
        node: {
            "ansible_host": "127.0.0.1",
            "ansible_port": state["nodes"][node]["ssh_port"],
            "gpufleet_serving_port": state["nodes"][node]["serving_port"],
            "gpufleet_lab_container": node,
        }
        for node in nodes
    }
    group_vars = yaml.safe_load(STATIC_GROUP_VARS.read_text()) or {}
    group_vars.update(
        {
            "ansible_ssh_private_key_file": str(key),
            # Each node's own host key, pinned: a node answering with another key is refused, as on a fleet.
            "ansible_ssh_common_args": " ".join(ssh_pin_args(name)),
            "gpufleet_controller_dir": str(lab_dir(name) / "controller"),
            "gpufleet_index_urls": {"lab-main": urls["lab-main"], "lab-stale": urls["lab-stale"]},
            "gpufleet_redist_url": urls["redist"],
            "gpufleet_lab_name": name,
        }
    )
    return {"all": {"children": {"gpufleet_lab": {"hosts": hosts, "vars": group_vars}}}}


def write_inventory(name: str, nodes: list[str], state: dict, key: Path, urls: dict[str, str]) -> Path:
    data = inventory_data(name, nodes, state, key, urls)
    head = "---\n# Generated by `python -m lab up`; do not edit (rewritten on every up).\n"
    path = lab_dir(name) / "inventory.yml"
    write_atomic(path, head + yaml.safe_dump(data, sort_keys=False))
    if name == "lab":
        # inventories/lab/group_vars/ applies there already: keep only this run's values in hosts.yml.
        static = yaml.safe_load(STATIC_GROUP_VARS.read_text()) or {}
        group = data["all"]["children"]["gpufleet_lab"]
        group["vars"] = {k: v for k, v in group["vars"].items() if k not in static}
        write_atomic(DEFAULT_INVENTORY, head + yaml.safe_dump(data, sort_keys=False))
    return path


def list_nodes(name: str | None = None) -> list[dict]:
    flt = f"label={LABEL}={name}" if name else f"label={LABEL}"
    res = podman("ps", "-a", "--filter", flt, "--format", "json")
    rows = json.loads(res.stdout or "[]")
    return [{"name": r["Names"][0], "state": r.get("State"), "lab": r.get("Labels", {}).get(LABEL)} for r in rows]


def remove(node: str) -> None:
    """``podman rm -f -t 1``, retried: podman 4.3 can fail with "container state improper" when the
    container stops on its own while being killed."""
    for _ in range(5):
        res = podman("rm", "-f", "-t", "1", node, check=False)
        if container_state(node) is None:
            return
        time.sleep(0.5)
    raise RuntimeError(f"{node}: podman rm failed: {res.stderr.strip()}")


def down(name: str = "lab") -> list[str]:
    gone = [r["name"] for r in list_nodes(name)]
    with ThreadPoolExecutor(max_workers=max(1, len(gone))) as pool:
        list(pool.map(remove, gone))
    for path in (lab_dir(name) / "nodes.json", lab_dir(name) / "inventory.yml"):
        path.unlink(missing_ok=True)
    shutil.rmtree(lab_dir(name) / "nodes", ignore_errors=True)
    if name == "lab":
        DEFAULT_INVENTORY.unlink(missing_ok=True)
    log(f"lab {name}: removed {len(gone)} nodes")
    return gone


def status(name: str | None = None) -> dict:
    out = {"nodes": []}
    for row in list_nodes(name):
        st = load_state(row["lab"]).get("nodes", {}).get(row["name"], {})
        out["nodes"].append(
            {**row, "ssh_port": st.get("ssh_port"), "serving_port": st.get("serving_port"), "seeded": st.get("seeded")}
        )
    return out
