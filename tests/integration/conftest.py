# Copyright: (c) 2026, gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Lab fixtures for integration tests.

- ``lab_mirrors`` (session): builds the mirrors if needed, starts them; the last session out stops them, only if
  a test session started them (never under pytest-xdist, where other workers may still use them; never those
  ``make mirrors`` started, which molecule may be using).
- ``lab_fleet`` (module): factory ``lab_fleet(n, name=None)`` bringing up n seeded nodes; the default name
  comes from the test module (``it-<module>``); every name gets the test run's suffix (``-<RUN>``: the pid of the
  pytest process that started the run, shared by its xdist workers; ``GPUFLEET_LAB_RUN`` sets it), so two runs of
  the same module (two checkouts, or a run that outlived its session) never share nodes or tear down each other's;
  every lab it made goes down after the module.
- ``run_playbook``: ``lab.harness.run_playbook`` (ansible-runner, the repo's ansible.cfg).
- ``node_exec``: ``node_exec(node, cmd)`` through podman exec.

Mark integration tests ``@pytest.mark.integration`` (registered in pyproject.toml).
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from lab import mirrors, nodes  # noqa: E402
from lab.common import MIRRORS, mirror_ports, mirror_urls  # noqa: E402
from lab.harness import PlaybookResult, TaskResult  # noqa: E402
from lab.harness import run_playbook as _run_playbook  # noqa: E402

os.environ.setdefault("CONTAINERS_CONF", str(REPO / "lab" / "containers.conf"))
# Set in the process that starts the run, before xdist starts its workers, which inherit it.
RUN = os.environ.setdefault("GPUFLEET_LAB_RUN", str(os.getpid() % 100000))

__all__ = ["Fleet", "LabMirrors", "PlaybookResult", "TaskResult"]


def _lab_available() -> str | None:
    missing = [t for t in ("podman", "ssh") if shutil.which(t) is None]
    return f"lab needs {missing}" if missing else None


@dataclass
class LabMirrors:
    ports: dict[str, int]
    urls: dict[str, str]
    started_here: bool

    def requests(self, name: str, since: float = 0.0) -> list[dict]:
        """Requests a mirror served (JSON lines of its access log): path, status, bytes, ts."""
        return mirrors.read_access_log(name, self.ports[name], since)

    def bytes_served(self, name: str, since: float = 0.0) -> int:
        return sum(r.get("bytes") or 0 for r in self.requests(name, since))


@dataclass
class Fleet:
    name: str
    nodes: list[str]
    inventory: Path
    hosts: dict[str, dict]  # node -> {"ssh_port", "serving_port"}
    key: Path

    def serving_port(self, node: str) -> int:
        return self.hosts[node]["serving_port"]


@pytest.fixture(scope="session")
def lab_mirrors() -> LabMirrors:
    reason = _lab_available()
    if reason:
        pytest.skip(reason)
    ports = mirror_ports()
    MIRRORS.mkdir(parents=True, exist_ok=True)
    # One process at a time builds and starts: xdist workers and parallel sessions share the mirrors. Each session
    # counts itself in .fixture.users; the last one out stops the mirrors (never one that another session uses), and
    # only mirrors a test session started (.fixture.started): those `make mirrors` started serve molecule and the
    # demo beside the tests, and outlive them.
    started_by = MIRRORS / ".fixture.started"
    with (MIRRORS / ".fixture.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        mirrors.build()
        started = bool(mirrors.start(ports)["started"])
        if started:
            started_by.write_text(f"{os.getpid()}\n")
        _mirror_users(+1)
    yield LabMirrors(ports=ports, urls=mirror_urls(ports), started_here=started)
    with (MIRRORS / ".fixture.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _mirror_users(-1) == 0 and not os.environ.get("PYTEST_XDIST_WORKER") and started_by.exists():
            mirrors.stop(ports)
            started_by.unlink()


def _mirror_users(delta: int) -> int:
    """Sessions using the mirrors now (live pids in .fixture.users), after adding or removing this one."""
    path = MIRRORS / ".fixture.users"
    pids = {int(p) for p in path.read_text().split()} if path.exists() else set()
    pids = {p for p in pids if Path(f"/proc/{p}").exists()}
    if delta > 0:
        pids.add(os.getpid())
    else:
        pids.discard(os.getpid())
    path.write_text("".join(f"{p}\n" for p in sorted(pids)))
    return len(pids)


def _default_name(request) -> str:
    mod = request.module.__name__.rsplit(".", 1)[-1]
    mod = re.sub(r"^test_", "", mod)
    return "it-" + re.sub(r"[^a-z0-9]+", "-", mod.lower()).strip("-")


@pytest.fixture(scope="module")
def lab_fleet(request, lab_mirrors):
    made: list[str] = []
    cache: dict[tuple[str, int], Fleet] = {}

    def factory(n: int = 2, name: str | None = None, seed: bool = True) -> Fleet:
        name = f"{name or _default_name(request)}-{RUN}"
        if (name, n) in cache:
            return cache[(name, n)]
        out = nodes.up(n, name, lab_mirrors.ports, do_seed=seed)
        made.append(name)
        state = nodes.load_state(name)
        fleet = Fleet(
            name=name,
            nodes=out["nodes"],
            inventory=Path(out["inventory"]),
            hosts={k: state["nodes"][k] for k in out["nodes"]},
            key=nodes.lab_dir(name) / "id_ed25519",
        )
        cache[(name, n)] = fleet
        return fleet

    yield factory
    if os.environ.get("LAB_KEEP"):
        return
    for name in made:
        nodes.down(name)


@pytest.fixture
def run_playbook():
    return _run_playbook


@pytest.fixture
def node_exec():
    def _exec(node: str, cmd, check: bool = False):
        return nodes.node_exec(node, cmd, check=check)

    return _exec
