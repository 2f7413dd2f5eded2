# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The run's fleet cache (plugin_utils/_fleet_cache.py and the http.server it runs) on loopback."""

from __future__ import annotations

import concurrent.futures
import hashlib
import http.client
import json
import os
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request

import pytest

from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _fleet_cache as fc


@pytest.fixture
def cache(tmp_path):
    wheels, redist = tmp_path / "wheelhouse", tmp_path / "redist"
    (redist / "cuda_nvcc" / "linux-x86_64").mkdir(parents=True)
    wheels.mkdir()
    (wheels / "six-1.17.0-py3-none-any.whl").write_bytes(b"w" * 5000)
    (redist / "cuda_nvcc" / "linux-x86_64" / "cuda_nvcc-13.0.88-archive.tar.xz").write_bytes(b"r" * 3000)
    (tmp_path / "secret.json").write_text("{}")
    run_dir = tmp_path / "run"
    state = fc.start(str(run_dir), {"wheels": str(wheels), "redist": str(redist)}, bind="127.0.0.1")
    yield run_dir, state
    fc.stop(str(run_dir))


def get(state, path, method="GET"):
    request = urllib.request.Request(f"http://127.0.0.1:{state['port']}{path}", method=method)
    try:
        with urllib.request.urlopen(request, timeout=5) as resp:
            return resp.status, resp.read(), resp.headers
    except urllib.error.HTTPError as exc:
        return exc.code, b"", exc.headers


def test_serves_the_mounted_files_and_nothing_else(cache):
    _run_dir, state = cache
    status, body, _headers = get(state, "/wheels/six-1.17.0-py3-none-any.whl")
    assert status == 200 and hashlib.sha256(body).hexdigest() == hashlib.sha256(b"w" * 5000).hexdigest()
    status, body, headers = get(state, "/redist/cuda_nvcc/linux-x86_64/cuda_nvcc-13.0.88-archive.tar.xz", "HEAD")
    assert status == 200 and body == b"" and headers["Content-Length"] == "3000"
    for path in ("/secret.json", "/run/x", "/", "/wheels/missing.whl"):
        assert get(state, path)[0] == 404, path


def raw_get(state, path):
    """GET with the path sent as written (urllib would not send some of these as they are)."""
    conn = http.client.HTTPConnection("127.0.0.1", state["port"], timeout=5)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def test_only_regular_files_under_the_folders_are_served(cache, tmp_path):
    # A link is followed only where its real path stays in the folder: one to a file outside (/redist/passwd-link ->
    # /etc/passwd), a linked folder outside, relative segments sent as they are or encoded, and folders are refused.
    _run_dir, state = cache
    wheels, redist = tmp_path / "wheelhouse", tmp_path / "redist"
    os.symlink(tmp_path / "secret.json", redist / "secret-link")
    os.symlink("/etc/passwd", redist / "passwd-link")
    os.symlink(tmp_path, wheels / "up")
    os.symlink("six-1.17.0-py3-none-any.whl", wheels / "six-latest.whl")  # a link that stays inside
    os.mkfifo(wheels / "pipe.whl")
    refused = {
        "/redist/passwd-link": 403,
        "/redist/secret-link": 403,
        "/wheels/up/secret.json": 403,
        "/wheels/up/redist/cuda_nvcc/linux-x86_64/cuda_nvcc-13.0.88-archive.tar.xz": 403,
        "/wheels/../secret.json": 403,
        "/wheels/%2e%2e/secret.json": 403,
        "/wheels/%2E%2E%2Fsecret.json": 403,
        "/wheels/..%2f..%2fetc%2fpasswd": 403,
        "/redist/./cuda_nvcc/linux-x86_64/cuda_nvcc-13.0.88-archive.tar.xz": 403,
        "/wheels/six-1.17.0-py3-none-any.whl%00.txt": 403,
        "/wheels/": 404,
        "/redist/cuda_nvcc/": 403,
        "/redist/cuda_nvcc": 403,
        "/wheels/pipe.whl": 403,
    }
    for path, code in refused.items():
        status, body = raw_get(state, path)
        assert status == code and b"root:" not in body and b"{}" != body, (path, status, body[:80])
    status, body = raw_get(state, "/wheels/six-latest.whl")
    assert status == 200 and body == b"w" * 5000
    status, body = raw_get(state, "/redist/cuda_nvcc/linux-x86_64/cuda_nvcc-13.0.88-archive.tar.xz?x=1")
    assert status == 200 and body == b"r" * 3000


