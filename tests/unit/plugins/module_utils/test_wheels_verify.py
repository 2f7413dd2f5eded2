# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The venv checks of role venv_rebuild (roles/venv_rebuild/files/verify_venv.py), run against this Python."""

from __future__ import annotations

import importlib.metadata as md
import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[4] / "roles" / "venv_rebuild" / "files" / "verify_venv.py"


def verify(spec):
    proc = subprocess.run([sys.executable, str(SCRIPT), json.dumps(spec)], capture_output=True, text=True, check=False)
    return proc.returncode, json.loads(proc.stdout)


def test_installed_set_that_matches_passes_and_finds_import_names():
    rc, out = verify({"packages": {"PyYAML": md.version("PyYAML")}, "imports": ["PyYAML", "packaging"]})
    assert rc == 0 and out["ok"], out
    assert out["checks"]["imports"]["PyYAML"] == ["yaml"]
    assert out["checks"]["imports"]["packaging"] == ["packaging"]


def test_version_other_than_the_lock_fails():
    rc, out = verify({"packages": {"packaging": "0.1"}})
    assert rc == 1 and out["failures"] == [f"packaging: installed {md.version('packaging')}, the lock says 0.1"]


def test_missing_local_tag_fails():
    rc, out = verify({"packages": {}, "local_tags": {"packaging": "cu130"}})
    assert rc == 1 and "CUDA local tag '(none)', the profile requires 'cu130'" in out["failures"][0]


def test_same_version_group_that_differs_fails():
    rc, out = verify({"packages": {}, "same_version": [["packaging", "PyYAML"]]})
    assert rc == 1 and out["failures"][0].startswith("same-version group does not match: packaging")


def test_torch_like_cuda_is_compared_with_the_profile(tmp_path):
    # a stand-in distribution whose module has version.cuda, installed into a throwaway path
    site = tmp_path / "site"
    (site / "fake_torch").mkdir(parents=True)
    (site / "fake_torch" / "__init__.py").write_text("")
    (site / "fake_torch" / "version.py").write_text("cuda = '12.8'\n")
    info = site / "fake_torch-2.11.0+cu130.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-torch\nVersion: 2.11.0+cu130\n")
    (info / "RECORD").write_text("fake_torch/__init__.py,,\nfake_torch/version.py,,\n")
    spec = {
        "packages": {"fake-torch": "2.11.0+cu130"},
        "imports": ["fake-torch"],
        "torch_like": ["fake-torch"],
        "cuda_version": "13.0",
        "local_tags": {"fake-torch": "cu130"},
    }
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), json.dumps(spec)],
        capture_output=True,
        text=True,
        check=False,
        env={"PYTHONPATH": str(site)},
    )
    out = json.loads(proc.stdout)
    assert proc.returncode == 1
    assert out["failures"] == ["fake_torch.version.cuda is '12.8', the profile's CUDA is '13.0'"]


def fake_dist(site, name, version, requires=()):
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"] + [
        f"Requires-Dist: {r}" for r in requires
    ]
    (info / "METADATA").write_text("\n".join(lines) + "\n")
    (info / "RECORD").write_text("")
    (info / "INSTALLER").write_text("uv\n")
    (info / "WHEEL").write_text("Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")


def test_pip_check_conflicts_are_accepted_only_for_overridden_packages(tmp_path):
    """A real venv (uv venv) holding what an overridden stack holds: sglang pinning torch 2.9.1 next to torch 2.11."""
    uv = Path(sys.executable).with_name("uv")
    venv = tmp_path / "venv"
    subprocess.run([str(uv), "venv", "-q", "--python", sys.executable, str(venv)], check=True)
    python = venv / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    fake_dist(site, "sglang", "0.5.9", ["torch==2.9.1", "flashinfer-python==0.6.3"])
    fake_dist(site, "torch", "2.11.0+cu130")
    fake_dist(site, "flashinfer-python", "0.6.4")
    spec = {"packages": {"torch": "2.11.0+cu130", "flashinfer-python": "0.6.4"}}

    def run(overrides):
        proc = subprocess.run(
            [str(python), str(SCRIPT), json.dumps(dict(spec, overrides=overrides)), str(uv)],
            capture_output=True,
            text=True,
            check=False,
        )
        return proc.returncode, json.loads(proc.stdout)

    rc, out = run(["torch", "flashinfer_python"])
    assert rc == 0 and out["ok"], out
    assert sorted(out["checks"]["pip_check_overridden"]) == [
        "The package `sglang` requires `flashinfer-python==0.6.3`, but `0.6.4` is installed",
        "The package `sglang` requires `torch==2.9.1`, but `2.11.0+cu130` is installed",
    ]
    rc, out = run(["torch"])
    assert rc == 1 and out["failures"] == [
        "uv pip check: The package `sglang` requires `flashinfer-python==0.6.3`, but `0.6.4` is installed"
    ]
    rc, out = run([])
    assert rc == 1 and "torch==2.9.1" in out["failures"][0] and "flashinfer-python==0.6.3" in out["failures"][0]


