# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The host model on real files: a venv laid out as an installer leaves it (dist-info, METADATA, RECORD)."""

from __future__ import annotations

import base64
import csv
import hashlib
import os

import pytest

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _host_model as hm

LOCK = [{"name": "lab-torch", "version": "2.9.1+cu130"}, {"name": "six", "version": "1.17.0"}]


def record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def install(site, name, version, files):
    """A distribution as pip/uv install it: its files, METADATA and a RECORD with each file's hash."""
    dist_info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    dist_info.mkdir(parents=True)
    (dist_info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\nBody: not a header\n"
    )
    rows = []
    for rel, data in files.items():
        path = site / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        rows.append([rel, record_hash(data), len(data)])
    rows.append([f"{dist_info.name}/RECORD", "", ""])
    # Installers write RECORD with the csv module: a path holding a comma is quoted.
    with open(dist_info / "RECORD", "w", newline="", encoding="utf-8") as handle:
        csv.writer(handle, lineterminator="\n").writerows(rows)


@pytest.fixture
def venv(tmp_path):
    root = tmp_path / "venvs" / "lab-0123"
    site = root / "lib" / "python3.12" / "site-packages"
    install(site, "lab-torch", "2.9.1+cu130", {"lab_torch/__init__.py": b"x = 1\n", "lab_torch/_C.so": b"\0" * 64})
    install(site, "six", "1.17.0", {"six.py": b"# six\n"})
    install(site, "pip", "25.0", {"pip/__init__.py": b""})
    return root


def test_a_venv_that_matches_the_lock_is_in_sync(venv):
    entry = hm.venv_item(hm.read_venv(str(venv)), LOCK)
    assert entry["ok"] and entry["drift"] == [], entry
    assert entry["observed"]["packages"] == 2  # pip is venv tooling, not judged


def test_a_path_holding_a_comma_is_read_from_its_csv_quoted_record(tmp_path):
    # sglang's wheels carry such files (a quoted RECORD row); split on commas they read as missing.
    site = tmp_path / "site"
    install(site, "six", "1.17.0", {"six/data/a,b.json": b"{}", "six.py": b"# six\n"})
    dist_info = site / "six-1.17.0.dist-info"
    assert '"six/data/a,b.json"' in (dist_info / "RECORD").read_text()
    assert hm.record_problems(str(site), str(dist_info)) == []
    (site / "six" / "data" / "a,b.json").write_bytes(b"[]")
    assert hm.record_problems(str(site), str(dist_info)) == [("six/data/a,b.json", "edited")]


def test_a_removed_package_is_named(venv):
    site = venv / "lib" / "python3.12" / "site-packages"
    for path in site.glob("six*"):
        if path.is_dir():
            for f in path.iterdir():
                f.unlink()
            path.rmdir()
        else:
            path.unlink()
    assert hm.venv_item(hm.read_venv(str(venv)), LOCK)["drift"] == ["serving venv: six 1.17.0 missing"]


def test_an_added_package_and_another_version_are_named(venv):
    site = venv / "lib" / "python3.12" / "site-packages"
    install(site, "extra-tool", "1.0", {"extra_tool.py": b""})
    lock = [{"name": "lab_torch", "version": "2.9.1+cu128"}, {"name": "Six", "version": "1.17.0"}]
    assert hm.venv_item(hm.read_venv(str(venv)), lock)["drift"] == [
        "serving venv: extra-tool 1.0 not in the lock",
        "serving venv: lab-torch is 2.9.1+cu130, the lock wants 2.9.1+cu128",
    ]


def test_an_edited_file_shows_even_at_the_same_size(venv):
    site = venv / "lib" / "python3.12" / "site-packages"
    (site / "lab_torch" / "__init__.py").write_bytes(b"x = 2\n")
    drift = hm.venv_item(hm.read_venv(str(venv)), LOCK)["drift"]
    assert drift == ["serving venv: lab-torch 2.9.1+cu130: lab_torch/__init__.py edited"]
    # A size-only check is blind to a same-size edit, and sees a removed file.
    assert hm.venv_item(hm.read_venv(str(venv), verify="size"), LOCK)["ok"]
    os.unlink(site / "lab_torch" / "_C.so")
    assert "lab_torch/_C.so missing" in hm.venv_item(hm.read_venv(str(venv), verify="size"), LOCK)["drift"][0]


