# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""After converge: the role's unit and environment replaced the seed's hand-written ones, the unit runs (restarted
after they changed) and the stand-in server it runs answers with the profile's flags and CUDA_HOME."""

from __future__ import annotations

import shlex

UNIT = "/etc/systemd/system/gpufleet-serving.service"
ENV = "/etc/gpufleet/gpufleet-serving.env"
OLD_CUDA = "/usr/local/cuda-12.8"


def exec_start(host) -> list[str]:
    line = next(x for x in host.file(UNIT).content_string.splitlines() if x.startswith("ExecStart="))
    return shlex.split(line.removeprefix("ExecStart="))


def test_unit_is_the_role_s_with_the_profile_s_command(host, serving_port):
    assert "role gpufleet.upgrade.serving" in host.file(UNIT).content_string
    argv = exec_start(host)
    assert argv[:3] == ["/opt/gpufleet/serving/current/bin/python", "-m", "lab_sglang"]
    assert argv[argv.index("--port") + 1] == str(serving_port)
    assert argv[argv.index("--speculative-algorithm") + 1] == "EAGLE3"
    assert host.file(UNIT).mode == 0o644


def test_environment_names_the_profile_s_toolkit(host):
    env = host.file(ENV)
    assert env.mode == 0o640
    lines = env.content_string.splitlines()
    assert f'CUDA_HOME="{OLD_CUDA}"' in lines
    assert any(x.startswith(f'PATH="{OLD_CUDA}/bin:') for x in lines)


def test_unit_is_enabled_and_runs_the_files_as_written(host):
    svc = host.service("gpufleet-serving")
    assert svc.is_enabled and svc.is_running
    # systemd loaded the files on disk (daemon-reload before the restart), not the seed's.
    assert host.check_output("systemctl show gpufleet-serving -p NeedDaemonReload --value") == "no"
    assert host.check_output("systemctl show gpufleet-serving -p FragmentPath --value") == UNIT


def test_the_server_runs_from_current_with_the_role_s_environment(host, server_info):
    info = server_info()
    lab = info["gpufleet_lab"]
    assert lab["cuda_home"] == OLD_CUDA
    assert lab["sys_prefix"] == "/opt/gpufleet/serving/current"
    assert lab["distributions"]["lab-torch"] == "2.9.1+cu128"
    assert info["speculative_algorithm"] == "EAGLE3" and info["speculative_num_draft_tokens"] == 16
    # The process that answers is the unit's main process, started after the role wrote the unit (a restart).
    main_pid = int(host.check_output("systemctl show gpufleet-serving -p MainPID --value"))
    assert lab["pid"] == main_pid
    unit_written = float(host.check_output(f"stat -c %Y {UNIT}"))
    assert lab["started_at"] >= unit_written


def test_check_mode_reports_no_change(check_run):
    assert check_run.stats["molecule-serving"]["changed"] == 0, [t.task for t in check_run.changed_tasks()]
