# Copyright: (c) 2026, gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""An upgrade whose host pulls through a real site cache: nginx (Debian's package, lab/site_cache.py) on loopback,
named by ``gpufleet_fleet_cache_url``, in front of a static origin of the controller's wheelhouse and redist cache.

One lab host, playbooks/upgrade.yml with distribution pull. Asserted from nginx's own logs: the host's wheels and
toolkit archives came through the site cache (each a MISS fetched once from the origin, whole: as many bytes as the
controller's file), the run's own fleet cache served nothing, and a second fetch of the same file from the host is
a HIT that does not reach the origin.
"""

from __future__ import annotations

import time
import urllib.parse

import pytest

from lab import nodes
from lab import site_cache as lab_site_cache

# A whole upgrade of one host (minutes on a shared machine): `make integration-long`, not `make test`.
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.long]

ENV = {"ANSIBLE_CALLBACKS_ENABLED": "gpufleet.upgrade.upgrade_summary", "ANSIBLE_TIMEOUT": "60"}


@pytest.fixture(scope="module")
def fleet(lab_fleet):
    return lab_fleet(1, name="sc-it")


@pytest.fixture(scope="module")
def site_cache(fleet):
    # The origin serves the folders of the inventory's gpufleet_controller_dir, which the run fills and verifies.
    info = lab_site_cache.start(fleet.name, controller_dir=nodes.lab_dir(fleet.name) / "controller", clear=True)
    yield info
    lab_site_cache.stop(fleet.name)


def test_the_host_pulls_through_the_site_cache(fleet, site_cache, run_playbook, node_exec):
    controller = nodes.lab_dir(fleet.name) / "controller"
    origin = lab_site_cache.origin_folders(controller)
    since = time.time()
    result = run_playbook(
        "playbooks/upgrade.yml",
        fleet.inventory,
        envvars=ENV,
        extravars={"gpufleet_distribution": "pull", "gpufleet_fleet_cache_url": site_cache["url"]},
    )
    assert result.rc == 0, result

    rows = lab_site_cache.read_log(site_cache["access_log"], since)
    fetched = lab_site_cache.read_log(site_cache["origin_log"], since)
    print("\nsite cache:", lab_site_cache.counts(rows, fetched))
    misses = {r["path"]: r for r in rows if r["cache"] == "MISS"}
    wheels = [p for p in misses if p.startswith("/wheels/")]
    archives = [p for p in misses if p.startswith("/redist/")]
    assert wheels, f"no wheel came through the site cache: {rows}"
    assert archives, f"no toolkit archive came through the site cache: {rows}"
    for path, row in misses.items():
        mount, rest = path.lstrip("/").split("/", 1)
        size = (origin[mount] / urllib.parse.unquote(rest)).stat().st_size
        assert (row["method"], row["status"], row["bytes"]) == ("GET", 200, size), row
    # Each file left the origin once, whole; nothing else was asked of it.
    assert sorted((r["path"], r["bytes"]) for r in fetched) == sorted((p, r["bytes"]) for p, r in misses.items())
    own = [p for p in (controller / "runs").glob("*/fleet-cache-*.access.jsonl") if p.read_text().strip()]
    assert own == [], f"the run's own fleet cache served requests: {own}"

    # A second fetch of a wheel, from the host: the cache answers it, the origin is not asked again.
    again = time.time()
    path = wheels[0]
    res = node_exec(
        fleet.nodes[0], ["curl", "-fsS", "-o", "/dev/null", "-w", "%{size_download}", site_cache["url"] + path]
    )
    assert res.returncode == 0, res.stderr
    assert int(res.stdout) == misses[path]["bytes"]
    later = [r for r in lab_site_cache.read_log(site_cache["access_log"], again) if r["path"] == path]
    assert [(r["cache"], r["bytes"]) for r in later] == [("HIT", misses[path]["bytes"])]
    assert lab_site_cache.read_log(site_cache["origin_log"], again) == []
