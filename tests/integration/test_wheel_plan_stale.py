# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The pivotal situation of the CUDA 13 upgrade, reproduced with two real index servers (pypiserver) on loopback.

One index (standing in for PyTorch's cu130 nightly index) carries only a months-old flashinfer 0.2.14 build; the
other (flashinfer's own cu130 index) carries a recent 0.6.4. The plan must pick 0.6.4 and name the stale source.
The wheelhouses are built here, so the test does not depend on the lab.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _index as ix
from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _lock
from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _wheel_plan as wp
from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _wheels as w

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from lab.tiny_wheel import tiny_wheel  # noqa: E402

DAY = 86400
TARGET = w.Target("3.11", "x86_64-manylinux_2_36")
PYPI_SERVER = Path(sys.executable).with_name("pypi-server")


def build_wheel(folder: Path, name: str, version: str, age_days: int, requires=(), meta_version=None) -> Path:
    """A small but real wheel (installable by uv), its file dated ``age_days`` ago (the index's Last-Modified)."""
    path = tiny_wheel(folder, name, version, requires=requires, meta_version=meta_version)
    stamp = time.time() - age_days * DAY
    os.utime(path, (stamp, stamp))
    return path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class IndexServer:
    def __init__(self, root: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/simple"
        self.log = root.with_suffix(".log")
        with self.log.open("w") as log:
            self.proc = subprocess.Popen(
                [str(PYPI_SERVER), "run", "-i", "127.0.0.1", "-p", str(self.port), "--disable-fallback", str(root)],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                urllib.request.urlopen(self.url + "/", timeout=2).read()
                return
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"pypiserver on {self.url} did not start: {self.log.read_text()[-2000:]}")

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=10)


@pytest.fixture(scope="module")
def indexes(tmp_path_factory):
    if not PYPI_SERVER.exists() or shutil.which("uv", path=str(PYPI_SERVER.parent)) is None:
        pytest.skip("needs pypiserver and uv in the tooling venv")
    base = tmp_path_factory.mktemp("indexes")
    nightly, own = base / "nightly", base / "own"
    nightly.mkdir()
    own.mkdir()
    # The nightly index stopped at 0.2.14 months ago; flashinfer's own index has a recent 0.6.4 (and the old one).
    for pkg in ("flashinfer-python", "flashinfer-cubin"):
        build_wheel(nightly, pkg, "0.2.14", age_days=250)
        build_wheel(own, pkg, "0.2.14", age_days=250)
        build_wheel(own, pkg, "0.6.4", age_days=20)
    build_wheel(nightly, "flashinfer-jit-cache", "0.2.14+cu130", age_days=250)
    build_wheel(own, "flashinfer-jit-cache", "0.6.4+cu130", age_days=20)
    build_wheel(own, "flashinfer-jit-cache", "0.6.3+cu130", age_days=40, meta_version="0.6.3")
    build_wheel(own, "six", "1.17.0", age_days=300)
    # An application that pins an older flashinfer and a six the index does not carry, as sglang 0.5.9 pins
    # flashinfer 0.6.3 and torch 2.9.1: only overrides make a plan with flashinfer 0.6.4 possible.
    build_wheel(own, "serve-app", "1.0", age_days=10, requires=("flashinfer-python==0.2.14", "six==1.16.0"))
    build_wheel(own, "uv", "0.13.8", age_days=30)
    servers = {"nightly": IndexServer(nightly), "own": IndexServer(own)}
    yield servers
    for server in servers.values():
        server.stop()


def profile(indexes, spec=">=0.2", allow_stale=False, order=("nightly", "own")):
    pkgs = [
        {"name": n, "spec": spec, "indexes": list(order)}
        for n in ("flashinfer-python", "flashinfer-cubin", "flashinfer-jit-cache")
    ]
    pkgs[2]["local_tag"] = "cu130"
    return {
        "name": "stale-test",
        "python": {"version": "3.11"},
        "cuda": {"version": "13.0"},
        "wheels": {
            "indexes": [{"name": k, "url": s.url} for k, s in indexes.items()],
            "packages": pkgs,
            "rules": {
                "same_version": [["flashinfer-python", "flashinfer-cubin", "flashinfer-jit-cache"]],
                "max_age_days": 240,
                "stale_gap_days": 60,
                "allow_stale": allow_stale,
            },
        },
    }


def test_plan_picks_the_recent_build_and_names_the_stale_source(indexes):
    fetcher = ix.Fetcher(timeout=10)
    lock = wp.make_lock(profile(indexes), TARGET, fetcher, wp.find_uv())
    chosen = {e["name"]: e for e in lock["packages"] if e["role"] == "profile"}
    assert {e["version"] for e in chosen.values()} == {"0.6.4", "0.6.4+cu130"}
    assert all(e["index"] == "own" for e in chosen.values())
    assert all(e["url"].startswith(indexes["own"].url.rsplit("/simple", 1)[0]) for e in chosen.values())
    report = lock["report"]["flashinfer-jit-cache"]
    assert report["stale_sources"] == ["nightly"]
    assert "days behind index 'own'" in report["sources"]["nightly"]["reason"]
    text = "\n".join(wp.report_lines(lock))
    assert "source nightly: 1 file(s), newest build" in text and "STALE" in text
    # dates came from the files' Last-Modified (pypiserver has no PEP 700 upload-time)
    assert {c["date_source"] for c in report["candidates"]} == {"last-modified"}


def test_metadata_disagreeing_with_file_name_is_rejected_on_a_real_index(indexes):
    prof = profile(indexes, spec="<0.6.4", order=("own",))
    prof["wheels"]["rules"]["same_version"] = []
    prof["wheels"]["packages"] = [prof["wheels"]["packages"][2]]
    with pytest.raises(w.PlanError) as err:
        wp.make_lock(prof, TARGET, ix.Fetcher(timeout=10), wp.find_uv())
    assert "METADATA version 0.6.3 disagrees with the file name's 0.6.3+cu130" in str(err.value)


def test_stale_only_source_is_refused_with_candidates(indexes):
    with pytest.raises(w.PlanError) as err:
        wp.make_lock(
            profile(indexes, spec="==0.2.14", order=("nightly",)), TARGET, ix.Fetcher(timeout=10), wp.find_uv()
        )
    msg = str(err.value)
    assert "no build of flashinfer-python satisfies spec ==0.2.14" in msg
    assert "stale source 'nightly'" in msg and "max_age_days 240" in msg


def test_allow_stale_takes_the_old_build_and_still_reports_it(indexes):
    lock = wp.make_lock(
        profile(indexes, spec="==0.2.14", allow_stale=True, order=("nightly",)),
        TARGET,
        ix.Fetcher(timeout=10),
        wp.find_uv(),
    )
    assert {e["version"] for e in lock["packages"] if e["role"] == "profile"} == {"0.2.14", "0.2.14+cu130"}
    assert lock["report"]["flashinfer-python"]["stale_sources"] == ["nightly"]


def test_an_unreachable_index_is_passed_over_and_named_when_another_named_index_serves(indexes):
    prof = profile(indexes)
    prof["wheels"]["indexes"][0]["url"] = f"http://127.0.0.1:{free_port()}/simple"
    lock = wp.make_lock(prof, TARGET, ix.Fetcher(timeout=5), wp.find_uv())
    assert {p["name"] for p in lock["packages"]} >= {"flashinfer-python", "flashinfer-cubin"}
    said = [wp.refusal_line(r) for r in lock["index_refusals"]]
    assert said and all("index 'nightly'" in line and "could not be reached" in line for line in said)


def test_index_unreachable_names_the_index_when_it_is_the_packages_only_one(indexes):
    prof = profile(indexes, order=("nightly",))
    prof["wheels"]["indexes"][0]["url"] = f"http://127.0.0.1:{free_port()}/simple"
    with pytest.raises(
        w.PlanError, match=r"every index the profile names for it refused it: index 'nightly' .* could not be reached"
    ):
        wp.make_lock(prof, TARGET, ix.Fetcher(timeout=5), wp.find_uv())


def test_python_version_without_wheels_fails(indexes, tmp_path):
    # Only py3-none-any wheels here: make one cp312-only wheel the sole candidate.
    prof = profile(indexes)
    prof["wheels"]["packages"] = [{"name": "six", "spec": ">=1", "indexes": ["own"]}]
    with pytest.raises(w.PlanError, match=r"requires Python|do not fit"):
        wp.make_lock(prof, w.Target("2.7", TARGET.platform), ix.Fetcher(timeout=10), wp.find_uv())


def test_wheelhouse_fetches_each_wheel_once_and_reuses_it(indexes, tmp_path):
    fetcher = ix.Fetcher(timeout=10)
    lock = wp.make_lock(profile(indexes), TARGET, fetcher, wp.find_uv(), wheelhouse=str(tmp_path / "wh"))
    wp.fetch_wheelhouse(fetcher, lock, str(tmp_path / "wh"))
    names = sorted(e["filename"] for e in lock["packages"] + lock["tools"])
    # chosen wheels while planning (uv resolved their dependencies from those files), the rest after: once each
    assert sorted(u.rsplit("/", 1)[-1] for u in fetcher.downloads) == names
    assert all(e["url"].startswith("http://127.0.0.1:") for e in lock["packages"])
    second_fetcher = ix.Fetcher(timeout=10)
    second = wp.fetch_wheelhouse(second_fetcher, lock, str(tmp_path / "wh"))
    assert second["fetched"] == [] and sorted(second["reused"]) == names
    assert second_fetcher.requests == 0
    assert wp.verify_wheelhouse(lock, str(tmp_path / "wh")) == []


def override_profile(indexes, overrides):
    prof = profile(indexes, spec="==0.6.4", order=("own",))
    prof["wheels"]["packages"] = [
        prof["wheels"]["packages"][0],
        {"name": "serve-app", "spec": "==1.0", "indexes": ["own"]},
    ]
    prof["wheels"]["rules"]["same_version"] = []
    prof["wheels"]["overrides"] = overrides
    return prof


def test_overrides_replace_pins_in_the_plan_and_in_uvs_resolution_and_the_venv_passes_its_check(indexes, tmp_path):
    with pytest.raises(w.PlanError, match=r"requires flashinfer-python==0\.2\.14, but no eligible"):
        wp.make_lock(override_profile(indexes, []), TARGET, ix.Fetcher(timeout=10), wp.find_uv())
    overrides = [
        {"requirement": "flashinfer-python==0.6.4", "reason": "the stack runs 0.6.4"},
        {"requirement": "six>=1.17", "reason": "1.16 is not on the index"},
    ]
    lock = wp.make_lock(override_profile(indexes, overrides), TARGET, ix.Fetcher(timeout=10), wp.find_uv())
    versions = {e["name"]: (e["version"], e["role"]) for e in lock["packages"]}
    # six is no profile package: uv's --overrides replaced serve-app's six==1.16.0.
    assert versions == {
        "flashinfer-python": ("0.6.4", "profile"),
        "serve-app": ("1.0", "profile"),
        "six": ("1.17.0", "dependency"),
    }
    assert lock["overrides"] == [
        {
            "requirement": "flashinfer-python==0.6.4",
            "reason": "the stack runs 0.6.4",
            "replaced": [{"by": "serve_app-1.0-py3-none-any.whl", "pin": "flashinfer-python==0.2.14"}],
        },
        {
            "requirement": "six>=1.17",
            "reason": "1.16 is not on the index",
            "replaced": [{"by": "serve_app-1.0-py3-none-any.whl", "pin": "six==1.16.0"}],
        },
    ]
    assert "override six>=1.17: 1.16 is not on the index; replaces six==1.16.0 (by serve_app-1.0-py3-none-any.whl)" in (
        wp.report_lines(lock)
    )
    # Installed as the hosts install (uv pip sync --require-hashes from the lock), the venv passes verify_venv with
    # the overrides and fails without them: uv pip check itself knows no overrides.
    uv = wp.find_uv()
    venv = tmp_path / "venv"
    subprocess.run([uv, "venv", "-q", "--python", sys.executable, str(venv)], check=True)
    wheelhouse = tmp_path / "wh"
    wp.fetch_wheelhouse(ix.Fetcher(timeout=10), lock, str(wheelhouse))
    reqs = tmp_path / "requirements.txt"
    reqs.write_text(_lock.requirements_text(lock["packages"]))
    subprocess.run(
        [
            uv,
            "pip",
            "sync",
            "-q",
            "--no-config",
            "--python",
            str(venv / "bin" / "python"),
            "--require-hashes",
            "--no-index",
            "--find-links",
            str(wheelhouse),
            str(reqs),
        ],
        check=True,
    )
    script = REPO / "roles" / "venv_rebuild" / "files" / "verify_venv.py"
    spec = {"packages": {e["name"]: e["version"] for e in lock["packages"]}}

    def verify(names):
        proc = subprocess.run(
            [str(venv / "bin" / "python"), str(script), json.dumps(dict(spec, overrides=names)), uv],
            capture_output=True,
            text=True,
            check=False,
        )
        return proc.returncode, json.loads(proc.stdout)

    rc, out = verify(["flashinfer-python", "six"])
    assert rc == 0, out
    assert len(out["checks"]["pip_check_overridden"]) == 2
    rc, out = verify([])
    assert rc == 1 and "requires `six==1.16.0`" in out["failures"][0]