def test_a_second_start_of_the_run_reuses_the_server_and_stop_counts_what_it_served(cache, tmp_path):
    run_dir, state = cache
    again = fc.start(str(run_dir), dict(state["mounts"]), bind="127.0.0.1")
    assert again["reused"] and again["pid"] == state["pid"] and again["port"] == state["port"]
    get(state, "/wheels/six-1.17.0-py3-none-any.whl")
    get(state, "/wheels/six-1.17.0-py3-none-any.whl")
    get(state, "/wheels/missing.whl")
    time.sleep(0.2)
    result = fc.stop(str(run_dir))
    assert result["stopped"] and not fc.alive(state["pid"])
    served = result["served"]
    assert (served["requests"], served["bytes"], served["errors"]) == (3, 10000, 1)
    assert served["clients"] == {"127.0.0.1": {"requests": 3, "bytes": 10000}}


def test_the_server_ends_with_the_process_that_started_it(tmp_path):
    (tmp_path / "w").mkdir()
    owner = subprocess.Popen(["sleep", "60"])
    state = fc.start(str(tmp_path / "run"), {"wheels": str(tmp_path / "w")}, bind="127.0.0.1", watch_pid=owner.pid)
    assert fc.alive(state["pid"])
    owner.kill()
    owner.wait()
    deadline = time.monotonic() + 5
    while fc.alive(state["pid"]) and time.monotonic() < deadline:
        fc._reap(state["pid"])
        time.sleep(0.1)
    assert not fc.alive(state["pid"])


def test_the_server_ends_when_its_owner_has_exited_but_is_not_reaped_yet(tmp_path):
    # ansible-runner reaps ansible-playbook late: a zombie owner answers kill(pid, 0), yet its run is over.
    (tmp_path / "w").mkdir()
    owner = subprocess.Popen(["sleep", "60"])
    state = fc.start(str(tmp_path / "run"), {"wheels": str(tmp_path / "w")}, bind="127.0.0.1", watch_pid=owner.pid)
    owner.kill()
    try:
        deadline = time.monotonic() + 5
        while fc.alive(state["pid"]) and time.monotonic() < deadline:
            fc._reap(state["pid"])
            time.sleep(0.1)
        assert not fc.alive(owner.pid)  # the zombie counts as gone
        assert not fc.alive(state["pid"])
    finally:
        owner.wait()


def test_a_server_another_run_left_is_replaced_not_reused(tmp_path):
    # The next run must not adopt it: it would end once the old run's process is reaped, in the middle of this run.
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "a.whl").write_bytes(b"a" * 10)
    run_dir, mounts = str(tmp_path / "run"), {"wheels": str(tmp_path / "w")}
    owners = [subprocess.Popen(["sleep", str(60 + n)]) for n in range(2)]
    try:
        first = fc.start(run_dir, mounts, bind="127.0.0.1", watch_pid=owners[0].pid)
        assert fc.start(run_dir, mounts, bind="127.0.0.1", watch_pid=owners[0].pid)["reused"]
        second = fc.start(run_dir, mounts, bind="127.0.0.1", watch_pid=owners[1].pid)
        assert not second["reused"] and second["pid"] != first["pid"]
        fc._reap(first["pid"])
        assert not fc.alive(first["pid"])
        assert get(second, "/wheels/a.whl")[0] == 200
    finally:
        fc.stop(run_dir)
        for owner in owners:
            owner.kill()
            owner.wait()


def test_a_recorded_pid_that_is_now_another_process_is_neither_reused_nor_killed(tmp_path):
    (tmp_path / "w").mkdir()
    run_dir, mounts = tmp_path / "run", {"wheels": str(tmp_path / "w")}
    state = fc.start(str(run_dir), mounts, bind="127.0.0.1")
    fc.stop(str(run_dir))
    stranger = subprocess.Popen(["sleep", "60"])  # the pid the state names now belongs to something else
    try:
        (run_dir / "fleet-cache-wheels-127.0.0.1.json").write_text(json.dumps(dict(state, pid=stranger.pid)))
        again = fc.start(str(run_dir), mounts, bind="127.0.0.1")
        assert not again["reused"] and again["pid"] != stranger.pid
        assert fc.stop(str(run_dir))["servers"] == 1
        assert stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait()


def test_every_host_of_a_batch_starting_it_at_once_gets_the_one_server(tmp_path):
    # The task runs for every host of the batch at once (forks): one server starts, the others reuse it.
    (tmp_path / "w").mkdir()
    run_dir, mounts = str(tmp_path / "run"), {"wheels": str(tmp_path / "w")}
    barrier = threading.Barrier(16)

    def host():
        barrier.wait()
        return fc.start(run_dir, mounts, bind="127.0.0.1")

    try:
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            states = list(pool.map(lambda n: host(), range(16)))
        assert len({(s["pid"], s["port"]) for s in states}) == 1
        assert sorted(s["reused"] for s in states) == [False] + [True] * 15
    finally:
        assert fc.stop(run_dir)["servers"] == 1


