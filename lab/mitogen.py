# Copyright: (c) 2026, gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Mitogen for Ansible against the lab: whether it can run here, the environment that selects its strategy, and
the trace that proves a run went through it.

Nothing in the collection uses Mitogen; the lab's Mitogen test and bench/mitogen.py run the playbooks under it.
"""

from __future__ import annotations

import threading
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from lab.common import podman

STRATEGY = "mitogen_linear"
# Mitogen's first stage on a target execs '<python>(mitogen:<parent>)' (mitogen/parent.py _first_stage): the
# interpreter that then runs every task of the run on that host carries it as argv[0].
MARK = b"(mitogen:"


def unsupported() -> str | None:
    """Why Mitogen cannot run here, else None: not installed, or outside the ansible-core range it declares itself
    (``ansible_mitogen.loaders``: ANSIBLE_VERSION_MIN, which importing it enforces, and ANSIBLE_VERSION_MAX where
    the release has one)."""
    try:
        release = version("mitogen")
        import ansible_mitogen.utils
    except (ImportError, PackageNotFoundError) as exc:
        return f"mitogen is not installed ({exc}); requirements/tooling.txt pins it"
    from ansible.errors import AnsibleError

    core = ansible_mitogen.utils.ansible_version[:2]
    try:
        from ansible_mitogen import loaders
    except AnsibleError as exc:
        return f"mitogen {release} does not support ansible-core {core}: {exc}"
    top = getattr(loaders, "ANSIBLE_VERSION_MAX", None)
    if top and core > tuple(top)[:2]:
        return f"mitogen {release} supports ansible-core up to {top}; this is {core}"
    return None


def strategy_env() -> dict[str, str]:
    """Environment that runs a playbook under Mitogen's linear strategy (the plugin folder of the installed
    ansible_mitogen)."""
    import ansible_mitogen

    plugins = Path(ansible_mitogen.__file__).resolve().parent / "plugins" / "strategy"
    return {"ANSIBLE_STRATEGY_PLUGINS": str(plugins), "ANSIBLE_STRATEGY": STRATEGY}


class Trace:
    """Mitogen interpreters on one lab node, sampled from this machine's /proc while a run lasts.

    A lab node is a container on this machine: its processes are in /proc, told apart from every other lab's by the
    container's id in their cgroup. ``seen`` holds the argv[0] of each one found (``/usr/bin/python3(mitogen:…)``);
    a run under any other strategy leaves it empty."""

    def __init__(self, container: str, interval: float = 0.5):
        self.container_id = podman("inspect", "--format", "{{.Id}}", container).stdout.strip()
        self.interval, self.seen = interval, set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def sample(self) -> None:
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                argv0 = (proc / "cmdline").read_bytes().split(b"\0", 1)[0]
                if MARK in argv0 and self.container_id in (proc / "cgroup").read_text():
                    self.seen.add(argv0.decode(errors="replace"))
            except OSError:  # the process ended while being read
                continue

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def __enter__(self) -> Trace:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
