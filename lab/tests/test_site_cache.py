# Copyright: (c) 2026, gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The lab's nginx site cache (lab/site_cache.py): the rendered config, its log counts, and a real nginx on loopback
in a temporary folder (MISS once, then HIT; what the lock makes of hosts asking at once; stop ends only its own
master). No podman; the nginx tests skip where nginx is not installed."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from lab import site_cache as sc

WHEEL = "lab_torch-2.11.0+cu130-py3-none-any.whl"
ARCHIVE = "cuda_nvcc/linux-x86_64/cuda_nvcc-linux-x86_64-13.0.88-archive.tar.xz"
needs_nginx = pytest.mark.skipif(shutil.which("nginx") is None, reason="nginx is not installed (scripts/setup.sh)")


def config(tmp_path: Path, upstream: str = "http://127.0.0.1:9001", origin: bool = True) -> str:
    folders = sc.origin_folders(tmp_path / "controller") if origin else None
    return sc.render(tmp_path / "sc", 9000, upstream, folders, 9001 if origin else None)


def cached_block(text: str) -> str:
    return text.split("location ~ ^/(wheels", 1)[1].split("}\n", 1)[0]


@pytest.mark.parametrize(
    ("path", "cached"),
    [
        (f"/wheels/{WHEEL}", True),
        (f"/redist/{ARCHIVE}", True),
        ("/redist/cuda_cccl/linux-x86_64/cuda_cccl-linux-x86_64-13.0.85-archive.tar.gz", True),
        ("/redist/redistrib_13.0.2.json", False),  # a manifest can change under its name: never kept
        ("/wheels/", False),
        ("/wheels/.gpufleet-sha256.json", False),
        ("/wheels/sub/x-1.0-py3-none-any.whl", False),
        ("/simple/lab-torch/", False),
    ],
)
def test_only_immutable_artifacts_are_cached(path, cached):
    assert bool(re.match(sc.CACHED, path)) is cached


def test_render_caches_200s_long_with_the_lock(tmp_path):
    block = cached_block(config(tmp_path))
    assert "proxy_cache gpufleet_artifacts;" in block
    assert "proxy_cache_lock on;" in block
    assert f"proxy_cache_lock_timeout {sc.LOCK_WAIT};" in block
    assert re.findall(r"proxy_cache_valid (.*);", block) == [f"200 {sc.VALID}"]  # 404s and errors are not kept
    assert "proxy_ignore_headers Cache-Control Expires" in block
    assert "proxy_pass http://127.0.0.1:9001;" in block


def test_render_logs_cache_status_and_bytes_as_json(tmp_path):
    text = config(tmp_path)
    fmt = re.search(r"log_format gpufleet_cache escape=json '(.*)';", text).group(1)
    fields = json.loads(fmt)
    assert fields["cache"] == "$upstream_cache_status"
    assert fields["bytes"] == "$body_bytes_sent"
    assert fields["upstream_bytes"] == "$upstream_bytes_received"
    assert f"access_log {tmp_path / 'sc' / 'access.jsonl'} gpufleet_cache;" in text


def test_render_origin_serves_the_two_controller_folders_only(tmp_path):
    text = config(tmp_path)
    origin = text.split("# The origin", 1)[1]
    assert f"location /wheels/ {{ alias {tmp_path / 'controller' / 'wheelhouse'}/; }}" in origin
    assert f"location /redist/ {{ alias {tmp_path / 'controller' / 'cache' / 'redist'}/; }}" in origin
    assert "location ~ /\\. { return 404; }" in origin
    assert "location / { return 404; }" in origin


def test_render_without_origin_fronts_the_upstream_below_its_path(tmp_path):
    text = config(tmp_path, upstream="http://origin.example.com:8080/fleet/", origin=False)
    assert "# The origin" not in text
    assert "rewrite ^(.*)$ /fleet$1 break;" in cached_block(text)
    assert "proxy_pass http://origin.example.com:8080/fleet/;" in text


@pytest.mark.parametrize("upstream", ["origin:8080", "ftp://origin/", "http:///x", "http://origin/?a=1"])
def test_a_bad_upstream_is_refused_naming_it(tmp_path, upstream):
    with pytest.raises(sc.SiteCacheError, match=re.escape(repr(upstream))):
        config(tmp_path, upstream=upstream, origin=False)


@pytest.mark.parametrize(
    ("value", "expected"), [("", 0), ("-", 0), ("1200", 1200), ("100, 250", 350), ("100 : 250", 350)]
)
def test_upstream_bytes_reads_every_upstream_tried(value, expected):
    assert sc.upstream_bytes(value) == expected


def test_counts_hit_rate_and_bytes():
    rows = [
        {"cache": "MISS", "status": 200, "bytes": 100, "upstream_bytes": "130"},
        {"cache": "HIT", "status": 200, "bytes": 100, "upstream_bytes": ""},
        {"cache": "HIT", "status": 200, "bytes": 100, "upstream_bytes": ""},
        {"cache": "", "status": 404, "bytes": 10, "upstream_bytes": "40"},
    ]
    out = sc.counts(rows, [{"bytes": 100}, {"bytes": 10}])
    assert out["requests"] == 4
    assert out["hit_rate"] == 0.5
    assert out["byte_hit_rate"] == round(200 / 310, 3)
    assert out["served_bytes"] == 310
    assert out["upstream_bytes"] == 170
    assert out["origin_bytes"] == 110
    assert out["errors"] == 1
    assert out["by_cache_status"]["NONE"] == {"requests": 1, "bytes": 10}
    assert sc.counts([])["hit_rate"] is None


