# Copyright: (c) 2026, gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""``python -m lab``: image, mirrors, up, down, status."""

from __future__ import annotations

import argparse
import json
import sys
import time

from lab import image, mirrors, nodes
from lab.common import log, mirror_ports


def _ports(args) -> dict[str, int]:
    return mirror_ports({"lab-main": args.main_port, "lab-stale": args.stale_port, "redist": args.redist_port})


def _add_ports(p: argparse.ArgumentParser) -> None:
    p.add_argument("--main-port", type=int, help="lab-main index port (env LAB_MAIN_PORT, default 38100)")
    p.add_argument("--stale-port", type=int, help="lab-stale index port (env LAB_STALE_PORT, default 38101)")
    p.add_argument("--redist-port", type=int, help="redist mirror port (env LAB_REDIST_PORT, default 38102)")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m lab", description="gpufleet.upgrade lab")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("image", help="build the node image (cached by recipe hash)")
    p.add_argument("--force", action="store_true")
    p = sub.add_parser("mirrors", help="build / start / stop / status of the loopback mirrors")
    p.add_argument("action", choices=["build", "start", "stop", "restart", "status"])
    p.add_argument("--force", action="store_true", help="rebuild even when the recipe is unchanged")
    _add_ports(p)
    p = sub.add_parser("up", help="create N seeded nodes and an inventory")
    p.add_argument("n", type=int)
    p.add_argument("--name", default="lab")
    p.add_argument("--no-seed", action="store_true", help="bare nodes, without the old stack")
    _add_ports(p)
    p = sub.add_parser("down", help="remove a lab's nodes")
    p.add_argument("--name", default="lab")
    p = sub.add_parser("status", help="nodes, ports, mirror state")
    p.add_argument("--name")
    _add_ports(p)
    return ap


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    t0 = time.monotonic()
    try:
        if args.cmd == "image":
            print(image.build_image(force=args.force))
        elif args.cmd == "mirrors":
            ports = _ports(args)
            if args.action == "build":
                out = mirrors.build(force=args.force)
            elif args.action == "start":
                out = mirrors.start(ports)
            elif args.action == "restart":
                out = mirrors.restart(ports)
            elif args.action == "stop":
                out = {"stopped": mirrors.stop(ports)}
            else:
                out = mirrors.status(ports)
            print(json.dumps(out, indent=2))
        elif args.cmd == "up":
            print(json.dumps(nodes.up(args.n, args.name, _ports(args), do_seed=not args.no_seed), indent=2))
        elif args.cmd == "down":
            print(json.dumps({"removed": nodes.down(args.name)}))
        elif args.cmd == "status":
            print(json.dumps({**nodes.status(args.name), "mirrors": mirrors.status(_ports(args))}, indent=2))
    except RuntimeError as exc:
        log(f"error: {exc}")
        return 1
    log(f"{args.cmd} done in {time.monotonic() - t0:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