def test_many_problems_are_counted_not_listed(tmp_path):
    site = tmp_path / "v" / "lib" / "python3.11" / "site-packages"
    install(site, "big", "1", {f"big/f{i}.py": b"a" for i in range(5)})
    for i in range(5):
        (site / "big" / f"f{i}.py").unlink()
    drift = hm.venv_item(hm.read_venv(str(tmp_path / "v")), [{"name": "big", "version": "1"}])["drift"]
    assert drift[0].endswith("big/f2.py missing and 2 more"), drift


def test_a_missing_venv_and_a_wrong_link(tmp_path):
    assert hm.venv_item(hm.read_venv(str(tmp_path / "nope")), LOCK)["drift"] == [
        f"serving venv: {tmp_path / 'nope'} does not exist"
    ]
    want = "/opt/s/venvs/lab-0123"
    assert hm.venv_link_item("/opt/s/current", want, want, "lab-0123")["ok"]
    assert hm.venv_link_item("/opt/s/current", "/opt/s/venvs/lab-0123.repair-r1", want, "lab-0123")["ok"]
    assert hm.venv_link_item("/opt/s/current", "/opt/s/venvs/old", want, "lab-0123")["drift"] == [
        "serving venv link: current is old, the lock wants lab-0123"
    ]
    assert "is missing" in hm.venv_link_item("/opt/s/current", None, want, "lab-0123")["drift"][0]


SETUPTOOLS = {"name": "setuptools", "version": "80.9.0"}


def test_a_pinned_setuptools_is_judged_like_any_package(venv):
    # torch requires setuptools, so a real lock pins it: in the venv at the lock's version the venv is in sync.
    site = venv / "lib" / "python3.12" / "site-packages"
    install(site, "setuptools", "80.9.0", {"setuptools/__init__.py": b"# 80.9.0\n"})
    entry = hm.venv_item(hm.read_venv(str(venv)), [*LOCK, SETUPTOOLS])
    assert entry["ok"] and entry["observed"]["packages"] == 3, entry  # pip is still venv tooling
    # Unpinned, the same setuptools is venv tooling and not judged.
    assert hm.venv_item(hm.read_venv(str(venv)), LOCK)["ok"]
    assert hm.venv_item(hm.read_venv(str(venv)), [*LOCK, {"name": "setuptools", "version": "78.1.0"}])["drift"] == [
        "serving venv: setuptools is 80.9.0, the lock wants 78.1.0"
    ]
    (site / "setuptools" / "__init__.py").write_bytes(b"# edited\n")
    assert hm.venv_item(hm.read_venv(str(venv)), [*LOCK, SETUPTOOLS])["drift"] == [
        "serving venv: setuptools 80.9.0: setuptools/__init__.py edited"
    ]


def test_a_pinned_setuptools_missing_from_the_venv_is_named(venv):
    assert hm.venv_item(hm.read_venv(str(venv)), [*LOCK, SETUPTOOLS])["drift"] == [
        "serving venv: setuptools 80.9.0 missing"
    ]


def shared_venv(tmp_path, first=b"# flashinfer's\n", last=b"# dlpack's\n"):
    """Two distributions that each install site-packages/build_backend.py; the one installed last wins."""
    root = tmp_path / "venvs" / "real"
    site = root / "lib" / "python3.12" / "site-packages"
    install(site, "flashinfer-python", "0.7.2", {"flashinfer/__init__.py": b"", "build_backend.py": first})
    install(site, "torch-c-dlpack-ext", "0.1.5", {"torch_c_dlpack_ext/__init__.py": b"", "build_backend.py": last})
    lock = [{"name": "flashinfer-python", "version": "0.7.2"}, {"name": "torch-c-dlpack-ext", "version": "0.1.5"}]
    return root, site, lock


