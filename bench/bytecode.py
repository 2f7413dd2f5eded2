# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Benchmark: what a venv without bytecode costs the serving start, and what compiling it at install costs.

    python bench/bytecode.py [--import torch] [--package torch] [--repeats 3]

The serving unit starts right after the switch, inside the drain: every module it imports whose .pyc is missing is
compiled then, on the downtime's clock. Compiling the venv at build time (``uv pip sync --compile-bytecode``, as
pip always does) moves that cost to the prepare phase, while the host still serves. This prints, with the
interpreter running it (run it where the real packages are installed, e.g. on a GPU host):

- import cold: ``python -c "import <module>"`` with an empty PYTHONPYCACHEPREFIX (nothing compiled yet);
- import warm: the same with that prefix filled by the cold run (what every later start pays);
- compile all: ``compileall`` of the package's whole tree into a fresh prefix, serial and with one worker per core
  (what ``--compile-bytecode`` adds to the build), with the count of .py files.

Medians of --repeats runs; nothing is written outside temporary folders.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def timed(argv: list[str], prefix: str) -> float:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = prefix
    t0 = time.monotonic()
    subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL)
    return time.monotonic() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--import", dest="module", default="torch", help="module the serving start imports")
    ap.add_argument("--package", action="append", help="installed package whose tree to compile (repeatable)")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    packages = args.package or [args.module]
    roots = []
    for name in packages:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            raise SystemExit(f"package {name!r} is not installed for {sys.executable}")
        roots.append(Path(next(iter(spec.submodule_search_locations))))
    py_files = sum(1 for root in roots for _ in root.rglob("*.py"))
    rows: dict[str, list[float]] = {}
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory() as prefix:
            rows.setdefault("import cold", []).append(timed([sys.executable, "-c", f"import {args.module}"], prefix))
            rows.setdefault("import warm", []).append(timed([sys.executable, "-c", f"import {args.module}"], prefix))
        for label, workers in (("compile all, serial", 1), (f"compile all, {os.cpu_count()} workers", 0)):
            with tempfile.TemporaryDirectory() as prefix:
                cmd = [sys.executable, "-m", "compileall", "-q", "-j", str(workers), *map(str, roots)]
                rows.setdefault(label, []).append(timed(cmd, prefix))
    out = {
        "python": sys.version.split()[0],
        "import": args.module,
        "packages": packages,
        "py_files": py_files,
        "cpus": os.cpu_count(),
        "repeats": args.repeats,
        "median_s": {k: round(statistics.median(v), 2) for k, v in rows.items()},
        "first_start_extra_s": round(
            statistics.median(rows["import cold"]) - statistics.median(rows["import warm"]), 2
        ),
    }
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
