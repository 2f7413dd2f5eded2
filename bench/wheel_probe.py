# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The wheel plan's probe of an index that dates nothing: the default index's real listings (tests/data/index),
served as PEP 503 HTML without upload times, each file answering HEAD with Last-Modified, every request after
--latency seconds (a remote index's round trip).

    python bench/wheel_probe.py [--latency 0.1] [--projects torch,sgl-kernel,flashinfer-python]
    python bench/wheel_probe.py --only new --projects torch          one probe (for farm-bench)

Per project, two ways to date the listing:
  all-sequential  one HEAD per listed file, one after another, before any filtering (the planner before
                  _wheels.dating_needed: what a PEP 503 source without dates cost);
  probe           _wheel_plan.probe: HEAD only for the builds whose date the plan reads (those passing the spec
                  and tag filters, and the newest fitting release), Fetcher.head_workers at a time.
Prints files listed, HEAD requests and seconds for each, as JSON. Target: Python 3.12 on x86_64-manylinux_2_28.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / ".venv" / "collections"))

from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _wheel_plan, _wheels  # noqa: E402
from ansible_collections.gpufleet.upgrade.plugins.plugin_utils._index import Fetcher  # noqa: E402
from lab.recorded_index import RecordedIndex  # noqa: E402

TARGET = _wheels.Target("3.12", "x86_64-manylinux_2_28")
# What a plan asks of each project (the versions the cu130 stack's default-index packages run, or the newest the
# recording has where the stack's build is not on the default index).
SPECS = {"torch": "==2.9.1", "sgl-kernel": "==0.3.21", "flashinfer-python": "==0.6.4", "sglang": "==0.5.9"}


def one(project: str, latency: float, how: str) -> dict:
    with RecordedIndex(mode="html", latency=latency, projects=(project,)) as idx:
        wheels = {
            "indexes": [{"name": "html", "url": idx.url}],
            "packages": [{"name": project, "spec": SPECS[project], "indexes": ["html"]}],
            "rules": {},
        }
        rules_by_pkg, _rules = _wheels.rules_from_profile(wheels)
        fetcher = Fetcher(timeout=30)
        t0 = time.monotonic()
        if how == "all-sequential":
            cands = fetcher.listing("html", idx.url, project)
            sequential = Fetcher(timeout=30, head_workers=1)
            sequential.date_undated(cands)
        else:
            cands = _wheel_plan.probe(fetcher, wheels, rules_by_pkg, TARGET)
        seconds = time.monotonic() - t0
        return {
            "project": project,
            "how": how,
            "files_listed": len(cands),
            "head_requests": idx.count("HEAD"),
            "dated": sum(1 for c in cands if c.date),
            "seconds": round(seconds, 2),
        }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--latency", type=float, default=0.1)
    parser.add_argument("--projects", default="torch,sgl-kernel,flashinfer-python")
    parser.add_argument("--only", choices=["old", "new"])
    args = parser.parse_args()
    hows = {"old": ["all-sequential"], "new": ["probe"], None: ["all-sequential", "probe"]}[args.only]
    rows = [one(p, args.latency, how) for p in args.projects.split(",") for how in hows]
    print(json.dumps({"latency_s": args.latency, "results": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