@pytest.mark.parametrize("verify", ["record", "size"])
def test_a_file_two_distributions_install_matches_either_record(tmp_path, verify):
    root, _site, lock = shared_venv(tmp_path, last=b"# dlpack's, longer\n")
    observed = hm.read_venv(str(root), verify)
    entry = hm.venv_item(observed, lock)
    assert entry["ok"], entry
    assert (
        observed["shared"]
        == entry["observed"]["shared"]
        == [
            "build_backend.py is installed by flashinfer-python and torch-c-dlpack-ext; "
            "it matches torch-c-dlpack-ext's RECORD"
        ]
    )


def test_a_shared_file_that_matches_no_record_is_edited(tmp_path):
    root, site, lock = shared_venv(tmp_path)
    (site / "build_backend.py").write_bytes(b"# nobody's\n")
    entry = hm.venv_item(hm.read_venv(str(root)), lock)
    assert entry["drift"] == [
        "serving venv: flashinfer-python 0.7.2: build_backend.py edited",
        "serving venv: torch-c-dlpack-ext 0.1.5: build_backend.py edited",
    ]
    assert entry["observed"]["shared"] == [
        "build_backend.py is installed by flashinfer-python and torch-c-dlpack-ext; it matches none of their RECORDs"
    ]
    # A file of one distribution only is not accepted by another's RECORD of a different path.
    (site / "build_backend.py").write_bytes(b"# dlpack's\n")
    (site / "flashinfer" / "__init__.py").write_bytes(b"# dlpack's\n")
    assert hm.venv_item(hm.read_venv(str(root)), lock)["drift"] == [
        "serving venv: flashinfer-python 0.7.2: flashinfer/__init__.py edited"
    ]


ENV = 'CUDA_HOME="/usr/local/cuda-13.0"\nPATH="/usr/local/cuda-13.0/bin:/usr/bin"\nSGLANG_X="1"\n'


def test_env_file_drift_names_each_variable():
    edited = ENV.replace('cuda-13.0"', 'cuda-12.8"').replace('SGLANG_X="1"\n', "") + "EXTRA=2\n"
    drift = hm.file_item("gpufleet-serving.env", "/etc/gpufleet/gpufleet-serving.env", ENV, edited, "env")["drift"]
    assert drift == [
        "gpufleet-serving.env: CUDA_HOME is /usr/local/cuda-12.8, profile wants /usr/local/cuda-13.0",
        "gpufleet-serving.env: EXTRA=2 is not in the profile",
        "gpufleet-serving.env: SGLANG_X is not set, profile wants 1",
    ]
    assert hm.file_item("e", "/e", ENV, "# note\n" + ENV, "env")["ok"]  # a comment is not the environment
    assert hm.file_item("e", "/e", ENV, ENV, "env")["ok"]
    assert hm.file_item("e", "/e", ENV, None, "env")["drift"] == ["e: /e is missing"]


def test_unit_drift_names_the_first_line():
    unit = "[Service]\nExecStart=/opt/current/bin/python -m sglang\nRestart=always\n"
    drift = hm.file_item("u.service", "/u", unit, unit.replace("always", "no"), "text")["drift"]
    assert drift == ["u.service: line 3 is 'Restart=no', the template has 'Restart=always'"]
    assert hm.file_item("u.service", "/u", unit, unit + "Nice=5\n")["drift"] == [
        "u.service: 4 lines, the template has 3"
    ]


def test_toolkit_files_and_status(tmp_path):
    home = tmp_path / "cuda-13.0"
    (home / "bin").mkdir(parents=True)
    (home / "bin" / "nvcc").write_bytes(b"nvcc")
    marker = {"files": {"bin/nvcc": hashlib.sha256(b"nvcc").hexdigest(), "lib/libcudart.so": "00"}}
    present = {"status": "present", "release": "13.0.2"}
    assert hm.toolkit_item(str(home), "13.0.2", present, marker)["drift"] == [
        "CUDA 13.0.2 toolkit: lib/libcudart.so missing"
    ]
    (home / "bin" / "nvcc").write_bytes(b"evil")
    assert "bin/nvcc edited" in hm.toolkit_item(str(home), "13.0.2", present, marker)["drift"][0]
    # A toolkit installed before markers recorded files is judged by its components only.
    assert hm.toolkit_item(str(home), "13.0.2", present, {"archives": {}})["ok"]
    incomplete = {"status": "incomplete", "missing": ["libnvvm"]}
    assert hm.toolkit_item(str(home), "13.0.2", incomplete, None)["drift"] == [
        f"CUDA 13.0.2 toolkit at {home} is incomplete (missing libnvvm)"
    ]