def test_read_log_keeps_lines_since_and_makes_numbers(tmp_path):
    log = tmp_path / "access.jsonl"
    log.write_text(
        '{"ts":"100.5","status":"200","bytes":"7","bytes_sent":"9","seconds":"0.010"}\nnot json\n'
        '{"ts":"99.0","status":"200","bytes":"1","bytes_sent":"1","seconds":"0.000"}\n'
    )
    rows = sc.read_log(log, since=100)
    assert [(r["ts"], r["status"], r["bytes"], r["seconds"]) for r in rows] == [(100.5, 200, 7, 0.01)]


# ---- a real nginx ----------------------------------------------------------------------------------------------


def fetch(url: str, method: str = "GET") -> tuple[int, bytes, str | None]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method=method), timeout=30) as answer:
            return answer.status, answer.read(), answer.headers.get("X-Cache-Status")
    except urllib.error.HTTPError as exc:
        return exc.code, b"", exc.headers.get("X-Cache-Status")


def ended(pid: int) -> bool:
    """No such process, or a zombie (nobody here reaps a daemon's master): no command line either way."""
    cmdline = Path(f"/proc/{pid}/cmdline")
    return not cmdline.exists() or not cmdline.read_bytes()


@pytest.fixture
def running(tmp_path):
    controller = tmp_path / "controller"
    folders = sc.origin_folders(controller)
    (folders["redist"] / Path(ARCHIVE).parent).mkdir(parents=True)
    folders["wheels"].mkdir(parents=True)
    payload = {"wheel": bytes(range(256)) * 8192, "archive": b"xz" * 300000}  # 2 MB, 600 kB
    (folders["wheels"] / WHEEL).write_bytes(payload["wheel"])
    (folders["redist"] / ARCHIVE).write_bytes(payload["archive"])
    (folders["wheels"] / ".gpufleet-sha256.json").write_text("{}")
    folder = tmp_path / "site-cache"
    info = sc.start("unit", controller_dir=controller, folder=folder, clear=True)
    yield info, folder, payload
    sc.stop("unit", folder)


@needs_nginx
def test_nginx_accepts_the_rendered_config(running):
    info, folder, _ = running
    res = subprocess.run(["nginx", "-t", "-p", str(folder), "-c", info["config"]], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert "test is successful" in res.stderr


@needs_nginx
def test_hosts_asking_at_once_cost_one_upstream_fetch(running):
    info, folder, payload = running
    url = f"{info['url']}/wheels/{urllib.parse.quote(WHEEL)}"
    answers = []
    threads = [threading.Thread(target=lambda: answers.append(fetch(url))) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(a[2] for a in answers) == ["HIT", "HIT", "HIT", "MISS"]
    assert {hashlib.sha256(a[1]).hexdigest() for a in answers} == {hashlib.sha256(payload["wheel"]).hexdigest()}
    out = sc.read_counts("unit", folder=folder)
    assert out["origin_requests"] == 1
    assert out["origin_bytes"] == len(payload["wheel"])
    assert out["served_bytes"] == 4 * len(payload["wheel"])
    assert out["hit_rate"] == 0.75


@needs_nginx
def test_a_head_fills_the_cache_and_misses_are_not_kept(running):
    info, folder, payload = running
    url = f"{info['url']}/redist/{ARCHIVE}"
    assert fetch(url, "HEAD")[::2] == (200, "MISS")  # nginx fetches the whole file upstream for a HEAD miss
    status, body, cache = fetch(url)
    assert (status, cache, body == payload["archive"]) == (200, "HIT", True)
    missing = f"{info['url']}/wheels/absent-1.0-py3-none-any.whl"
    assert [fetch(missing)[::2] for _ in range(2)] == [(404, "MISS"), (404, "MISS")]
    assert fetch(f"{info['url']}/wheels/.gpufleet-sha256.json")[0] == 404
    origin = sc.read_log(folder / "origin.access.jsonl")
    assert [r["path"] for r in origin].count(f"/redist/{ARCHIVE}") == 1


@needs_nginx
def test_a_restart_keeps_the_cache_unless_cleared(running, tmp_path):
    info, folder, payload = running
    url = f"{info['url']}/wheels/{urllib.parse.quote(WHEEL)}"
    assert fetch(url)[2] == "MISS"
    again = sc.start("unit", controller_dir=tmp_path / "controller", folder=folder, port=info["port"])
    assert again["pid"] != info["pid"]
    assert fetch(url)[2] == "HIT"
    sc.start("unit", controller_dir=tmp_path / "controller", folder=folder, port=info["port"], clear=True)
    assert fetch(url)[2] == "MISS"


@needs_nginx
def test_stop_ends_exactly_its_master(running):
    info, folder, _ = running
    stranger = subprocess.Popen(["sleep", "60"])
    try:
        pid_file = folder / "nginx.pid"
        real = pid_file.read_text()
        pid_file.write_text(f"{stranger.pid}\n")  # a pid file naming a process that is not this nginx
        assert sc.stop("unit", folder) is False
        assert stranger.poll() is None
        pid_file.write_text(real)
        assert sc.stop("unit", folder) is True
        assert (
            not Path(f"/proc/{info['pid']}/cmdline").exists() or not Path(f"/proc/{info['pid']}/cmdline").read_bytes()
        )
        assert sc.stop("unit", folder) is False
    finally:
        stranger.kill()
        stranger.wait()
