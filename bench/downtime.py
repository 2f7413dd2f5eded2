# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Drained time per host, and the share each edge of the return to service takes, with and without a prepared JIT
cache, for each drain mode.

    python bench/downtime.py [--modes stop,haproxy] [--caches cold,prepared] [--repeats 1] [--keep]

For each mode and cache: a fresh one-node lab dt-<mode>-<cache> at the old stack, upgrade.yml once, then the run's
fleet report (report.json, written by the summary callback) gives the host's drained time (the phases the phase table
marks drained, plus undrain), its downtime and its return to service edge by edge (stop -> process up -> /health ->
warm, role serving and the post-check's warm-up). The stand-in loads for LOAD_S before it binds and JIT-compiles
each kernel of a new request shape in COMPILE_S (its lab mode); ``prepared`` writes the new stack's kernels into the
node's cache before the upgrade, which is what the prepare phase's module jit_cache does on a GPU host (the lab venv
holds no FlashInfer for it to build with). Mode haproxy starts the lab's HAProxy (lab/haproxy.py) in front of the node.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "lab" / "wheels" / "lab-sglang" / "src"))
sys.path.insert(0, str(REPO / ".venv" / "collections"))

from lab_sglang.jit import kernels_for  # noqa: E402

from ansible_collections.gpufleet.upgrade.plugins.module_utils._state import PHASE_TABLE  # noqa: E402
from lab import haproxy as lab_haproxy  # noqa: E402
from lab import mirrors, nodes  # noqa: E402
from lab.common import mirror_ports  # noqa: E402
from lab.harness import run_playbook  # noqa: E402

LOAD_S, COMPILE_S = 3.0, 2.0
LAB_SERVER = {"LAB_SGLANG_LOAD_S": str(LOAD_S), "LAB_SGLANG_JIT_COMPILE_S": str(COMPILE_S)}
# The new lab stack's flashinfer (lab-flashinfer-python 0.6.4) and the stand-in's arch folder.
CACHE = "/root/.cache/flashinfer/0.6.4/lab/cached_ops"
DRAINED = [p.name for p in PHASE_TABLE if p.drained] + ["undrain"]


def seed_cache(node: str, concurrency=(1,)) -> list:
    """The kernels the new server meets at these levels, written where it looks (jit_cache builds them on GPU hosts)."""
    names = sorted({k for c in concurrency for s in (False, True) for k in kernels_for(s, c, True, 16)})
    script = "; ".join(f"mkdir -p {CACHE}/{k} && echo prepared > {CACHE}/{k}/{k}.so" for k in names)
    nodes.node_exec(node, ["sh", "-c", script], check=True)
    return names


def one(mode: str, cache: str, ports: dict, keep: bool) -> dict:
    lab = f"dt-{mode}-{cache}"
    nodes.down(lab)
    made = nodes.up(1, lab, ports)
    node = made["nodes"][0]
    extravars = {"gpufleet_drain": mode, "serving_env": LAB_SERVER}
    try:
        if mode == "haproxy":
            info = lab_haproxy.start(lab)
            extravars.update(
                gpufleet_haproxy_socket=info["socket"], gpufleet_haproxy_backend=info["backend"],
                gpufleet_haproxy_server=node,
            )  # fmt: skip
        seeded = seed_cache(node) if cache == "prepared" else []
        res = run_playbook("playbooks/upgrade.yml", REPO / ".lab" / lab / "inventory.yml", extravars=extravars)
        if res.rc != 0:
            raise SystemExit(f"upgrade with gpufleet_drain={mode} ({cache}) failed:\n{res}")
        reports = sorted((REPO / ".lab" / lab / "controller" / "runs").glob("*/report.json"))
        host = json.loads(reports[-1].read_text())["hosts"][0]
        drained = round(sum(p["duration_s"] or 0 for p in host["phases"] if p["name"] in DRAINED), 1)
        ret = host["return"]
        edges = {e["key"]: e["s"] for e in ret["edges"]}
        return {
            "drained_s": drained,
            "downtime_s": host["downtime_s"],
            "upgrade_s": host["duration_s"],
            "return_s": ret["total_s"],
            "edges_s": edges,
            "share_of_drained": {k: round(v / drained, 3) for k, v in edges.items() if v is not None and drained},
            "kernels_compiled": ret["kernels_compiled"],
            "compiled_after_warmup": ret["compiled_after_warmup"],
            "seeded": seeded,
        }
    finally:
        if mode == "haproxy":
            lab_haproxy.stop(lab)
        if not keep:
            nodes.down(lab)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--modes", default="stop,haproxy")
    ap.add_argument("--caches", default="cold,prepared")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args(argv)
    ports = mirror_ports()
    mirrors.build()
    mirrors.start(ports)
    report = {"load_s": LOAD_S, "compile_s_per_kernel": COMPILE_S}
    for mode in args.modes.split(","):
        for cache in args.caches.split(","):
            runs = [one(mode, cache, ports, args.keep) for _ in range(args.repeats)]
            drained = statistics.median(r["drained_s"] for r in runs)
            report[f"{mode}/{cache}"] = {"drained_s": drained, "runs": runs}
            print(json.dumps({f"{mode}/{cache}": report[f"{mode}/{cache}"]}, indent=1), flush=True)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
