# Copyright: (c) 2026, gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a run assumes is said at its start, an unknown enumerated value is refused before any host changes, and a
rollback without a limit asks for gpufleet_rollback_all. The hosts are unreachable on purpose: everything asserted
here happens on the controller, before any host is contacted (no lab needed)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration]

REPO = Path(__file__).resolve().parents[2]


def playbook(tmp_path, name, *args):
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(
        "all:\n  vars: {ansible_host: 127.0.0.1, ansible_port: 1, ansible_connection: ssh}\n  hosts:\n"
        "    h1: {gpufleet_stack_profile: lab}\n    h2: {}\n    h3: {}\n",
        encoding="utf-8",
    )
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
    cmd = [
        "ansible-playbook",
        "-i",
        str(inventory),
        f"playbooks/{name}",
        "-e",
        f"gpufleet_controller_dir={tmp_path}/ctl",
    ]
    return subprocess.run(cmd + list(args), cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False)


def test_upgrade_says_what_it_assumed_and_refuses_an_unknown_fault_hook(tmp_path):
    run = playbook(tmp_path, "upgrade.yml", "-e", "gpufleet_fault_inject=after_switch")
    assert run.returncode != 0
    out = run.stdout
    assert "gpufleet: assumed gpufleet_stack_profile = cu130 (default of role stack) for 2 hosts: h2, h3" in out
    assert "gpufleet: assumed gpufleet_stack_profile = lab (inventory) for 1 host: h1" in out
    assert f"gpufleet: assumed gpufleet_controller_dir = {tmp_path}/ctl (extra vars) for 3 hosts: h1, h2, h3" in out
    assert "value of gpufleet_fault_inject must be one of: none, after_preflight," in out + run.stderr
    assert "got: after_switch" in out + run.stderr
    assert "Give the run one id" not in out, "the run went on past the check"


@pytest.mark.parametrize("value", ["drain=sideways", "distribution=carrier-pigeon", "fault_action=explode"])
def test_upgrade_refuses_any_unknown_enumerated_value(tmp_path, value):
    run = playbook(tmp_path, "upgrade.yml", "-e", f"gpufleet_{value}")
    name, got = value.split("=")
    assert run.returncode != 0 and f"value of gpufleet_{name} must be one of:" in run.stdout + run.stderr
    assert f"got: {got}" in run.stdout + run.stderr


def test_rollback_without_a_limit_asks_for_rollback_all(tmp_path):
    run = playbook(tmp_path, "rollback.yml")
    assert run.returncode != 0
    assert "rollback.yml was given no limit: it would roll back every host of the inventory (3 hosts: h1, h2, h3)" in (
        run.stdout
    )
    assert "-e gpufleet_rollback_all=true. Nothing was changed." in run.stdout
    assert "Give the run one id" not in run.stdout
    for args in (["-l", "h1"], ["-e", "gpufleet_rollback_all=true"]):
        run = playbook(tmp_path, "rollback.yml", *args)
        assert "was given no limit" not in run.stdout, args
        assert "UNREACHABLE" in run.stdout, run.stdout[-2000:]