def test_what_a_package_prints_at_import_does_not_corrupt_the_answer(tmp_path):
    # A package that prints at import time, from Python and from C (os.write on fd 1, as a C extension's printf):
    # the answer on stdout is still the one JSON document, the prints go to stderr.
    site = tmp_path / "site"
    (site / "noisy").mkdir(parents=True)
    (site / "noisy" / "__init__.py").write_text(
        "import os\nprint('[noisy] loading')\nos.write(1, b'[noisy] from C\\n')\n"
    )
    info = site / "noisy-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: noisy\nVersion: 1.0\n")
    (info / "RECORD").write_text("noisy/__init__.py,,\n")
    spec = {"packages": {"noisy": "1.0"}, "imports": ["noisy"]}
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), json.dumps(spec)],
        capture_output=True,
        text=True,
        check=False,
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc
    assert json.loads(proc.stdout)["checks"]["imports"] == {"noisy": ["noisy"]}, proc.stdout
    assert "[noisy] loading" in proc.stderr and "[noisy] from C" in proc.stderr, proc.stderr


def _module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("verify_venv_under_test", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_package_that_wants_a_cuda_device_is_not_judged_only_where_the_driver_is_absent():
    vv = _module()
    exc = ImportError("The NVIDIA driver does not expose a usable CUDA device. See the package's host prerequisites")
    failure, unjudged = vv.judge_import_error("deep_ep", "sgl-deep-ep", exc, False, no_driver=True)
    assert failure is None and unjudged.startswith("needs the NVIDIA driver (libcuda.so.1), not judged"), unjudged
    # The driver is there: the same words are a real failure; so is any other error on a host without one.
    failure = vv.judge_import_error("deep_ep", "sgl-deep-ep", exc, False, no_driver=False)[0]
    assert failure.startswith("import deep_ep (from sgl-deep-ep) failed: ImportError: The NVIDIA driver"), failure
    failure = vv.judge_import_error("x", "x", ImportError("No module named 'y'"), False, no_driver=True)[0]
    assert failure == "import x (from x) failed: ImportError: No module named 'y'"
    # A GPU required: wanting the driver fails, naming the fix.
    failure = vv.judge_import_error("deep_ep", "sgl-deep-ep", exc, True, no_driver=True)[0]
    assert "fix: install the NVIDIA driver" in failure


def test_torch_like_cuda_is_read_from_the_modules_that_have_a_version(tmp_path):
    # torch ships torch, functorch and torchgen: only torch has version.cuda, and that is enough.
    site = tmp_path / "site"
    for mod in ("faketorch", "fakefunctorch"):
        (site / mod).mkdir(parents=True)
        (site / mod / "__init__.py").write_text("")
    (site / "faketorch" / "version.py").write_text("cuda = '13.0'\n")
    info = site / "faketorch-2.11.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: faketorch\nVersion: 2.11.0\n")
    (info / "top_level.txt").write_text("faketorch\nfakefunctorch\n")
    (info / "RECORD").write_text("faketorch/__init__.py,,\nfakefunctorch/__init__.py,,\n")
    spec = {
        "packages": {"faketorch": "2.11.0"},
        "imports": ["faketorch"],
        "torch_like": ["faketorch"],
        "cuda_version": "13.0",
    }
    env = {"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"}
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), json.dumps(spec)], capture_output=True, text=True, check=False, env=env
    )
    out = json.loads(proc.stdout)
    assert proc.returncode == 0 and out["checks"]["faketorch.version.cuda"] == "13.0", out
    (site / "faketorch" / "version.py").unlink()
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), json.dumps(spec)], capture_output=True, text=True, check=False, env=env
    )
    assert json.loads(proc.stdout)["failures"] == [
        "faketorch: none of its modules (fakefunctorch, faketorch) has version.cuda"
    ]
