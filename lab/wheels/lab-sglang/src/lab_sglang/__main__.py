# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""`python -m lab_sglang --host H --port P --model-path M [--speculative-* ...]`.

Takes SGLang's launch_server flags that matter to the lab; other SGLang flags are accepted and
ignored with a warning so a real command line still starts. `--lab-*` flags (or LAB_SGLANG_*
variables) override the stack-derived rates and inject faults for tests.

`--lab-gpu` (LAB_SGLANG_GPU=1) runs on the host's GPUs instead (lab_sglang.gpu): one worker process per GPU,
each reserving `--mem-fraction-static` of its memory, every token made by GPU work; then `--mem-fraction-static`
and `--tp-size` are read as SGLang reads them.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time

from lab_sglang import __version__
from lab_sglang.gpu import Engine, GpuConfig, WorkerError
from lab_sglang.jit import LabJit, cache_root
from lab_sglang.server import FAULTS, Config, installed_distributions, make_server
from lab_sglang.stack import NEW_SGLANG, resolve_rates, version_tuple

LOG = logging.getLogger("lab_sglang")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m lab_sglang", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--model-path", required=True)
    parser.add_argument("--tokenizer-path")
    parser.add_argument("--served-model-name")
    parser.add_argument("--context-length", type=int, default=8192)
    parser.add_argument("--speculative-algorithm", choices=["EAGLE", "EAGLE3", "NEXTN", "STANDALONE"])
    parser.add_argument("--speculative-draft-model-path")
    parser.add_argument("--speculative-num-steps", type=int)
    parser.add_argument("--speculative-eagle-topk", type=int)
    parser.add_argument("--speculative-num-draft-tokens", type=int)
    env = os.environ.get
    lab = parser.add_argument_group("lab controls (also LAB_SGLANG_* variables)")
    lab.add_argument("--lab-stack", choices=["old", "new"], help="force the stack instead of reading versions")
    lab.add_argument("--lab-nospec-tok-s", type=float, help="decode tok/s of one request without speculation")
    lab.add_argument("--lab-spec-tok-s", type=float, help="decode tok/s of one request with speculation")
    lab.add_argument("--lab-accept-length", type=float, help="mean tokens accepted per verify step")
    lab.add_argument("--lab-ttft-ms", type=float, default=float(env("LAB_SGLANG_TTFT_MS", "20")))
    lab.add_argument(
        "--lab-prefill-us-per-token", type=float, default=float(env("LAB_SGLANG_PREFILL_US_PER_TOKEN", "20"))
    )
    lab.add_argument(
        "--lab-batch-penalty",
        type=float,
        default=float(env("LAB_SGLANG_BATCH_PENALTY", "0")),
        help="each other running request slows a new one by this fraction",
    )
    lab.add_argument(
        "--lab-startup-s",
        type=float,
        default=float(env("LAB_SGLANG_STARTUP_S", "1.0")),
        help="seconds before /health answers 200",
    )
    lab.add_argument(
        "--lab-load-s",
        type=float,
        default=float(env("LAB_SGLANG_LOAD_S", "0")),
        help="seconds the server loads (weights, CUDA graphs) before it binds its port",
    )
    lab.add_argument(
        "--lab-jit-compile-s",
        type=float,
        default=float(env("LAB_SGLANG_JIT_COMPILE_S", "0")),
        help="lab mode: seconds each kernel a new request shape needs takes to JIT-compile (its cache entry is "
        "written either way; 'off' via --lab-no-jit)",
    )
    lab.add_argument(
        "--lab-no-jit",
        action="store_true",
        default=env("LAB_SGLANG_JIT", "1") == "0",
        help="lab mode: model no JIT cache",
    )
    lab.add_argument("--lab-fault", choices=FAULTS, default=env("LAB_SGLANG_FAULT", "none"))
    lab.add_argument(
        "--lab-fault-every",
        type=int,
        default=int(env("LAB_SGLANG_FAULT_EVERY", "1")),
        help="inject the fault on every Nth generation request",
    )
    lab.add_argument("--lab-slow-s", type=float, default=float(env("LAB_SGLANG_SLOW_S", "30")))
    gpu = parser.add_argument_group("GPU mode (also LAB_SGLANG_* variables)")
    gpu.add_argument(
        "--lab-gpu",
        action="store_true",
        default=env("LAB_SGLANG_GPU", "").lower() in ("1", "true", "yes"),
        help="run on the GPUs: one worker process per GPU, real GPU work per token",
    )
    for flag, variable, default, text in (
        ("--lab-gpu-weights-gib", "GPU_WEIGHTS_GIB", "8", "bytes each decode step reads per GPU (the weights), GiB"),
        ("--lab-gpu-draft-fraction", "GPU_DRAFT_FRACTION", "0.1", "size of the draft as a fraction of the target"),
        ("--lab-draft-slowdown", "DRAFT_SLOWDOWN", "1", "run each draft pass this many times (a slow draft kernel)"),
    ):
        gpu.add_argument(flag, type=float, default=float(env("LAB_SGLANG_" + variable, default)), help=text)
    return parser


