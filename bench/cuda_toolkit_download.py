# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Download economy of role cuda_toolkit: bytes that cross from the redist mirror ("upstream") for an
N-host lab run, against what per-host downloads would cost, and the cost of a second run.

    python bench/cuda_toolkit_download.py [--hosts 4] [--keep]

Brings up lab `cuda-bench` (N nodes at CUDA 12.8), runs the role twice with an empty controller cache,
and reads the lab mirror's access log (requests carrying this run's User-Agent).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from lab import mirrors, nodes  # noqa: E402
from lab.common import mirror_ports  # noqa: E402
from lab.harness import run_playbook  # noqa: E402

PLAY = REPO / "tests" / "integration" / "playbooks" / "cuda_toolkit.yml"


def mirror_bytes(ports, agent, since):
    rows = [r for r in mirrors.read_access_log("redist", ports["redist"], since) if r.get("user_agent") == agent]
    return len(rows), sum(r.get("bytes") or 0 for r in rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--keep", action="store_true", help="leave the lab up")
    args = ap.parse_args(argv)
    ports = mirror_ports()
    mirrors.build()
    mirrors.start(ports)
    fleet = nodes.up(args.hosts, "cuda-bench", ports)
    agent = f"gpufleet-bench-{uuid.uuid4().hex[:8]}"
    cache = Path(tempfile.mkdtemp(prefix="cuda-bench-cache-"))
    extra = {"cuda_toolkit_cache_dir": str(cache), "cuda_toolkit_http_agent": agent}
    report = {"hosts": args.hosts}
    try:
        for label in ("first_run", "second_run"):
            t0 = time.time()
            res = run_playbook(PLAY, fleet["inventory"], extravars=extra)
            if res.rc != 0:
                print(str(res), file=sys.stderr)
                return 1
            requests, sent = mirror_bytes(ports, agent, t0)
            report[label] = {
                "wall_s": round(time.time() - t0, 1),
                "mirror_requests": requests,
                "bytes_from_mirror": sent,
                "hosts_changed": sum(1 for s in res.stats.values() if s["changed"]),
            }
        manifest = json.loads((cache / "redistrib_13.0.2.json").read_text())
        archives = sum(
            int(v["linux-x86_64"]["size"])
            for k, v in manifest.items()
            if isinstance(v, dict) and k in ("cuda_nvcc", "cuda_crt", "libnvvm", "cuda_cudart", "cuda_cccl")
        )
        report["archive_bytes_per_host"] = archives
        report["per_host_download_would_be"] = archives * args.hosts
    finally:
        if not args.keep:
            nodes.down("cuda-bench")
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
