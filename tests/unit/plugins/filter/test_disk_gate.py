# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filter disk_gate (role preflight's free space gate): the new venv sized from the lock's installed sizes when it
has them, else from the current venv, said in the message; the toolkit from the present one; one check per mount."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.upgrade.plugins.filter import disk

GIB = 1 << 30
DF_APART = ("Mounted on Avail", f"/opt {100 * GIB}", f"/srv {8 * GIB}")
DF_ONE = ["Mounted on Avail", f"/ {15 * GIB}", f"/ {15 * GIB}"]
DU = [f"{4 * GIB}\t/srv/gpufleet/venvs/old", f"{6 * GIB}\t/opt/cuda-12.8"]


def lock(*sizes):
    return {
        "venv_name": "cu130-abc",
        "packages": [{"name": f"p{i}", "installed_size": s} for i, s in enumerate(sizes)],
        "tools": [],
    }


def gate(df=DF_APART, **kw):
    args = {
        "host": "gpu1",
        "measured": DU,
        "venv_path": "/srv/gpufleet/venvs/old",
        "cuda_path": "/opt/cuda-12.8",
        "toolkit_installed": False,
    }
    return disk.disk_gate(list(df), **{**args, **kw})


def test_the_new_venv_is_sized_from_the_lock_when_every_wheel_has_its_installed_size():
    # The real cu130 case: a 4 GiB venv now, a stack that installs 7 GiB: the current venv's size passes wrongly.
    verdict = gate(lock=lock(6 * GIB, 1 * GIB))
    assert verdict["need_venv"] == int(7 * GIB * 1.5)
    assert verdict["failures"] == [
        f"gpu1: 8.00 GiB free on /srv, 10.50 GiB needed for the new venv (venv sized from the lock cu130-abc: 2"
        f" wheels, {7 * GIB} bytes installed, times 1.5); fix: free space on /srv (old toolkits, old venvs, caches)"
        " or set preflight_toolkit_free_bytes / preflight_venv_free_bytes"
    ]
    assert verdict["report"] == "failed"
    assert gate()["failures"] == []  # from the current venv: 6 GiB needed, 8 free


def test_a_lock_with_a_wheel_of_unknown_size_falls_back_to_the_current_venv_and_says_so():
    partial = lock(6 * GIB)
    partial["packages"].append({"name": "x"})
    verdict = gate(lock=partial)
    assert verdict["need_venv"] == int(4 * GIB * 1.5)
    assert verdict["venv_sized"] == (
        f"from the current venv ({4 * GIB} bytes, times 1.5; 1 wheel(s) of the lock without an installed size)"
    )
    assert gate()["venv_sized"].endswith("; no lock yet)")
    assert verdict["report"].startswith(f"ok: /opt {100 * GIB}, /srv {8 * GIB} bytes free; needs {int(9 * GIB)}")


def test_one_file_system_must_hold_the_toolkit_and_the_venv_together():
    verdict = gate(df=DF_ONE, lock=lock(5 * GIB))
    need = int(6 * GIB * 1.5) + int(5 * GIB * 1.5)
    assert verdict["need_toolkit"] + verdict["need_venv"] == need
    assert len(verdict["failures"]) == 1
    assert verdict["failures"][0].startswith("gpu1: 15.00 GiB free on /, 16.50 GiB needed for the new toolkit and")


def test_set_bytes_win_and_an_installed_toolkit_needs_none():
    verdict = gate(toolkit_installed=True, venv_free_bytes=GIB, lock=lock(50 * GIB))
    assert (verdict["need_toolkit"], verdict["need_venv"]) == (0, GIB)
    assert verdict["venv_sized"] == "as preflight_venv_free_bytes sets"
    assert gate(toolkit_free_bytes=123)["need_toolkit"] == 123


def test_df_output_that_is_not_mount_and_bytes_is_refused_naming_the_host_and_the_fix():
    with pytest.raises(AnsibleFilterError, match="gpu1: df printed '/srv 8G', not 'MOUNT FREE_BYTES'; fix: make GNU"):
        gate(df=["Mounted on Avail", f"/opt {GIB}", "/srv 8G"])
    with pytest.raises(AnsibleFilterError, match="df printed 1 mount line"):
        gate(df=["Mounted on Avail", f"/opt {GIB}"])