def test_toolkit_verify_stat_reads_only_files_whose_signature_moved(tmp_path):
    from ansible_collections.gpufleet.upgrade.plugins.module_utils import _toolkit as tk

    home = tmp_path / "cuda-13.0"
    (home / "lib").mkdir(parents=True)
    names = {f"lib/lib{i}.so": f"library {i}".encode() for i in range(5)}
    for rel, data in names.items():
        (home / rel).write_bytes(data)
    marker = {
        "files": {rel: hashlib.sha256(data).hexdigest() for rel, data in names.items()},
        "stat": {rel: tk.stat_signature(str(home / rel)) for rel in names},
    }
    present = {"status": "present", "release": "13.0.2"}
    intact = hm.toolkit_item(str(home), "13.0.2", present, marker)
    assert intact["ok"] and intact["observed"]["files_checked"] == 5 and intact["observed"]["files_hashed"] == 0
    # Same size, and the old mtime put back: the write moved ctime, so the file is read and found edited.
    target = home / "lib/lib3.so"
    old = target.stat()
    target.write_bytes(b"library X")
    os.utime(target, ns=(old.st_atime_ns, old.st_mtime_ns))
    edited = hm.toolkit_item(str(home), "13.0.2", present, marker)
    assert edited["drift"] == ["CUDA 13.0.2 toolkit: lib/lib3.so edited"], edited
    assert edited["observed"]["files_hashed"] == 1
    # sha256 reads every file; a marker without stat signatures (an older install) too.
    assert hm.toolkit_item(str(home), "13.0.2", present, marker, "sha256")["observed"]["files_hashed"] == 5
    older = {"files": marker["files"]}
    assert hm.toolkit_item(str(home), "13.0.2", present, older)["observed"]["files_hashed"] == 5
    with pytest.raises(ValueError, match="toolkit verify 'fast'"):
        hm.toolkit_item(str(home), "13.0.2", present, marker, "fast")


def test_cuda_link_by_policy():
    state = {"path": "/usr/local/cuda", "resolved": "/usr/local/cuda-12.8"}
    assert hm.link_item(state, "target", "/usr/local/cuda-13.0", None)["drift"] == [
        "cuda link: /usr/local/cuda resolves to /usr/local/cuda-12.8, the profile wants /usr/local/cuda-13.0"
    ]
    assert hm.link_item(state, "keep", "/usr/local/cuda-13.0", None)["ok"]  # keep with nothing recorded
    assert hm.link_item(state, "keep", "/usr/local/cuda-13.0", "/usr/local/cuda-12.8")["ok"]


def test_gpus_and_the_verdict():
    items = [
        hm.gpu_item({"status": "skipped"}),
        hm.gpu_item({"status": "unhealthy", "reasons": ["GPU 3: 2 ECC errors"]}),
    ]
    verdict = hm.judge(items)
    assert verdict["in_sync"] is False
    assert verdict["drift"] == ["GPU health: GPU 3: 2 ECC errors"]
    assert verdict["drifted"] == ["gpus"]
    assert hm.judge(items[:1])["in_sync"] is True


# --- a stack that fits together (what a backup records and a rollback re-checks) ---------------------------

TOOLKITS = [
    {"path": "/usr/local/cuda-12.8", "version": "12.8.1"},
    {"path": "/usr/local/cuda-13.0", "version": "13.0.2"},
]
OLD = [{"name": "lab-torch", "version": "2.9.1+cu128"}, {"name": "lab-sglang", "version": "0.5.3"}]
NEW = [{"name": "lab-torch", "version": "2.11.0+cu130"}, {"name": "lab-sgl-kernel", "version": "0.3.21+cu130"}]


