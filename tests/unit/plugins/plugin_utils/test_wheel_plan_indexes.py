# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""make_lock with uv against two loopback indexes (lab.serve pypi servers on wheels made here), offline.

The first index stands for a CUDA index (PyTorch's cu130): the profile's torch and its CUDA libraries, and an old
torchao only, as that index mirrors common dependencies in old versions. The second stands for the default index:
the application, a newer torchao, a torchvision built for another torch, and a kernel that pulls CUDA 12
libraries. The lock must take each dependency at its best version over both indexes (or from the one index the
profile names for it), pair torchvision with the torch the plan chose, and hold one CUDA major.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _index as ix
from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _lock_rules as lr
from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _wheel_plan as wp
from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _wheels as w

REPO = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(REPO))

from lab.mirrors import PrivateServer  # noqa: E402
from lab.tiny_wheel import tiny_wheel as make_wheel  # noqa: E402

TARGET = w.Target("3.11", "x86_64-manylinux_2_28")
COMPILED = "cp311-cp311-manylinux_2_17_x86_64"


@pytest.fixture(scope="module")
def indexes(tmp_path_factory):
    # uv is pinned in requirements/tooling.txt: its absence is a broken set-up, not a reason to skip.
    assert shutil.which("uv", path=str(Path(sys.executable).parent)), "no uv beside this Python: run make setup"
    base = tmp_path_factory.mktemp("indexes")
    cuda, default = base / "cuda", base / "default"
    cuda.mkdir()
    default.mkdir()
    make_wheel(cuda, "torch", "2.11.0+cu130", ["nvidia-cuda-runtime==13.0.96"], tag=COMPILED)
    make_wheel(cuda, "nvidia-cuda-runtime", "13.0.96", tag=COMPILED)
    make_wheel(cuda, "torchvision", "0.26.0+cu130", ["torch==2.11.0"], tag=COMPILED)
    make_wheel(cuda, "torchao", "0.9.0")
    make_wheel(default, "torchao", "0.9.0")
    # A newer torch on an index the profile does not name for torch: never taken.
    make_wheel(default, "torch", "2.11.1+cu130", ["nvidia-cuda-runtime==13.0.96"], tag=COMPILED)
    make_wheel(default, "torchao", "0.15.0")
    # Built against torch 2.12: the override on torch frees it from that pin, and it is the newest torchvision.
    make_wheel(default, "torchvision", "0.27.0", ["torch==2.12.0"], tag=COMPILED)
    make_wheel(default, "nvidia-cublas-cu12", "12.8.4.1", tag=COMPILED)
    make_wheel(default, "old-kernel", "1.0", ["nvidia-cublas-cu12"], tag=COMPILED)
    # The application pins the torch of its own release (sglang 0.5.9 pins torch==2.9.1) and any torchao.
    make_wheel(default, "serve-app", "1.0", ["torch==2.9.1", "torchao>=0.9", "torchvision"])
    make_wheel(default, "serve-app", "2.0", ["torch==2.9.1", "torchao>=0.9", "torchvision", "old-kernel"])
    make_wheel(default, "uv", "0.13.8")
    servers = {}
    try:
        for name, root in (("cuda", cuda), ("default", default)):
            args = ["--kind", "pypi", "--root", str(root)]
            servers[name] = PrivateServer(f"plan-{name}", args, "/simple", base / f"{name}.jsonl")
        yield servers
    finally:
        for server in servers.values():
            server.stop()


def profile(indexes, app="==1.0", **wheels_extra):
    wheels = {
        "indexes": [{"name": "cuda", "url": indexes["cuda"].url}, {"name": "default", "url": indexes["default"].url}],
        "packages": [
            {"name": "torch", "spec": ">=2.11,<2.12", "local_tag": "cu130", "indexes": ["cuda"]},
            {"name": "serve-app", "spec": app, "indexes": ["default"]},
        ],
        "overrides": [{"requirement": "torch>=2.11,<2.12", "reason": "the CUDA 13 build"}],
        "rules": {},
    }
    for key, value in wheels_extra.items():
        (wheels["rules"] if key in ("companions", "cuda_exceptions") else wheels)[key] = value
    return {"name": "idx-test", "python": {"version": "3.11"}, "cuda": {"version": "13.0"}, "wheels": wheels}


