# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Incident bundle: secrets redacted from environments, the run's start from its id, venv package lists, the
collector's items and the archive written atomically."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _incident

XID = (Path(__file__).resolve().parents[3] / "data" / "xid" / "gpu-operator-1146.syslog").read_text()


def test_env_file_secrets_are_redacted_and_the_rest_kept():
    text = (
        "# serving environment\n"
        "CUDA_HOME=/usr/local/cuda-13.0\n"
        "HF_TOKEN=hf_abcdefSECRET\n"
        'export OPENAI_API_KEY="sk-live-123"\n'
        "WANDB_PASSWORD='pw'\n"
        "AWS_SECRET_ACCESS_KEY=abc\n"
        "SGLANG_AUTH=basic\n"
        "PIP_INDEX_URL=https://ci:hunter2@mirror.example/simple\n"
        "MONKEY_BUSINESS=1\n"
    )
    out = _incident.redact_env_file(text)
    for secret in ("hf_abcdefSECRET", "sk-live-123", "'pw'", "=abc", "basic", "hunter2"):
        assert secret not in out
    assert "CUDA_HOME=/usr/local/cuda-13.0" in out and "# serving environment" in out
    assert 'export OPENAI_API_KEY="<redacted>"' in out
    assert "PIP_INDEX_URL=https://<redacted>@mirror.example/simple" in out
    assert "MONKEY_BUSINESS=1" in out  # KEY as a word, not any name that contains the letters


def test_process_environ_is_parsed_and_redacted():
    raw = b"PATH=/usr/bin\0HF_TOKEN=hf_x\0SESSION_ID=42\0NCCL_P2P_DISABLE=1\0"
    text = _incident.environ_text(_incident.parse_environ(raw))
    assert text == "HF_TOKEN=<redacted>\nNCCL_P2P_DISABLE=1\nPATH=/usr/bin\nSESSION_ID=<redacted>\n"


def test_run_started_from_the_run_id():
    assert _incident.run_started("20261208T001203Z-123456") == "2026-12-08 00:12:03 UTC"
    assert _incident.run_started("rollback-20261208T001203Z-awx7") == "2026-12-08 00:12:03 UTC"
    assert _incident.run_started("adhoc") is None


def test_kernel_lines_keep_the_gpu_ones():
    kept = _incident.gpu_kernel_lines(XID + "Dec  2 11:38:50 worker4 kernel: e1000e: link up\n")
    assert "Xid (PCI:0000:07:00): 48" in kept and "e1000e" not in kept


def make_venv(root: Path, pkgs):
    site = root / "lib" / "python3.12" / "site-packages"
    site.mkdir(parents=True)
    for name in pkgs:
        (site / f"{name}.dist-info").mkdir()
    return str(root)


class FakeHost:
    def __init__(self, answers):
        self.answers, self.ran = answers, []

    def which(self, name):
        return f"/usr/bin/{name}" if name in self.answers else None

    def run(self, argv):
        self.ran.append(argv)
        return self.answers[argv[0].rsplit("/", 1)[1]]


def test_collect_and_write_the_archive(tmp_path):
    state = tmp_path / "state"
    (state / "results").mkdir(parents=True)
    (state / "state.json").write_text('{"phase": "postcheck"}')
    for stamp in ("20261201T000000Z", "20261208T001500Z"):
        (state / "results" / f"postcheck-{stamp}.json").write_text('{"passed": false}')
    env = tmp_path / "sglang.env"
    env.write_text("HF_TOKEN=hf_leak\nCUDA_HOME=/usr/local/cuda-13.0\n")
    environ = tmp_path / "environ"
    environ.write_bytes(b"HF_TOKEN=hf_leak2\0PATH=/bin\0")
    host = FakeHost({"journalctl": (0, "Dec 08 sglang[1]: started\n" + XID, ""), "dmesg": (1, "", "denied")})
    c = _incident.Collector(
        host.run,
        host.which,
        read_bytes=lambda p: environ.read_bytes() if p == "/proc/77/environ" else Path(p).read_bytes(),
    )
    params = {
        "run_id": "20261208T001203Z-1",
        "unit": "sglang.service",
        "env_file": str(env),
        "venvs": {
            "current": make_venv(tmp_path / "new", ["torch-2.9.1", "flashinfer_python-0.6.4"]),
            "previous": str(tmp_path / "gone"),
        },
        "state_dir": str(state),
        "postcheck_results": 1,
        "extra": {"run-record.json": {"host": "gpu-07", "outcome": "rolled back: postcheck: Xid 79"}},
    }
    _incident.collect(c, params, 77)
    assert [
        "/usr/bin/journalctl",
        "-u",
        "sglang.service",
        "--no-pager",
        "-o",
        "short-iso-precise",
        "--since",
        "2026-12-08 00:12:03 UTC",
    ] in host.ran
    assert c.missing["nvidia-smi-q.txt"] == "nvidia-smi is not installed"
    assert "no such folder" in c.missing["venvs/previous.txt"]
    c.add("MANIFEST.json", c.manifest({"run_id": params["run_id"]}))
    dest = tmp_path / "out" / "gpu-07.tar.gz"
    size = _incident.write_archive(str(dest), c.members, mtime=0)
    assert size == dest.stat().st_size and oct(dest.stat().st_mode & 0o777) == "0o600"
    with tarfile.open(dest) as tar:
        files = {m.name: tar.extractfile(m).read().decode() for m in tar.getmembers()}
    assert sorted(files) == sorted(
        f"gpu-07/{n}"
        for n in [
            "MANIFEST.json",
            "env/process.environ",
            "env/unit.env",
            "journal/sglang.service.log",
            "kernel/gpu-errors.log",
            "postcheck/postcheck-20261208T001500Z.json",
            "run-record.json",
            "state.json",
            "venvs/current.txt",
        ]
    )
    assert "flashinfer_python==0.6.4\ntorch==2.9.1\n" in files["gpu-07/venvs/current.txt"]
    assert "Xid (PCI:0000:07:00): 48" in files["gpu-07/kernel/gpu-errors.log"]
    assert "hf_leak" not in "".join(files.values())
    manifest = json.loads(files["gpu-07/MANIFEST.json"])
    assert manifest["missing"]["nvidia-smi-q.txt"] == "nvidia-smi is not installed"
    assert not list(dest.parent.glob("*.partial-*"))
