# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The upgrade's headline figures, measured by spec_decode_bench against the lab's SGLang stand-in.

    .venv/bin/python bench/spec_decode_lab.py [--repeats 2] [--warmup 1]

Starts four stand-in servers on loopback (old / new stack, with / without EAGLE-3), runs the module through
ansible-playbook (connection local) the way the postcheck does, and prints output tok/s, accept length,
TTFT / ITL p50, the coefficient of variation, both gates' verdicts and each benchmark's wall time. The
stand-in's nominal rates (old 54.1 vs 60.0, new 96.1 vs 60.0 tok/s) are the reference: the printed
figures show how closely the module measures them (dev% = measured / nominal - 1; wall s = one
spec_decode_bench task, both servers, Ansible included).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "lab" / "wheels" / "lab-sglang" / "src"
PLAYBOOK = REPO / "tests" / "integration" / "playbooks" / "bench_run.yml"
SPEC = [
    "--speculative-algorithm",
    "EAGLE3",
    "--speculative-draft-model-path",
    "/srv/models/lab-draft",
    "--speculative-num-steps",
    "3",
    "--speculative-eagle-topk",
    "4",
    "--speculative-num-draft-tokens",
    "16",
]
NOMINAL = {("old", True): 54.1, ("old", False): 60.0, ("new", True): 96.1, ("new", False): 60.0}


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start(stack, spec, logdir):
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(SRC), LAB_SGLANG_STARTUP_S="0")
    log = open(Path(logdir) / f"{stack}-{'spec' if spec else 'nospec'}.log", "w")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "lab_sglang",
            "--port",
            str(port),
            "--model-path",
            "/srv/m",
            "--lab-stack",
            stack,
            *(SPEC if spec else []),
        ],
        env=env,
        stdout=log,
        stderr=log,
    )
    return proc, f"http://127.0.0.1:{port}"


def run_bench(workdir, options):
    out = Path(workdir) / f"result-{time.monotonic_ns()}.json"
    inventory = Path(workdir) / "inventory.json"
    inventory.write_text(
        json.dumps(
            {
                "all": {
                    "hosts": {
                        "bench-local": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
                    }
                }
            }
        )
    )
    start_t = time.monotonic()
    proc = subprocess.run(
        [
            str(REPO / ".venv" / "bin" / "ansible-playbook"),
            "-i",
            str(inventory),
            str(PLAYBOOK),
            "-e",
            json.dumps({"bench": options, "bench_save_path": str(out)}),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    wall = time.monotonic() - start_t
    if not out.exists():
        sys.exit(f"benchmark failed:\n{proc.stdout[-3000:]}")
    return json.loads(out.read_text()), wall


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--order", nargs="+", choices=["old", "new"], default=["old", "new"])
    args = parser.parse_args()
    procs = []
    with tempfile.TemporaryDirectory(prefix="bench-spec-decode-") as workdir:
        try:
            urls = {}
            for stack in ("old", "new"):
                for spec in (True, False):
                    proc, urls[(stack, spec)] = start(stack, spec, workdir)
                    procs.append(proc)
            time.sleep(1.0)
            print(f"prompt set v1, repeats {args.repeats}, warmup {args.warmup}, concurrency 1, api generate")
            header = (
                f"{'stack':5} {'spec':6} {'nominal':>8} {'tok/s':>7} {'dev%':>6} {'accept':>6} "
                f"{'ttft p50':>9} {'itl p50':>8} {'cv':>6} {'gates':28} {'wall s':>6}"
            )
            print(header)
            print("-" * len(header))
            for stack in args.order:
                options = {
                    "server_url": urls[(stack, True)],
                    "nospec_server_url": urls[(stack, False)],
                    "repeats": args.repeats,
                    "warmup": args.warmup,
                    "min_spec_speedup": 1.0,
                    "fail_on_gate": False,
                    "label": stack,
                }
                result, wall = run_bench(workdir, options)
                verdict = " ".join(
                    f"{g['name'][:4]}:{'skip' if g['skipped'] else 'ok' if g['passed'] else 'FAIL'}"
                    for g in result["gates"]
                )
                for spec, bench in ((True, result["bench"]), (False, result["nospec_bench"])):
                    lv = bench["levels"][0]
                    nominal = NOMINAL[(stack, spec)]
                    accept = f"{bench['accept_length']:.3f}" if bench["accept_length"] else "-"
                    cv = f"{lv['output_tok_s']['cv']:.4f}" if lv["output_tok_s"]["cv"] is not None else "-"
                    print(
                        f"{stack:5} {'EAGLE3' if spec else 'off':6} {nominal:8.1f} {bench['output_tok_s']:7.2f} "
                        f"{(bench['output_tok_s'] / nominal - 1) * 100:+6.2f} {accept:>6} "
                        f"{lv['ttft_ms']['p50']:8.1f}ms {lv['itl_ms']['p50']:6.1f}ms {cv:>6} "
                        f"{verdict if spec else '':28} {f'{wall:6.1f}' if spec else '':>6}"
                    )
                speed = next(g for g in result["gates"] if g["name"] == "speculation")
                print(f"      speculation gate: {speed['message']}")
        finally:
            for proc in procs:
                proc.terminate()
                proc.wait(timeout=10)


if __name__ == "__main__":
    main()
