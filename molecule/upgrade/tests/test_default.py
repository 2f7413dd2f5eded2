# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""After upgrade.yml and its second run: the node serves the lab profile (cu130 venv behind current, CUDA_HOME on the
new toolkit beside the kept 12.8), the old venv and toolkit are kept, the run recorded its outcome and released its
lock, and check mode finds the host in sync."""

from __future__ import annotations

import json
import os
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

ROOT = "/opt/gpufleet/serving"
NEW_CUDA, OLD_CUDA = "/usr/local/cuda-13.0", "/usr/local/cuda-12.8"
NODE = "molecule-upgrade"


def test_current_is_the_verified_venv_of_the_lab_profile(verified_current):
    assert verified_current.startswith(f"{ROOT}/venvs/lab-") and "cu128" not in verified_current


def test_new_toolkit_beside_the_old_one_link_kept(host):
    assert "release 13.0, V13.0.88" in host.check_output(f"{NEW_CUDA}/bin/nvcc --version")
    assert "release 12.8, V12.8.93" in host.check_output(f"{OLD_CUDA}/bin/nvcc --version")
    assert host.check_output("readlink -f /usr/local/cuda") == OLD_CUDA


def test_the_server_runs_the_new_stack(host, server_info, verified_current):
    lab = server_info()["gpufleet_lab"]
    assert lab["stack"] == "new"
    assert lab["cuda_home"] == NEW_CUDA
    assert lab["distributions"]["lab-torch"] == "2.11.0+cu130"
    assert lab["distributions"]["lab-sglang"] == "0.5.9"
    assert lab["sys_prefix_realpath"] == verified_current
    assert lab["pid"] == int(host.check_output("systemctl show gpufleet-serving -p MainPID --value"))
    assert f'CUDA_HOME="{NEW_CUDA}"' in host.file("/etc/gpufleet/gpufleet-serving.env").content_string.splitlines()


def test_the_old_stack_is_kept_and_backed_up(host):
    assert host.file(f"{ROOT}/venvs/lab-cu128-seed/bin/python").exists
    (bid,) = host.check_output("ls -1 /var/lib/gpufleet/backups").split()
    manifest = json.loads(host.file(f"/var/lib/gpufleet/backups/{bid}/manifest.json").content_string)
    assert manifest["snapshot"]["venv"]["path"] == f"{ROOT}/venvs/lab-cu128-seed"
    assert manifest["state"]["cuda_home"] == OLD_CUDA


def test_the_run_recorded_its_outcome_and_released_the_lock(host):
    state = json.loads(host.file("/var/lib/gpufleet/state.json").content_string)
    assert state["result"] == "upgraded", state
    assert not host.file("/var/lib/gpufleet/upgrade.lock").exists
    prom = host.file("/var/lib/prometheus/node-exporter/gpufleet.prom").content_string
    metrics = {f.name: f.samples for f in text_string_to_metric_families(prom)}
    assert metrics["gpufleet_stack_info"][0].labels == {"profile": "lab", "at_profile": "true"}, prom
    assert metrics["gpufleet_last_run_ok"][0].value == 1, prom
    runs = Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"]) / "controller" / "runs"
    reports = [json.loads(p.read_text()) for p in runs.glob(f"*/{NODE}.json")]
    assert {r["outcome_kind"] for r in reports} >= {"upgraded"}, reports


def test_check_mode_finds_the_host_in_sync(check_run):
    assert check_run.stats[NODE]["changed"] == 0, [t.task for t in check_run.changed_tasks()]
    report = check_run.task("Publish the host's report", host=NODE).res["ansible_facts"]["gpufleet_upgrade_report"]
    assert report["outcome_kind"] == "in_sync", report
