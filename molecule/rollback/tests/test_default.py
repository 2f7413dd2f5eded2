# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""After upgrade.yml (prepare) and rollback.yml (converge, then idempotence: nothing left to roll back): the old
stack serves again from the seed venv with its packages, CUDA_HOME on 12.8, the 12.8 toolkit byte-identical."""

from __future__ import annotations

import json

ROOT = "/opt/gpufleet/serving"
SEED_VENV = f"{ROOT}/venvs/lab-cu128-seed"
OLD_CUDA = "/usr/local/cuda-12.8"
NODE = "molecule-rollback"
TREE_SUM = (
    "cd {path} && {{ find . -printf '%p %y %m %l\\n' | LC_ALL=C sort;"
    " find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum; }} | sha256sum"
)


def test_current_is_the_old_venv_with_its_packages(host):
    assert host.check_output(f"readlink -f {ROOT}/current") == SEED_VENV
    freeze = host.check_output(f"{ROOT}/current/bin/python -m pip freeze --all | LC_ALL=C sort")
    assert freeze == host.file("/root/old-venv.freeze").content_string.strip()
    assert "lab-torch==2.9.1+cu128" in freeze.splitlines()


def test_cuda_wiring_is_the_old_one_and_the_toolkit_byte_identical(host):
    assert host.check_output("readlink /usr/local/cuda") == OLD_CUDA
    recorded = host.file("/root/cuda-12.8.sum").content_string.strip()
    assert host.check_output(TREE_SUM.format(path=OLD_CUDA)) == recorded
    env = host.file("/etc/gpufleet/gpufleet-serving.env").content_string.splitlines()
    assert f"CUDA_HOME={OLD_CUDA}" in env


def test_the_old_stack_serves(host, server_info):
    lab = server_info()["gpufleet_lab"]
    assert lab["stack"] == "old"
    assert lab["cuda_home"] == OLD_CUDA
    assert lab["sys_prefix_realpath"] == SEED_VENV
    assert lab["distributions"]["lab-torch"] == "2.9.1+cu128"
    assert lab["distributions"]["lab-sglang"] == "0.5.3"
    assert lab["pid"] == int(host.check_output("systemctl show gpufleet-serving -p MainPID --value"))


def test_the_rollback_is_recorded(host):
    state = json.loads(host.file("/var/lib/gpufleet/state.json").content_string)
    assert state["result"] == "rolled_back", state
    assert not host.file("/var/lib/gpufleet/upgrade.lock").exists


def test_check_mode_reports_no_change(check_run):
    assert check_run.stats[NODE]["changed"] == 0, [t.task for t in check_run.changed_tasks()]
    outcome = check_run.task("Say what the rollback did", host=NODE).res["msg"]
    assert "nothing to roll back" in outcome, outcome
