# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The host side of role venv_rebuild (plugins/module_utils/_venv_host.py), run here against a real uv, a wheel
made by the test and a loopback HTTP server standing for the fleet cache."""

from __future__ import annotations

import base64
import functools
import hashlib
import http.server
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import threading
import zipfile
from pathlib import Path

import pytest
from ansible.module_utils.urls import open_url

from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _lock

FILES = Path(__file__).resolve().parents[3] / "roles" / "venv_rebuild" / "files"
SCRIPT = Path(__file__).resolve().parents[3] / "plugins" / "module_utils" / "_venv_host.py"
UV = shutil.which("uv") or str(Path(sys.executable).with_name("uv"))

_spec = importlib.util.spec_from_file_location("venv_host", SCRIPT)
vh = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(vh)


def make_wheel(folder: Path, name: str = "gf_probe", version: str = "1.0", requires=(), extra=None) -> Path:
    """A pure-Python wheel of one package (``__init__`` and ``cold``, which nothing imports), its RECORD with real
    hashes; ``extra``: more files of the package ({path in the package: bytes}), ``requires``: its Requires-Dist."""
    dist = f"{name}-{version}.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    files = {
        f"{name}/__init__.py": f"VERSION = {version!r}\n".encode(),
        f"{name}/cold.py": b"def unused():\n    return None\n",
        f"{dist}/METADATA": (metadata + "".join(f"Requires-Dist: {r}\n" for r in requires)).encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files.update({f"{name}/{path}": data for path, data in (extra or {}).items()})
    rows = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        rows.append(f"{path},sha256={digest},{len(data)}")
    rows.append(f"{dist}/RECORD,,")
    files[f"{dist}/RECORD"] = ("\n".join(rows) + "\n").encode()
    wheel = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for path, data in files.items():
            zf.writestr(path, data)
    return wheel


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def lock_entries(wheels):
    return [
        {
            "name": w.name.split("-")[0].replace("_", "-"),
            "version": w.name.split("-")[1],
            "filename": w.name,
            "sha256": sha(w),
        }
        for w in wheels
    ]


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        return


@pytest.fixture
def cache(tmp_path):
    """A loopback HTTP server over a folder (the fleet cache's wheels mount); yields (folder, base URL)."""
    root = tmp_path / "cache"
    root.mkdir()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(QuietHandler, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield root, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def host(tmp_path):
    """A serving root, a tools venv whose uv is this machine's, and a wheel in the fleet cache's folder."""
    serving = tmp_path / "serving"
    tools = tmp_path / "tools"
    (tools / "bin").mkdir(parents=True)
    os.symlink(UV, tools / "bin" / "uv")
    return {"serving": serving, "tools": tools, "wheelhouse": serving / "wheelhouse"}


def spec_for(host, wheel: Path, pull_base: str, digest: str | None = None, check=False) -> dict:
    entry = {"name": "gf-probe", "version": "1.0", "filename": wheel.name, "sha256": digest or sha(wheel)}
    uv_version = subprocess.run([UV, "--version"], capture_output=True, text=True, check=True).stdout.split()[1]
    venv = host["serving"] / "venvs" / "probe-1"
    return {
        "check": check,
        "venv": str(venv),
        "current": None,
        "python": sys.executable,
        "tools_root": str(host["tools"]),
        "serving_root": str(host["serving"]),
        "wheelhouse": str(host["wheelhouse"]),
        "lock_file": str(host["serving"] / "locks" / "probe-1.txt"),
        "lock_text": _lock.requirements_text([entry]),
        "tools_file": str(host["serving"] / "locks" / "tools.txt"),
        "tools_text": "",
        "uv_version": uv_version,
        "wheels": [entry],
        "pull_base": pull_base,
        "timeout": 30,
        "compile_bytecode": True,
        "mark": "lockhash",
        "verifier": (FILES / "verify_venv.py").read_text(),
        "verify": {"packages": {"gf-probe": "1.0"}, "imports": ["gf-probe"]},
    }


def test_build_pulls_checks_installs_verifies_and_marks(host, cache):
    root, base = cache
    wheel = make_wheel(root)
    answer = vh.build(spec_for(host, wheel, base), open_url)
    assert answer["ok"], answer
    assert answer["steps"] == ["fetch", "lock file", "venv", "sync", "verify", "mark"], answer
    assert answer["fetched"] == [wheel.name]
    # Each step that ran is timed (the bench and the summary read where a build's time goes).
    assert list(answer["seconds"]) == ["steps", "fetch", "venv", "sync", "verify", "mark"], answer
    assert all(secs >= 0 for secs in answer["seconds"].values()) and answer["seconds"]["sync"] > 0, answer
    venv = Path(spec_for(host, wheel, base)["venv"])
    assert (venv / ".gpufleet-verified").read_text() == "lockhash\n"
    probe = [venv / "bin" / "python", "-c", "import gf_probe; print(gf_probe.VERSION)"]
    out = subprocess.run(probe, capture_output=True, text=True, check=False)
    assert out.stdout.strip() == "1.0", out
    # The pulled wheel's hash is recorded with its size and mtime: the next inspection trusts it without reading it.
    assert vh.recorded_hashes(str(host["wheelhouse"])) == {wheel.name: sha(wheel)}
    # The build's own cache is gone: each installed file has its one link, shared with no cache and no other venv,
    # and the modules were compiled at build time (the serving start after the switch finds their bytecode).
    assert not (host["serving"] / ".uv-build-cache").exists()
    module = next(venv.glob("lib/python*/site-packages/gf_probe/cold.py"))
    assert module.stat().st_nlink == 1
    assert list((module.parent / "__pycache__").glob("cold.*.pyc"))  # no import made it: the build compiled it


def test_wrong_file_in_the_cache_is_refused_and_nothing_is_installed(host, cache):
    root, base = cache
    wheel = make_wheel(root)
    answer = vh.build(spec_for(host, wheel, base, digest="0" * 64), open_url)
    assert not answer["ok"] and answer["failed_step"] == "fetch", answer
    assert "did not match the lock" in answer["error"] and wheel.name in answer["error"], answer
    assert sorted(p.name for p in host["wheelhouse"].iterdir()) == [], "a refused file was left in the wheelhouse"
    assert not (host["serving"] / "venvs" / "probe-1").exists()


class CuttingHandler(QuietHandler):
    """Serves the first half of every file, announcing that half as the whole (a mirror that cuts a wheel short)."""

    def do_GET(self):
        body = Path(self.directory, self.path.lstrip("/")).read_bytes()
        half = body[: len(body) // 2]
        self.send_response(200)
        self.send_header("Content-Length", str(len(half)))
        self.end_headers()
        self.wfile.write(half)


def test_a_wheel_cut_short_is_named_a_truncated_download(host, tmp_path):
    root = tmp_path / "cut"
    root.mkdir()
    wheel = make_wheel(root)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(CuttingHandler, directory=str(root)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        spec = spec_for(host, wheel, f"http://127.0.0.1:{server.server_address[1]}")
        spec["wheels"][0]["size"] = wheel.stat().st_size
        answer = vh.build(spec, open_url)
    finally:
        server.shutdown()
        server.server_close()
    assert not answer["ok"] and answer["failed_step"] == "fetch", answer
    half, whole = wheel.stat().st_size // 2, wheel.stat().st_size
    assert "truncated download of http://127.0.0.1:" in answer["error"] and wheel.name in answer["error"], answer
    assert f"received {half} of {whole} bytes (the lock's size)" in answer["error"], answer
    assert "did not match the lock" not in answer["error"], answer
    assert sorted(p.name for p in host["wheelhouse"].iterdir()) == [], "a cut file was left in the wheelhouse"


def test_short_read_against_the_announced_length():
    assert vh.short_read("u", 10) is None
    assert vh.short_read("u", 10, size=10, announced=10) is None
    assert "received 4 of 10 bytes (the Content-Length the server announced)" in vh.short_read("u", 4, None, 10)
    assert "received 4 of 8 bytes (the lock's size)" in vh.short_read("u", 4, 8, 10)


def test_check_mode_reports_the_steps_and_changes_nothing(host, cache):
    root, base = cache
    wheel = make_wheel(root)
    answer = vh.build(spec_for(host, wheel, base, check=True), open_url)
    assert answer["ok"] and answer["changed"] and answer["fetched"] == [wheel.name], answer
    assert "sync" in answer["steps"] and not host["serving"].exists()
    assert "seconds" not in answer, answer


def test_an_edited_wheel_is_hashed_again_and_fetched_again(host, cache):
    root, base = cache
    wheel = make_wheel(root)
    spec = spec_for(host, wheel, base)
    assert vh.build(spec, open_url)["ok"]
    local = host["wheelhouse"] / wheel.name
    local.write_bytes(local.read_bytes() + b"tampered")
    assert vh.recorded_hashes(str(host["wheelhouse"])) == {}, "a file whose size moved kept its recorded hash"
    known = {}
    assert vh.missing_wheels(spec["wheels"], str(host["wheelhouse"]), known) == spec["wheels"]
    assert known[wheel.name] == sha(local)
    # The rebuild (a repair: the venv is not current, so it is removed and built again) fetches the lock's file.
    answer = vh.build(spec, open_url)
    assert answer["ok"] and answer["fetched"] == [wheel.name] and "remove unverified" in answer["steps"], answer
    assert sha(local) == sha(wheel)


def test_pushed_wheels_are_not_fetched_and_a_wrong_one_fails_in_uv(host, tmp_path):
    staged = tmp_path / "staged"
    staged.mkdir()
    wheel = make_wheel(staged)
    host["wheelhouse"].mkdir(parents=True)
    shutil.copy(wheel, host["wheelhouse"] / wheel.name)
    answer = vh.build(spec_for(host, wheel, "", digest="1" * 64), open_url)
    assert not answer["ok"] and answer["failed_step"] == "sync" and answer["fetched"] == [], answer
    assert "hash" in answer["output"].lower(), answer


def test_inspect_reads_venvs_current_and_only_recorded_hashes(host, cache):
    root, base = cache
    wheel = make_wheel(root)
    spec = spec_for(host, wheel, base)
    assert vh.build(spec, open_url)["ok"]
    os.symlink(spec["venv"], host["serving"] / "current")
    shutil.copy(wheel, host["wheelhouse"] / "unrecorded-1.0-py3-none-any.whl")
    facts = vh.inspect(str(host["serving"]), str(host["tools"]), sys.executable, str(host["wheelhouse"]))
    assert facts["current"] == spec["venv"] and facts["current_is_link"]
    assert [(v["name"], v["verified"]) for v in facts["venvs"]] == [("probe-1", "lockhash")]
    assert facts["installed"] == ["gf-probe==1.0"]
    assert facts["wheelhouse"] == {wheel.name: sha(wheel)}, "inspect hashed a file it had no record of"
    assert facts["uv_version"] == spec["uv_version"] and facts["missing_dirs"] == []


def test_locate_reads_the_venvs_and_current_without_starting_a_process(host, cache, monkeypatch):
    root, base = cache
    spec = spec_for(host, make_wheel(root), base)
    assert vh.build(spec, open_url)["ok"]
    os.symlink(spec["venv"], host["serving"] / "current")
    full = vh.inspect(str(host["serving"]), str(host["tools"]), sys.executable, str(host["wheelhouse"]))

    def no_process(*args, **kwargs):
        raise AssertionError(f"locate started {args[0]}")

    with monkeypatch.context() as patched:
        patched.setattr(vh.subprocess, "run", no_process)
        found = vh.locate(str(host["serving"]))
    assert found == {k: full[k] for k in ("arch", "glibc", "platform", "venvs", "current", "current_is_link")}
    assert found["current"] == spec["venv"] and found["platform"].endswith(found["glibc"].replace(".", "_"))
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT.read_text(), "locate", str(host["serving"])],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0 and json.loads(proc.stdout)["venvs"] == full["venvs"], proc.stderr


def test_wrong_arguments_print_the_usage():
    proc = subprocess.run([sys.executable, str(SCRIPT), "build"], capture_output=True, text=True, check=False)
    assert proc.returncode == 2 and "Usage:" in proc.stderr
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT.read_text(), "inspect"], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 2, "python -c <source> (how the role runs it) does not reach main"


def test_every_compiled_extension_of_torch_is_imported_not_only_the_profile_s(host, cache):
    """The profile names torch only; uv added two compiled companions of it. The one whose extension does not
    load (as a torchvision built for another torch fails at import) fails the verify step by name."""
    root, base = cache
    broken_so = {"_C.so": b"not an ELF file: built for another torch", "__init__.py": b"from . import _C\n"}
    wheels = [
        make_wheel(root, "torch", "2.11.0"),
        make_wheel(root, "gf_vision", "0.26.0", requires=["torch==2.11.0"], extra={"_C.so": b"unused here"}),
        make_wheel(root, "gf_audio", "2.11.0", requires=["torch==2.11.0"], extra=broken_so),
        make_wheel(root, "gf_pure", "1.0", requires=["torch"]),
        make_wheel(root, "gf_extra", "1.0", requires=['torch; extra == "gpu"'], extra=broken_so),
    ]
    spec = spec_for(host, wheels[0], base)
    entries = lock_entries(wheels)
    spec.update(wheels=entries, lock_text=_lock.requirements_text(entries))
    spec["verify"] = {"packages": {e["name"]: e["version"] for e in entries}, "imports": ["torch"]}
    answer = vh.build(spec, open_url)
    assert not answer["ok"] and answer["failed_step"] == "verify", answer
    checks = answer["verify"]["checks"]
    # Requires torch and ships a .so: imported. Pure, or torch only for an extra: not a compiled companion.
    assert checks["torch_extensions"] == ["gf-audio", "gf-vision"]
    assert checks["imports"]["gf-vision"] == ["gf_vision"]
    assert [f.split(": ")[:2] for f in answer["verify"]["failures"]] == [
        [
            "import gf_audio (from gf-audio, compiled code that requires torch",
            "it must be built for the torch installed) failed",
        ]
    ]


def test_a_step_past_its_time_limit_is_named_with_the_limit():
    # A real stack's sync ran past a fixed limit and surfaced as a raw TimeoutExpired traceback.
    with pytest.raises(vh.StepError) as err:
        vh.command(
            "sync", [sys.executable, "-c", "import time; print('unpacking', flush=True); time.sleep(30)"], timeout=1
        )
    assert err.value.step == "sync"
    assert "did not finish within 1 s" in err.value.error
    assert "unpacking" in err.value.output


# The loader's words when a library linked to the NVIDIA driver is imported on a host without it (sgl_kernel's
# common_ops, flash_mla's extension).
NO_DRIVER = "libcuda.so.1: cannot open shared object file: No such file or directory"


def test_imports_that_need_the_driver_are_not_judged_on_a_host_without_a_gpu(host, cache):
    root, base = cache
    wheels = [
        make_wheel(root, "torch", "2.14.1"),
        # An extension module the loader cannot link: ImportError naming libcuda.so.1, raised where it is imported.
        make_wheel(
            root,
            "gf_kernel",
            "0.4.10",
            extra={
                "__init__.py": b"from . import common_ops\n",
                "common_ops.py": f"raise ImportError({NO_DRIVER!r})\n".encode(),
            },
        ),
        # A library opened with ctypes: the loader's own OSError (no driver is looked for at this path anywhere).
        make_wheel(
            root,
            "gf_mla",
            "1.0",
            extra={"__init__.py": b"import ctypes\nctypes.CDLL('/nonexistent-driver/libcuda.so.1')\n"},
        ),
    ]
    spec = spec_for(host, wheels[0], base)
    entries = lock_entries(wheels)
    spec.update(wheels=entries, lock_text=_lock.requirements_text(entries))
    names = [e["name"] for e in entries]
    spec["verify"] = {"packages": {e["name"]: e["version"] for e in entries}, "imports": names, "gpu_required": False}
    answer = vh.build(spec, open_url)
    assert answer["ok"], answer
    assert sorted(answer["not_judged"]) == ["gf_kernel", "gf_mla"], answer
    assert answer["not_judged"] == answer["verify"]["checks"]["not_judged"]
    assert answer["not_judged"]["gf_kernel"].startswith(
        "needs the NVIDIA driver (libcuda.so.1), not judged on this host (from gf-kernel: ImportError: libcuda.so.1"
    ), answer
    assert "OSError" in answer["not_judged"]["gf_mla"], answer
    # A GPU required (or not said): the same imports fail, naming the missing driver library.
    unsaid = {k: v for k, v in spec["verify"].items() if k != "gpu_required"}
    for verify in ({**spec["verify"], "gpu_required": True}, unsaid):
        verified = vh.verify({**spec, "verify": verify}, UV)
        assert not verified["ok"] and verified["checks"]["not_judged"] == {}, verified
        assert [f.split(" failed: ")[0] for f in verified["failures"]] == [
            "import gf_kernel (from gf-kernel)",
            "import gf_mla (from gf-mla)",
        ], verified
        assert all("the NVIDIA driver library libcuda.so.1 is missing" in f for f in verified["failures"]), verified


def test_an_import_error_about_another_library_fails_without_a_gpu_too(host, cache):
    root, base = cache
    broken = {"__init__.py": b"raise ImportError('libnuma.so.1: cannot open shared object file: No such file')\n"}
    wheels = [make_wheel(root, "gf_other", "1.0", extra=broken)]
    spec = spec_for(host, wheels[0], base)
    entries = lock_entries(wheels)
    spec.update(wheels=entries, lock_text=_lock.requirements_text(entries))
    spec["verify"] = {"packages": {"gf-other": "1.0"}, "imports": ["gf-other"], "gpu_required": False}
    answer = vh.build(spec, open_url)
    assert not answer["ok"] and answer["failed_step"] == "verify", answer
    assert answer["verify"]["failures"] == [
        "import gf_other (from gf-other) failed: ImportError: libnuma.so.1: cannot open shared object file: "
        "No such file"
    ]
    assert answer["verify"]["checks"]["not_judged"] == {}


@pytest.mark.parametrize("pinned", [True, False], ids=["lock pins setuptools", "lock without setuptools"])
def test_an_in_sync_venv_is_in_sync_with_and_without_setuptools_in_the_lock(host, cache, pinned):
    from ansible_collections.gpufleet.upgrade.plugins.module_utils import _host_model as hm

    root, base = cache
    wheels = [make_wheel(root)] + ([make_wheel(root, "setuptools", "80.9.0")] if pinned else [])
    spec = spec_for(host, wheels[0], base)
    entries = lock_entries(wheels)
    spec.update(wheels=entries, lock_text=_lock.requirements_text(entries))
    spec["verify"] = {"packages": {e["name"]: e["version"] for e in entries}, "imports": ["gf-probe"]}
    assert vh.build(spec, open_url)["ok"]
    os.symlink(spec["venv"], host["serving"] / "current")
    installed = vh.inspect(str(host["serving"]), str(host["tools"]), sys.executable, str(host["wheelhouse"]))[
        "installed"
    ]
    assert installed == sorted(f"{e['name']}=={e['version']}" for e in entries)
    lists = _lock.package_lists(installed, entries)
    assert lists["before"] == lists["after"], "the diff of an in-sync venv is not empty"
    assert hm.venv_item(hm.read_venv(spec["venv"]), entries)["ok"]
    # The build's verify judges a pinned setuptools like any package.
    if pinned:
        spec["verify"]["packages"]["setuptools"] = "81.0.0"
        assert vh.verify(spec, UV)["failures"] == ["setuptools: installed 80.9.0, the lock says 81.0.0"]