def test_cuda_of_tag_reads_the_local_tag():
    assert hm.cuda_of_tag("2.11.0+cu130") == "13.0" and hm.cuda_of_tag("2.9.1+cu128") == "12.8"
    assert hm.cuda_of_tag("2.9.1+cu118") == "11.8" and hm.cuda_of_tag("0.5.3") is None
    assert hm.cuda_of_tag("2.9.1+cpu") is None


def test_a_venv_and_the_toolkit_of_its_cuda_are_consistent():
    verdict = hm.stack_consistency(OLD, "CUDA_HOME=/usr/local/cuda-12.8\n", TOOLKITS, realpath=str)
    assert verdict == {"consistent": True, "problems": [], "cuda_home": "/usr/local/cuda-12.8", "cuda_version": "12.8"}


def test_the_new_venv_with_the_old_toolkits_cuda_home_is_inconsistent():
    """The broken state a rollback once restored: the cu130 venv with CUDA_HOME of the 12.8 toolkit."""
    verdict = hm.stack_consistency(NEW, 'CUDA_HOME="/usr/local/cuda-12.8"\n', TOOLKITS, realpath=str)
    assert not verdict["consistent"]
    assert verdict["problems"] == [
        "serving venv: lab-torch 2.11.0+cu130 is built for CUDA 13.0, CUDA_HOME /usr/local/cuda-12.8 is CUDA 12.8",
        "serving venv: lab-sgl-kernel 0.3.21+cu130 is built for CUDA 13.0, CUDA_HOME /usr/local/cuda-12.8 is CUDA 12.8",
    ]


def test_cuda_home_that_is_no_toolkit_or_missing_is_inconsistent_and_a_link_is_followed():
    gone = hm.stack_consistency(NEW, "CUDA_HOME=/usr/local/cuda-13.1\n", TOOLKITS, realpath=str)
    assert gone["problems"] == [
        "serving environment: CUDA_HOME is /usr/local/cuda-13.1, which is no installed toolkit (installed:"
        " /usr/local/cuda-12.8, /usr/local/cuda-13.0)"
    ]
    unset = hm.stack_consistency(NEW, "PATH=/usr/bin\n", TOOLKITS, realpath=str)
    assert unset["problems"] == [
        "serving environment: no CUDA_HOME, while the venv holds CUDA builds (lab-torch 2.11.0+cu130,"
        " lab-sgl-kernel 0.3.21+cu130)"
    ]
    linked = hm.stack_consistency(
        NEW, "CUDA_HOME=/usr/local/cuda\n", TOOLKITS, realpath=lambda p: {"/usr/local/cuda": "/usr/local/cuda-13.0"}[p]
    )
    assert linked["consistent"] and linked["cuda_version"] == "13.0"
    # The environment not known (no env file given): nothing to hold the venv against.
    assert hm.stack_consistency(NEW, None, TOOLKITS)["consistent"]
    # A toolkit without version.json cannot be matched.
    blind = hm.stack_consistency(OLD, "CUDA_HOME=/opt/cuda\n", [{"path": "/opt/cuda", "version": None}], realpath=str)
    assert blind["problems"] == ["serving environment: CUDA_HOME /opt/cuda has no readable version.json"]


class TestRunRecordItem:
    BACKUPS = ["20261206T220000Z-1a2b3c4d", "20261206T230000Z-5e6f7a8b"]

    def test_a_present_record_is_in_sync(self):
        entry = hm.run_record_item("/v/state.json", {"run_id": "r1", "result": "upgraded"}, self.BACKUPS)
        assert entry["ok"] and entry["observed"] == "run r1 upgraded"

    def test_a_host_gpufleet_never_acted_on_is_not_drift(self):
        assert hm.run_record_item("/v/state.json", None, [])["ok"]

    def test_a_lost_record_beside_backups_is_drift_with_the_fix(self):
        entry = hm.run_record_item("/v/state.json", None, self.BACKUPS)
        assert not entry["ok"] and entry["item"] == "run record"
        (line,) = entry["drift"]
        assert "the host's run record /v/state.json is missing" in line
        assert "2 gpufleet backup(s) (newest 20261206T230000Z-5e6f7a8b)" in line and "fix: run upgrade.yml" in line