def gpu_parser() -> argparse.ArgumentParser:
    """SGLang's flags that only GPU mode uses; in CPU mode they stay among the ignored ones."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--mem-fraction-static", type=float, default=0.88)
    parser.add_argument("--tp-size", "--tp", type=int)
    return parser


def gpu_config(args: argparse.Namespace, gpu_args: argparse.Namespace, config: Config) -> GpuConfig | str:
    """The engine's settings, or what is wrong with them."""
    if not 0 < gpu_args.mem_fraction_static < 1:
        return f"--mem-fraction-static must be between 0 and 1, got {gpu_args.mem_fraction_static}"
    if gpu_args.tp_size is not None and gpu_args.tp_size < 1:
        return f"--tp-size must be 1 or more, got {gpu_args.tp_size}"
    if args.lab_gpu_weights_gib <= 0 or not 0 < args.lab_gpu_draft_fraction <= 1 or args.lab_draft_slowdown <= 0:
        return "--lab-gpu-weights-gib and --lab-draft-slowdown must be positive, --lab-gpu-draft-fraction in (0, 1]"
    return GpuConfig(
        mem_fraction_static=gpu_args.mem_fraction_static,
        tp_size=gpu_args.tp_size,
        weights_gib=args.lab_gpu_weights_gib,
        draft_fraction=args.lab_gpu_draft_fraction,
        draft_slowdown=args.lab_draft_slowdown,
        speculative=config.speculative,
        num_steps=args.speculative_num_steps or 3,
        topk=args.speculative_eagle_topk or 1,
        draft_tokens=config.draft_tokens,
    )


