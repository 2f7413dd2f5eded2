# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""After converge: current points to the verified cu130 venv, the unit serves from it, the old venv is intact."""

from __future__ import annotations

import json
import time

ROOT = "/opt/gpufleet/serving"
PORT = 38297  # gpufleet_serving_port of the scenario (molecule.yml)


def current(host):
    return host.check_output(f"readlink -f {ROOT}/current")


def test_current_points_to_a_verified_venv_of_the_lab_profile(verified_current):
    assert verified_current.startswith(f"{ROOT}/venvs/lab-") and "cu128" not in verified_current


def test_new_venv_holds_the_cu130_set(host):
    out = host.check_output(f"{ROOT}/current/bin/python -c 'import lab_torch.version as v; print(v.cuda)'")
    assert out == "13.0"
    freeze = host.check_output(f"/opt/gpufleet/tools/bin/uv pip freeze --python {ROOT}/current/bin/python")
    assert "lab-flashinfer-jit-cache==0.6.4+cu130" in freeze and "lab-sgl-kernel==0.3.21+cu130" in freeze


def test_old_venv_is_kept_and_unchanged(host):
    old = host.file("/root/old-venv.path").content_string.strip()
    assert old != current(host)
    recorded = host.file("/root/old-venv.sum").content_string.strip()
    now = host.check_output(f"cd {old} && find . -printf '%p %y %s %T@\\n' | LC_ALL=C sort | sha256sum")
    assert now == recorded


def test_serving_unit_runs_from_the_new_venv(host):
    assert host.service("gpufleet-serving").is_running
    for _attempt in range(60):
        res = host.run(
            f"python3 -c \"import urllib.request as u; print(u.urlopen('http://127.0.0.1:{PORT}/get_server_info').read().decode())\""
        )
        if res.rc == 0:
            break
        time.sleep(1)
    info = json.loads(res.stdout)["gpufleet_lab"]
    assert info["distributions"]["lab-torch"] == "2.11.0+cu130"
    assert info["sys_executable"] == f"{ROOT}/current/bin/python"


def test_check_mode_reports_no_change(check_run):
    assert all(s["changed"] == 0 for s in check_run.stats.values()), [t.task for t in check_run.changed_tasks()]
