# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A host's return to service on the GPU machine: the post-check's warm-up against the GPU-resident stand-in, with an
empty FlashInfer JIT cache and with the cache the prepare step built beforehand.

    device run (carry .whl): python3 bench/return_device.py $OUT [--sm120]

For each of ``cold`` and ``prepared``:
- prepared only: while another process holds most of the GPU's memory (as the old server would), the collection's
  builder (plugins/module_utils/_jit_build.py, what module jit_cache runs in the new venv) builds the stand-in's kernel
  set (a decode, a prefill and the sampler: FlashInfer 0.6.4, bf16, head dim 128) for the GPU's SM into a fresh
  workspace, with the machine's nvcc;
- the stand-in starts in GPU mode (``--lab-gpu``: its worker runs the same FlashInfer kernels, JIT-compiled at first
  use) with that workspace as ``FLASHINFER_WORKSPACE_BASE``; the edges start -> process up -> /health are timed here,
  then module serving_warmup's own logic (``run``) warms it until a pass compiles nothing, at the profile's
  concurrency levels, greedy and sampled;
- "after the undrain": one more pass of the same shapes and the benchmark's requests; the kernels the server built
  then are counted (must be 0 with the prepared cache).
``--sm120`` also builds the same kernel set for SM 12.0 (``FLASHINFER_CUDA_ARCH_LIST=12.0a``) on this Hopper machine:
the build path of an RTX PRO 6000 host.

Writes OUTDIR/return-device.json (replayed by tests/unit/plugins/module_utils/test_device_return.py) and the logs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from smoke_device import collection_path, cuda_home, install_wheels  # noqa: E402
from spec_decode_device import Server, profile_settings  # noqa: E402

STARTED = time.monotonic()
KERNELS = [
    {"kind": "single_decode", "dtype": "bfloat16", "head_dim": 128},
    {"kind": "single_prefill", "dtype": "bfloat16", "head_dim": 128, "backend": "fa2"},
    {"kind": "sampling"},
]
HOLDER = (
    "import sys, time, torch\n"
    "free, total = torch.cuda.mem_get_info()\n"
    "x = torch.empty(int(total * float(sys.argv[1])), dtype=torch.uint8, device='cuda')\n"
    "torch.cuda.synchronize()\n"
    "print('holding', x.numel() >> 30, 'GiB of', total >> 30, flush=True)\n"
    "time.sleep(3600)\n"
)


def sm_arch():
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"], capture_output=True, text=True, check=True
    ).stdout.split()[0]
    major, minor = out.split(".")
    return f"{major}.{minor}{'a' if int(major) >= 9 else ''}"


def prepare(workspace, arch, out, tag):
    """The builder as module jit_cache runs it, while a holder keeps most of the GPU's memory."""
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, "0.85"], stdout=subprocess.PIPE, text=True)
    held = holder.stdout.readline().strip()
    request = {"archs": [arch], "workspace_base": workspace, "kernels": KERNELS}
    script = os.path.join(REPO, "plugins", "module_utils", "_jit_build.py")
    began = time.monotonic()
    res = subprocess.run([sys.executable, script, json.dumps(request)], capture_output=True, text=True, check=False)
    wall = round(time.monotonic() - began, 1)
    holder.kill()
    holder.wait()
    with open(os.path.join(out, f"prepare-{tag}.log"), "w", encoding="utf-8") as handle:
        handle.write(res.stdout + res.stderr)
    lines = res.stdout.strip().splitlines()
    result = json.loads(lines[-1]) if lines else {"error": res.stderr[-2000:]}
    return dict(result, rc=res.returncode, wall_s=wall, beside=held, arch=arch)


def params_for(sw, cache, bench):
    params = {name: spec.get("default") for name, spec in sw.argument_spec().items()}
    params.update(cache_dirs=[cache], concurrency=list(bench["concurrency"]), passes=4, request_timeout=900)
    return params


class NoUnit:
    def get_bin_path(self, _name):
        return None

    def run_command(self, argv):
        raise RuntimeError(f"no systemd here: {argv}")


