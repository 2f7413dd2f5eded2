# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""After converge: the dead run's lock was taken over for this run and is still held (the role leaves it to the
run's end); the gates changed nothing else on the seeded host."""

from __future__ import annotations

import json
import socket

LOCK = "/var/lib/gpufleet/upgrade.lock"


def test_the_lock_is_this_run_s(host):
    lock = json.loads(host.file(LOCK).content_string)
    # prepare left the lock of run molecule-killed-run, whose process is gone: replaced, not refused.
    assert lock["run_id"] == "molecule-preflight"
    assert lock["controller"] == socket.gethostname()


def test_the_gates_wrote_nothing_else(host):
    assert host.check_output("ls -A /var/lib/gpufleet") == "upgrade.lock"
    assert host.check_output("readlink /opt/gpufleet/serving/current") == "venvs/lab-cu128-seed"
    assert host.check_output("readlink /usr/local/cuda") == "/usr/local/cuda-12.8"
    assert not host.file("/usr/local/cuda-13.0").exists
    assert host.service("gpufleet-serving").is_running


def test_check_mode_reports_no_change(check_run):
    assert check_run.stats["molecule-preflight"]["changed"] == 0, [t.task for t in check_run.changed_tasks()]
    judged = check_run.task("Judge every gate and publish what this run must do first")
    report = judged.res["ansible_facts"]["preflight_report"]
    assert set(report) >= {"lock", "state", "python", "gpu", "disk", "mirrors", "drained"}
    assert report["gpu"] == "skipped: no GPU"
    assert all(not str(v).startswith("failed") for v in report.values()), report
