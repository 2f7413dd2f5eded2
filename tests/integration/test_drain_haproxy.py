# Copyright: (c) 2026, gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Drain through a real HAProxy during a rolling upgrade: no request fails.

Four lab hosts behind HAProxy (Debian's package, on loopback, lab/haproxy.py) with health checks and no retries, so
a request sent to a host that stops serving fails visibly. A client pool sends POST /generate through HAProxy for
the whole run of playbooks/upgrade.yml (gpufleet_drain=haproxy, one host per batch); one host fails after its
post-check (gpufleet_fault_inject=after_postcheck) and is rolled back. Asserted: zero failed requests, every request
answered, three hosts upgraded, one rolled back, every host back in rotation (ready and UP) at the end, no drain
record left. Printed: requests sent, failures, p50/p99 latency.
"""

from __future__ import annotations

import datetime
import json
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _drain_haproxy as hx
from lab import haproxy as lab_haproxy

# Six to seven minutes (a rolling upgrade of 4 hosts under load): `make integration-long`, not `make test`.
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.long]

# The third host fails right after its post-check (fleet names carry the test run's suffix: match the node's own name).
INJECT = "{{ 'after_postcheck' if inventory_hostname is match('.*-node3$') else 'none' }}"
WORKERS = 4
# The lab shares two cores with other work: give SSH room so a busy machine is not an unreachable host.
ENV = {"ANSIBLE_CALLBACKS_ENABLED": "gpufleet.upgrade.upgrade_summary", "ANSIBLE_TIMEOUT": "60"}


class Load:
    """A bounded client pool: WORKERS threads, one request at a time each, until stopped (or max_requests)."""

    def __init__(self, port, max_requests=20000):
        self.url = f"http://127.0.0.1:{port}/generate"
        self.max_requests = max_requests
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.sent = 0
        self.latencies = []
        self.failures = []

    def one(self, i):
        body = json.dumps({"text": f"drain test {i}", "sampling_params": {"max_new_tokens": 4}}).encode()
        req = urllib.request.Request(self.url, data=body, headers={"Content-Type": "application/json"})
        start = time.monotonic()
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                answer = json.load(resp)
            ok = resp.status == 200 and isinstance(answer.get("text"), str) and answer.get("meta_info")
            error = None if ok else f"status {resp.status}: {str(answer)[:120]}"
        except (urllib.error.URLError, OSError, ValueError) as exc:
            error = f"{type(exc).__name__}: {exc}"
        with self.lock:
            if error:
                self.failures.append((round(time.time(), 2), error))
            else:
                self.latencies.append(time.monotonic() - start)

    def worker(self, w):
        while not self.stop.is_set():
            with self.lock:
                if self.sent >= self.max_requests:
                    return
                self.sent += 1
                i = self.sent
            self.one(i)
            time.sleep(0.1)

    def run(self):
        with ThreadPoolExecutor(max_workers=WORKERS) as pool:
            list(pool.map(self.worker, range(WORKERS)))

    def percentile(self, q):
        values = sorted(self.latencies)
        return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def servers(socket_path):
    api = hx.Runtime(socket_path)
    states = hx.parse_servers_state(api.command("show servers state serving"))
    stats = hx.parse_stat(api.command("show stat serving 4 -1"))
    return {r["srv_name"]: hx.server_view(states, stats, "serving", r["srv_name"]) for r in states}


def timeline(result, failures):
    """Each failure with the tasks that ended just before it (what the fleet was doing then)."""
    ended = sorted(
        (datetime.datetime.fromisoformat(ev["created"]).replace(tzinfo=datetime.timezone.utc).timestamp(), ev)
        for ev in result.events
        if ev.get("event") in ("runner_on_ok", "runner_on_failed") and ev.get("created")
    )
    lines = []
    for ts, error in failures[:12]:
        before = [f"{e['event_data'].get('host')}: {e['event_data'].get('task')}" for t, e in ended if t <= ts][-3:]
        lines.append(f"{ts:.2f} {error} after {before}")
    return "\n".join(lines)


def report_of(result, node):
    found = [t for t in result.tasks("Publish the host's report", host=node) if "ansible_facts" in t.res]
    assert found, f"{node} published no report\n{result}"
    return found[-1].res["ansible_facts"]["gpufleet_upgrade_report"]


@pytest.fixture(scope="module")
def fleet(lab_fleet):
    return lab_fleet(4, name="drain")


def checked_up(socket_path):
    """Every server UP by a passed health check: at start HAProxy counts a server UP before its first check."""
    rows = hx.parse_stat(hx.Runtime(socket_path).command("show stat serving 4 -1"))
    return bool(rows) and all(r["status"] == "UP" and r["check_status"] == "L7OK" for r in rows)


@pytest.fixture(scope="module")
def balancer(fleet):
    info = lab_haproxy.start(fleet.name)
    deadline = time.monotonic() + 60
    # A freshly seeded unit answers 503 until it is ready; the load starts once each passed HAProxy's check.
    while not checked_up(info["socket"]):
        assert time.monotonic() < deadline, f"lab servers not UP behind haproxy: {servers(info['socket'])}"
        time.sleep(0.5)
    yield info
    lab_haproxy.stop(fleet.name)


def test_rolling_upgrade_behind_haproxy_fails_no_request(fleet, balancer, run_playbook, tmp_path):
    assert [n.rsplit("-", 1)[1] for n in fleet.nodes] == ["node1", "node2", "node3", "node4"], fleet.nodes
    failing = fleet.nodes[2]
    records = tmp_path / "drain-records"
    load = Load(balancer["port"])
    client = threading.Thread(target=load.run, daemon=True)
    t0 = time.monotonic()
    client.start()
    try:
        result = run_playbook(
            "playbooks/upgrade.yml",
            fleet.inventory,
            envvars=ENV,
            extravars={
                "gpufleet_batch_size": 1,
                # Every host runs: the failed one must not stop the rollout before the last host.
                "gpufleet_max_failed_hosts": 1,
                "gpufleet_drain": "haproxy",
                "gpufleet_haproxy_socket": balancer["socket"],
                "gpufleet_haproxy_backend": balancer["backend"],
                "gpufleet_drain_record_dir": str(records),
                "gpufleet_drain_timeout_s": 60,
                # One host fails right after its post-check (the test hook of phase postcheck) and rolls back.
                "gpufleet_fault_inject": INJECT,
            },
        )
    finally:
        load.stop.set()
        client.join(timeout=60)
    wall = time.monotonic() - t0
    answered = len(load.latencies)
    print(
        f"\ndrain_haproxy: {load.sent} requests sent in {wall:.0f}s, {answered} answered, {len(load.failures)} failed, "
        f"p50 {load.percentile(0.50) * 1000:.0f} ms, p99 {load.percentile(0.99) * 1000:.0f} ms"
    )

    counters = hx.parse_stat(hx.Runtime(balancer["socket"]).command("show stat serving 4 -1"))
    keys = ("stot", "hrsp_5xx", "econ", "eresp", "srv_abrt", "cli_abrt")
    print("haproxy counters:", {r["svname"]: {k: r[k] for k in keys} for r in counters})
    errors = lab_haproxy.error_log(balancer["socket"])
    print(f"haproxy logged {len(errors)} event(s): state changes, failed or abnormal requests", *errors[:20], sep="\n")
    outcomes = {node: report_of(result, node)["outcome"] for node in fleet.nodes}
    assert {n: o for n, o in outcomes.items() if n != failing} == {
        n: "upgraded" for n in fleet.nodes if n != failing
    }, outcomes
    assert outcomes[failing].startswith("rolled back: after postcheck"), outcomes
    assert "injected fault after_postcheck" in outcomes[failing], outcomes
    # The rolled-back host's report says the rollback put it back in rotation, not only that it restored the backup.
    undrain = report_of(result, failing)["phases"].get("undrain", "")
    assert "ready" in undrain and failing in undrain, report_of(result, failing)["phases"]
    for node in fleet.nodes:
        drained = result.task("Take the host out of HAProxy's rotation", host=node)
        assert drained.changed and drained.res["previous"] == "ready", drained.res
        back = result.tasks("Put the host back in HAProxy's rotation", host=node)
        assert back and back[-1].res["admin_state"] == "ready", (node, [b.res for b in back])

    assert load.failures == [], timeline(result, load.failures) + "\n" + "\n".join(errors[:20])
    assert load.sent > 100 and answered == load.sent, (load.sent, answered)
    counters = hx.parse_stat(hx.Runtime(balancer["socket"]).command("show stat serving 4 -1"))
    print(
        {
            r["svname"]: {k: r[k] for k in ("stot", "hrsp_5xx", "econ", "eresp", "srv_abrt", "cli_abrt")}
            for r in counters
        }
    )
    final = servers(balancer["socket"])
    assert {n: (v["admin"], v["status"]) for n, v in final.items()} == {n: ("ready", "UP") for n in fleet.nodes}
    assert list(records.glob("*.json")) == [], "a drain record was left behind"
