# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Shared by every scenario's testinfra verifier (pytest loads this conftest for molecule/<scenario>/tests).

Molecule's own `check` step runs converge with --check and never looks at what changed, so the check-mode promise
(a converged node: check mode reports no change) is a test here: `converge(check=True)` runs the scenario's
converge playbook again through ansible-runner, with the inventory and ansible.cfg molecule made for the scenario.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.request
from pathlib import Path

import pytest
import testinfra

PROJECT = Path(os.environ.get("MOLECULE_PROJECT_DIRECTORY", Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(PROJECT))

from lab.harness import PlaybookResult, run_playbook  # noqa: E402


def _converge(check: bool = False) -> PlaybookResult:
    scenario = Path(os.environ["MOLECULE_SCENARIO_DIRECTORY"])
    inventory = Path(os.environ["MOLECULE_INVENTORY_FILE"]).parent
    # Molecule's environment (its ansible.cfg, collections and roles paths) over the checkout's ansible.cfg.
    env = {k: v for k, v in os.environ.items() if k.startswith(("ANSIBLE_", "MOLECULE_"))}
    return run_playbook(scenario / "converge.yml", inventory, check=check, diff=check, envvars=env)


def changed_tasks(result: PlaybookResult) -> list[str]:
    return [f"{t.host}: {t.task}" for t in result.changed_tasks()]


@pytest.fixture(scope="session")
def converge():
    """Run the scenario's converge playbook again: converge(check=True) is the check-mode run."""
    return _converge


@pytest.fixture(scope="session")
def check_run() -> PlaybookResult:
    """One check-mode run of converge on the converged node (shared by the tests of a scenario)."""
    result = _converge(check=True)
    assert result.rc == 0, str(result)
    return result


@pytest.fixture(scope="module")
def host(_testinfra_host):
    """The node over `podman exec` (testinfra's podman backend). Testinfra knows no Ansible podman connection: through
    the molecule inventory every command would be an ad-hoc Ansible run of seconds."""
    return testinfra.get_host(f"podman://{_testinfra_host.backend.host}")


@pytest.fixture(scope="module")
def hostvars(_testinfra_host) -> dict:
    """The node's variables in the molecule inventory (base config + scenario)."""
    return _testinfra_host.ansible.get_variables()


@pytest.fixture(scope="module")
def serving_port(hostvars) -> int:
    return int(hostvars["gpufleet_serving_port"])


@pytest.fixture(scope="module")
def server_info(serving_port):
    """What the lab stand-in server on the node reports (GET /get_server_info; the node shares this machine's
    loopback)."""

    def read() -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{serving_port}/get_server_info", timeout=10) as resp:
            return json.loads(resp.read())

    return read


@pytest.fixture(scope="module")
def verified_current(host) -> str:
    """The venv behind the serving root's current link, which must carry venv_rebuild's verified marker (the lock
    hash, whose first 12 characters end the venv's name)."""
    path = host.check_output("readlink -f /opt/gpufleet/serving/current")
    marker = host.file(f"{path}/.gpufleet-verified").content_string.strip()
    assert len(marker) == 64 and path.endswith(marker[:12]), (path, marker)
    return path