def check_speculative(args: argparse.Namespace) -> str | None:
    tuning = [args.speculative_num_steps, args.speculative_eagle_topk, args.speculative_num_draft_tokens]
    if any(v is not None for v in tuning) and not all(v is not None for v in tuning):
        return (
            "set all three of --speculative-num-steps, --speculative-eagle-topk, "
            "--speculative-num-draft-tokens, or none"
        )
    if args.speculative_algorithm in ("EAGLE", "EAGLE3") and not args.speculative_draft_model_path:
        return f"--speculative-algorithm {args.speculative_algorithm} needs --speculative-draft-model-path"
    if not args.speculative_algorithm and (args.speculative_draft_model_path or any(v is not None for v in tuning)):
        return "speculative flags given without --speculative-algorithm"
    return None


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="[%(asctime)s] %(levelname)s %(name)s: %(message)s"
    )
    args, unknown = build_parser().parse_known_args(argv)
    gpu_args = None
    if args.lab_gpu:
        gpu_args, unknown = gpu_parser().parse_known_args(unknown)
    if unknown:
        LOG.warning("ignoring SGLang flags the lab stand-in does not model: %s", " ".join(unknown))
    problem = check_speculative(args)
    if problem:
        LOG.error("invalid server arguments: %s", problem)
        return 2
    if args.lab_fault == "exit_on_start":
        LOG.error("RuntimeError: lab fault injection: the scheduler died while loading %s", args.model_path)
        return 1
    for label, path in (("model", args.model_path), ("draft model", args.speculative_draft_model_path)):
        if path and not os.path.exists(path):
            LOG.warning("%s path %s does not exist; the lab stand-in serves no real weights", label, path)
    try:
        rates = resolve_rates(args.lab_stack, args.lab_nospec_tok_s, args.lab_spec_tok_s, args.lab_accept_length)
    except ValueError as exc:
        LOG.error("invalid lab rates: %s", exc)
        return 2
    config = Config(
        host=args.host,
        port=args.port,
        model_path=args.model_path,
        served_model_name=args.served_model_name or args.model_path,
        rates=rates,
        speculative_algorithm=args.speculative_algorithm,
        speculative_draft_model_path=args.speculative_draft_model_path,
        speculative_num_steps=args.speculative_num_steps,
        speculative_eagle_topk=args.speculative_eagle_topk,
        speculative_num_draft_tokens=args.speculative_num_draft_tokens,
        ttft_base_s=args.lab_ttft_ms / 1000.0,
        prefill_s_per_token=args.lab_prefill_us_per_token / 1e6,
        batch_penalty=args.lab_batch_penalty,
        startup_s=args.lab_startup_s,
        fault=args.lab_fault,
        fault_every=args.lab_fault_every,
        slow_s=args.lab_slow_s,
        context_length=args.context_length,
        ignored_args=unknown,
        # 0.0.0 is a source tree, not a build of an old version: answer as the newest does.
        server_info_path=__version__ == "0.0.0" or version_tuple(__version__) >= NEW_SGLANG,
    )
    if args.lab_load_s > 0:
        LOG.info("loading weights and capturing CUDA graphs (lab: %.1f s)", args.lab_load_s)
        time.sleep(args.lab_load_s)
    if gpu_args is None and not args.lab_no_jit:
        flashinfer = installed_distributions().get("lab-flashinfer-python", "0.0.0")
        config.jit = LabJit(cache_root(), flashinfer, args.lab_jit_compile_s)
    engine = None
    if gpu_args is not None:
        gpu = gpu_config(args, gpu_args, config)
        if isinstance(gpu, str):
            LOG.error("invalid server arguments: %s", gpu)
            return 2
        # As SGLang: the schedulers load first, the HTTP server binds once they are ready.
        engine = Engine(gpu)
        try:
            engine.start()
        except WorkerError as exc:
            LOG.error("RuntimeError: a scheduler process failed to start: %s", exc)
            return 1
        config.engine = engine
        for worker in engine.workers:
            LOG.info(
                "TP%d: pid %d on GPU %d (%s), reserved %.1f of %.1f GiB, weights %.1f GiB",
                worker["rank"],
                worker["pid"],
                worker["gpu"],
                worker["device"],
                worker["reserved_bytes"] / 2**30,
                worker["total_bytes"] / 2**30,
                worker["weight_bytes"] / 2**30,
            )
    try:
        server = make_server(config)
    except OSError as exc:
        LOG.error("cannot bind %s:%s: %s", args.host, args.port, exc)
        if engine is not None:
            engine.stop()
        return 1
    if engine is not None:
        # A dead scheduler ends the server, as SGLang's launcher ends when one of its children dies.
        engine.on_failure = lambda: threading.Thread(target=server.shutdown, daemon=True).start()

    def stop(signum, _frame):
        LOG.info("received signal %d, shutting down", signum)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    LOG.info(
        "lab-sglang %s (stack %s): %s on %s:%d, speculative=%s, %s, accept length %.2f",
        __version__,
        rates.stack,
        args.model_path,
        args.host,
        server.server_address[1],
        args.speculative_algorithm or "off",
        f"{config.rate_tok_s:.1f} tok/s per request"
        if engine is None
        else f"GPU mode on {len(engine.workers)} GPU(s), draft slowdown x{engine.cfg.draft_slowdown:g}",
        rates.accept_length if config.speculative else 1.0,
    )
    LOG.info("The server is fired up and ready to roll!")
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        if engine is not None:
            engine.stop()
    return 1 if engine is not None and engine.failure else 0


if __name__ == "__main__":
    sys.exit(main())