TV_OVERRIDE = {"requirement": "torchvision>=0.26,<0.27", "reason": "torchvision 0.26 is built for torch 2.11"}


def plan(prof):
    return wp.make_lock(prof, TARGET, ix.Fetcher(timeout=10), wp.find_uv(), tools=())


def versions(lock):
    return {e["name"]: (e["version"], e["url"].split("/")[3] if e["url"].startswith("http") else "") for e in lock}


def test_a_dependency_resolves_at_its_best_version_over_all_indexes_and_pairs_are_checked(indexes):
    prof = profile(indexes)
    # The newest torchvision fits once the override frees it from torch==2.12.0, and it is the wrong one.
    with pytest.raises(lr.LockRefused) as err:
        plan(prof)
    assert "torchvision 0.27.0 does not pair with torch 2.11.0+cu130 (its METADATA pairs torch==2.12.0)" in str(
        err.value
    )
    prof["wheels"]["overrides"].append(TV_OVERRIDE)
    lock = plan(prof)
    got = {e["name"]: e for e in lock["packages"]}
    # The cuda index, first in the profile, mirrors torchao 0.9.0 only: uv's first-index rule would stop there.
    assert got["torchao"]["version"] == "0.15.0" and got["torchao"]["url"].startswith(indexes["default"].url[:-7])
    assert got["torch"]["version"] == "2.11.0+cu130" and got["torch"]["index"] == "cuda"
    assert got["torchvision"]["version"] == "0.26.0+cu130"
    assert lock["lock_rules"]["companions"] == [
        {
            "package": "torchvision",
            "version": "0.26.0+cu130",
            "with": "torch",
            "with_version": "2.11.0+cu130",
            "by": "its METADATA: torch==2.11.0",
            "ok": True,
        }
    ]
    cuda = lock["lock_rules"]["cuda"]
    assert {n: r["cuda"] for n, r in cuda.items()} == {"torch": 13, "torchvision": 13, "nvidia-cuda-runtime": 13}
    text = "\n".join(wp.report_lines(lock))
    assert "CUDA builds: nvidia-cuda-runtime 13.0.96 (CUDA 13, version 13.0.96" in text


def test_a_dependency_the_profile_pins_to_one_index_comes_from_it(indexes):
    prof = profile(indexes, dependency_indexes={"torchao": "cuda"})
    prof["wheels"]["overrides"].append(TV_OVERRIDE)
    got = {e["name"]: e for e in plan(prof)["packages"]}
    assert got["torchao"]["version"] == "0.9.0" and got["torchao"]["url"].startswith(indexes["cuda"].url[:-7])


def test_a_profile_package_keeps_the_file_the_plan_chose_from_its_own_indexes(indexes):
    """The default index has a newer torch build than the cuda index, the only one the profile names for torch,
    and serve-app pins 2.9.1: every torch requirement goes to the chosen file, never to another index's torch."""
    prof = profile(indexes)
    prof["wheels"]["overrides"].append(TV_OVERRIDE)
    lock = plan(prof)
    torch = next(e for e in lock["packages"] if e["name"] == "torch")
    assert torch["role"] == "profile" and torch["url"].startswith(indexes["cuda"].url[:-7])
    assert torch["version"] == "2.11.0+cu130"


def test_a_cuda_12_library_is_refused_naming_the_chain_unless_the_profile_allows_it(indexes):
    prof = profile(indexes, app="==2.0")
    prof["wheels"]["overrides"].append(TV_OVERRIDE)
    with pytest.raises(lr.LockRefused) as err:
        plan(prof)
    assert (
        "nvidia-cublas-cu12 12.8.4.1 is built for CUDA 12 (name suffix -cu12), the profile's CUDA is 13.0; required by"
        " old-kernel 1.0 (chain: nvidia-cublas-cu12 <- old-kernel 1.0 <- serve-app 2.0 <- the plan's requirements)"
    ) in str(err.value)
    prof["wheels"]["rules"]["cuda_exceptions"] = [{"package": "nvidia-cublas-cu12", "reason": "old-kernel's CPU path"}]
    lock = plan(prof)
    assert lock["lock_rules"]["cuda_allowed"][0].endswith(
        "allowed by wheels.rules.cuda_exceptions: old-kernel's CPU path"
    )
    assert "CUDA exception: nvidia-cublas-cu12 12.8.4.1 is built for CUDA 12" in "\n".join(wp.report_lines(lock))
