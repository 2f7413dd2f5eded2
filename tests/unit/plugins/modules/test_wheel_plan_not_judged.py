# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Check mode and the run give the same verdict, or check mode says what it did not judge: a compiled dependency
whose CUDA only its shared objects tell is read once the plan fetched it; a plan in check mode has not downloaded
it and says so on the console (the action's warnings) and in the report. A real loopback index (lab.serve's pypi
server) serves the wheels."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
from test_wheel_plan import make_action

REPO = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(REPO))

from lab.mirrors import PrivateServer  # noqa: E402
from lab.tiny_wheel import tiny_wheel  # noqa: E402

pytestmark = pytest.mark.skipif(
    shutil.which("uv", path=str(Path(sys.executable).parent)) is None, reason="needs uv beside the tests' Python"
)
TAG = "cp311-cp311-manylinux_2_17_x86_64"


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    base = tmp_path_factory.mktemp("not-judged")
    root = base / "default"
    root.mkdir()
    tiny_wheel(root, "serve-app", "1.0", ["app-kernel>=1"])
    tiny_wheel(root, "app-kernel", "1.0", tag=TAG)
    server = PrivateServer("not-judged-default", ["--kind", "pypi", "--root", str(root)], "/simple", base / "d.jsonl")
    try:
        yield server.url
    finally:
        server.stop()


def plan(url, tmp_path, check_mode):
    prof = {
        "name": "not-judged",
        "python": {"version": "3.11"},
        "cuda": {"version": "13.0"},
        "wheels": {
            "indexes": [{"name": "default", "url": url}],
            "packages": [{"name": "serve-app", "spec": "==1.0", "indexes": ["default"]}],
            "rules": {},
        },
    }
    args = {
        "profile": prof,
        "controller_dir": str(tmp_path / "ctl"),
        "tools": [],
        "lock_file": str(tmp_path / "fleet.lock.yml"),
        "timeout": 10,
    }
    return make_action(args, check_mode=check_mode, diff=True).run(task_vars={"inventory_hostname": "ctl"})


def test_check_mode_says_which_wheels_it_did_not_read_and_the_run_reads_them(index, tmp_path):
    checked = plan(index, tmp_path, check_mode=True)
    assert not checked.get("failed"), checked.get("msg")
    line = (
        "not judged: the CUDA of 1 compiled wheel(s) whose name and version do not tell it, because their wheels are"
        " not in the controller's wheelhouse and their shared objects were not read (a plan in check mode or without"
        " the fetch does not download them; the plan that fetches reads them and refuses one built for another CUDA,"
        " or a mix of CUDA majors not chosen at import): app-kernel 1.0"
    )
    assert checked["warnings"] == [line]  # the console: Ansible prints it as [WARNING]
    assert line in checked["report"]
    applied = plan(index, tmp_path, check_mode=False)
    assert not applied.get("failed"), applied.get("msg")
    assert "warnings" not in applied
    assert not any(r.startswith("not judged") for r in applied["report"])
    # Check mode again, the wheelhouse now holding the wheel: it is read, the same verdict, nothing left unsaid.
    again = plan(index, tmp_path, check_mode=True)
    assert "warnings" not in again, again.get("warnings")