def test_a_port_in_use_fails_with_the_fix(tmp_path, cache):
    _run_dir, state = cache
    (tmp_path / "w").mkdir()
    with pytest.raises(fc.FleetCacheError, match=r"did not start on 127.0.0.1:\d+ .*gpufleet_fleet_cache_port"):
        fc.start(str(tmp_path / "other"), {"wheels": str(tmp_path / "w")}, bind="127.0.0.1", port=state["port"])
    with pytest.raises(fc.FleetCacheError, match=r"192.0.2.1:0 .*not the controller's own .*gpufleet_fleet_cache_bind"):
        fc.start(str(tmp_path / "nat"), {"wheels": str(tmp_path / "w")}, bind="192.0.2.1")  # no address of this machine
    with pytest.raises(fc.FleetCacheError, match=r"/wheels/ \(.*nowhere\) does not exist"):
        fc.start(str(tmp_path / "third"), {"wheels": str(tmp_path / "nowhere")}, bind="127.0.0.1")


def test_host_url_is_the_controller_address_the_host_sees():
    assert fc.controller_address("10.88.0.1 51234 22") == "10.88.0.1"
    assert fc.controller_address("::ffff:10.88.0.1 51234 22") == "10.88.0.1"
    assert fc.controller_address("10.88.0.1 51234 22", "cache.example.internal") == "cache.example.internal"
    assert fc.host_url("10.88.0.1", 8000) == "http://10.88.0.1:8000"
    assert fc.host_url("fd00::1", 8000) == "http://[fd00::1]:8000"
    with pytest.raises(fc.FleetCacheError, match="set gpufleet_fleet_cache_host"):
        fc.controller_address("")


def test_it_listens_only_on_the_address_it_is_given(tmp_path):
    # Bound to 127.0.0.1 it is not reached at another address of this machine (127.0.0.2 is loopback too).
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "a.whl").write_bytes(b"a")
    run_dir = str(tmp_path / "run")
    state = fc.start(run_dir, {"wheels": str(tmp_path / "w")}, bind="127.0.0.1")
    try:
        assert get(state, "/wheels/a.whl")[0] == 200
        with pytest.raises(OSError):
            urllib.request.urlopen(f"http://127.0.0.2:{state['port']}/wheels/a.whl", timeout=5)
        # A second address (hosts that reach the controller elsewhere) gets its own server; the first keeps serving.
        other = fc.start(run_dir, {"wheels": str(tmp_path / "w")}, bind="127.0.0.2")
        assert not other["reused"] and other["pid"] != state["pid"] and fc.alive(state["pid"])
        with urllib.request.urlopen(f"http://127.0.0.2:{other['port']}/wheels/a.whl", timeout=5) as resp:
            assert resp.read() == b"a"
        assert get(state, "/wheels/a.whl")[0] == 200
    finally:
        assert fc.stop(run_dir)["servers"] == 2


def test_an_ipv6_address_is_listened_on(tmp_path):
    try:
        socket.create_server(("::1", 0), family=socket.AF_INET6).close()
    except OSError:
        pytest.skip("no IPv6 loopback here")
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "a.whl").write_bytes(b"a")
    state = fc.start(str(tmp_path / "run"), {"wheels": str(tmp_path / "w")}, bind="::1")
    try:
        with urllib.request.urlopen(f"{fc.host_url('::1', state['port'])}/wheels/a.whl", timeout=5) as resp:
            assert resp.read() == b"a"
    finally:
        fc.stop(str(tmp_path / "run"))


def test_each_role_gets_a_server_for_its_folder_and_stop_ends_them_all(tmp_path):
    (tmp_path / "w").mkdir()
    (tmp_path / "r").mkdir()
    (tmp_path / "w" / "a.whl").write_bytes(b"a" * 10)
    (tmp_path / "r" / "b.tar.xz").write_bytes(b"b" * 20)
    run_dir = str(tmp_path / "run")
    wheels = fc.start(run_dir, {"wheels": str(tmp_path / "w")}, bind="127.0.0.1")
    redist = fc.start(run_dir, {"redist": str(tmp_path / "r")}, bind="127.0.0.1")
    assert wheels["pid"] != redist["pid"] and not redist["reused"]
    assert fc.start(run_dir, {"wheels": str(tmp_path / "w")}, bind="127.0.0.1")["reused"]
    assert get(wheels, "/wheels/a.whl")[0] == 200 and get(redist, "/redist/b.tar.xz")[0] == 200
    assert get(wheels, "/redist/b.tar.xz")[0] == 404  # a server serves only its own folder
    time.sleep(0.2)
    result = fc.stop(run_dir)
    assert result["stopped"] and result["servers"] == 2
    assert (result["served"]["requests"], result["served"]["bytes"]) == (3, 30)
    assert not fc.alive(wheels["pid"]) and not fc.alive(redist["pid"])