def one(mode, out, serving, bench, arch, port, gpu=True):
    from ansible_collections.gpufleet.upgrade.plugins.module_utils import _warmup
    from ansible_collections.gpufleet.upgrade.plugins.modules import serving_warmup as sw

    workspace = f"/tmp/gpufleet-return-{mode}"
    subprocess.run(["rm", "-rf", workspace], check=False)
    os.makedirs(workspace)
    cache = os.path.join(workspace, ".cache", "flashinfer")
    record = {"mode": mode}
    if mode == "prepared":
        record["prepare"] = prepare(workspace, arch, out, mode)
    os.environ["FLASHINFER_WORKSPACE_BASE"] = workspace
    stop = time.monotonic()  # the old server is gone: the unit starts the new one now
    server = Server(out, port, serving, tag=f"server-{mode}", gpu=gpu)
    health = stop + server.start_s
    try:
        params = params_for(sw, cache, bench)
        params["serving_return"] = {
            "returned": True,
            "boot_id": sw.boot_id(),
            "times": {"stop": stop, "process_up": stop, "health": health},
        }
        params["server_url"] = server.url
        result = sw.run(NoUnit(), params)
        before = _warmup.snapshot([cache])
        # after the undrain: the shapes again and the benchmark's requests at its levels
        sw.make_pass(sw.Client(server.url, timeout=900), params)()
        from spec_decode_device import bench_params

        sdb, bparams = bench_params(bench)
        bparams.update(server_url=server.url, repeats=1)
        served = sdb.Bench(bparams, server.url).measure()
        late = _warmup.compiled(before, _warmup.snapshot([cache]), [cache])
        record.update(
            health_s=server.start_s,
            warmup=result["warmup"],
            gates=result["gates"],
            edges=result["return"]["edges"],
            compiled_after_undrain=late,
            served_tok_s=served.get("output_tok_s"),
        )
    finally:
        server.stop()
        os.environ.pop("FLASHINFER_WORKSPACE_BASE", None)
    return record


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--sm120", action="store_true")
    ap.add_argument("--port", type=int, default=31970)
    ap.add_argument("--modes", default="cold,prepared")
    ap.add_argument("--sm120-if-under", type=float, default=380.0, help="skip the SM 12.0 build past this many s")
    ap.add_argument("--lab", action="store_true", help="a dry run of the driver here: the stand-in's lab mode, no GPU")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    if not args.lab:
        install_wheels()
    sys.path.insert(0, collection_path())
    os.environ.setdefault("CUDA_HOME", cuda_home())
    os.environ.setdefault("MAX_JOBS", str(os.cpu_count() or 8))
    serving, bench = profile_settings("cu130")
    arch = "lab" if args.lab else sm_arch()
    doc = {"gpu_arch": arch, "cuda_home": os.environ["CUDA_HOME"], "kernels": KERNELS, "runs": []}
    path = os.path.join(args.out, "return-device.json")
    for mode in args.modes.split(","):
        try:
            doc["runs"].append(one(mode, args.out, serving, bench, arch, args.port, gpu=not args.lab))
        except Exception as exc:  # keep what the other mode measured
            doc["runs"].append({"mode": mode, "error": f"{type(exc).__name__}: {exc}"})
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(doc, handle, indent=2, default=str)
    spent = time.monotonic() - STARTED
    doc["driver_s_before_sm120"] = round(spent, 1)
    if args.sm120 and spent < args.sm120_if_under:
        workspace = "/tmp/gpufleet-return-sm120"
        subprocess.run(["rm", "-rf", workspace], check=False)
        doc["sm120_prepare"] = prepare(workspace, "12.0a", args.out, "sm120")
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(doc, handle, indent=2, default=str)
    print(json.dumps({r["mode"]: {k: r.get(k) for k in ("health_s", "edges", "compiled_after_undrain", "error")}
                      for r in doc["runs"]}, indent=1, default=str))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
