# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""GPU mode of the stand-in: one worker process per GPU, real GPU work per generated token.

SGLang's launcher starts one scheduler process per GPU (its TP ranks), each of which reserves
``--mem-fraction-static`` of its GPU's memory for weights and KV cache and then runs every decode step of the
running batch on that GPU. This module does the same, so NVML lists the workers as the server's compute processes,
the memory is held as a serving engine holds it, and a benchmark's speed and noise come from the GPU:

- each worker reserves the fraction of its GPU in one allocation and lays the "weights" out inside it: a target
  matrix of ``weights_gib`` GiB and a draft matrix a fraction of its size (an EAGLE draft head is a small part of
  the model);
- a decode step multiplies the batch's rows by the whole target matrix (memory-bound, as a real decode step is:
  its cost is the time to read the weights, nearly independent of the batch size);
- a speculative step runs the draft ``num_steps`` times over ``batch x topk`` rows, then one verify pass of the
  target over ``batch x draft_tokens`` rows; the tokens each step yields are those of ``timing.step_sizes`` (the
  accept length is a deterministic function of the configuration, so only the time is measured);
- ``draft_slowdown`` repeats the draft's passes, a draft that lost its fast kernel: the speculative speed-up falls
  and the benchmark's speculation gate must catch it;
- a prefill multiplies the new prompts' tokens by the target matrix (compute-bound, in chunks of ``PREFILL_ROWS``).

The launcher (``Engine``) never touches CUDA: it schedules the running batch in one thread (continuous batching,
as SGLang's scheduler loop) and sends each step to every worker, which run it in lock-step as TP ranks do.
"""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing
import os
import queue
import threading
import time

LOG = logging.getLogger("lab_sglang")

HIDDEN = 8192
DECODE_ROWS = 64  # rows of one decode or verify pass; more are split into passes
PREFILL_ROWS = 512  # prompt tokens of one prefill pass
MAX_RUNNING = 64  # requests in the running batch; more wait, as with SGLang's --max-running-requests


@dataclasses.dataclass(frozen=True)
class GpuConfig:
    mem_fraction_static: float = 0.88
    tp_size: int | None = None  # None: every visible GPU
    weights_gib: float = 8.0
    draft_fraction: float = 0.1
    draft_slowdown: float = 1.0
    speculative: bool = False
    num_steps: int = 3
    topk: int = 1
    draft_tokens: int = 4

    def draft_passes(self) -> int:
        """Draft passes of one speculative step: num_steps, times the slowdown."""
        return max(1, round(self.num_steps * self.draft_slowdown))


class WorkerError(RuntimeError):
    """A worker failed to start or to run a step; the message is the worker's."""


# -- worker side (runs in the child process; imports torch) -------------------------------------------------------
def _layout(total_bytes: int, reserve_bytes: int, cfg: GpuConfig) -> dict:
    """Byte offsets of the target, the draft and the work buffers inside the reserved block (pure arithmetic)."""
    elem = 2  # bf16
    target_cols = int(cfg.weights_gib * 2**30) // (elem * HIDDEN)
    draft_cols = max(1, int(target_cols * cfg.draft_fraction))
    sizes = {
        "target": HIDDEN * target_cols * elem,
        "draft": HIDDEN * draft_cols * elem,
        "x": PREFILL_ROWS * HIDDEN * elem,
        "out": PREFILL_ROWS * target_cols * elem,
    }
    offsets, used = {}, 0
    for name, size in sizes.items():
        offsets[name] = used
        used += -(-size // 256) * 256
    if used > reserve_bytes:
        raise WorkerError(
            f"the weights and work buffers need {used / 2**30:.1f} GiB but --mem-fraction-static reserves "
            f"{reserve_bytes / 2**30:.1f} GiB of {total_bytes / 2**30:.1f} GiB: raise --mem-fraction-static or lower "
            f"--lab-gpu-weights-gib"
        )
    return {"target_cols": target_cols, "draft_cols": draft_cols, "offsets": offsets, "sizes": sizes, "used": used}


class _Model:
    """The worker's tensors and the passes of one step."""

    def __init__(self, torch, device, cfg: GpuConfig):
        self.torch = torch
        self.cfg = cfg
        free, total = torch.cuda.mem_get_info(device)
        reserve = int(total * cfg.mem_fraction_static)
        if reserve > free:
            raise WorkerError(
                f"not enough memory on {torch.cuda.get_device_name(device)}: --mem-fraction-static "
                f"{cfg.mem_fraction_static} asks for {reserve / 2**30:.1f} GiB, {free / 2**30:.1f} GiB of "
                f"{total / 2**30:.1f} GiB are free (another process holds the rest); lower --mem-fraction-static"
            )
        lay = _layout(total, reserve, cfg)
        self.pool = torch.empty(reserve, dtype=torch.uint8, device=device)

        def view(name, rows, cols):
            start = lay["offsets"][name]
            return self.pool[start : start + lay["sizes"][name]].view(torch.bfloat16).view(rows, cols)

        self.target = view("target", HIDDEN, lay["target_cols"])
        self.draft = view("draft", HIDDEN, lay["draft_cols"])
        self.x = view("x", PREFILL_ROWS, HIDDEN)
        self.out = view("out", PREFILL_ROWS, lay["target_cols"])
        gen = torch.Generator(device=device).manual_seed(0)
        for tensor in (self.target, self.draft, self.x):
            tensor.normal_(0.0, 0.02, generator=gen)
        torch.cuda.synchronize(device)
        self.kernels = FlashInferKernels.load(torch, device)
        self.info = {
            "device": torch.cuda.get_device_name(device),
            "total_bytes": total,
            "reserved_bytes": reserve,
            "weight_bytes": lay["sizes"]["target"] + lay["sizes"]["draft"],
            "target_cols": lay["target_cols"],
            "draft_cols": lay["draft_cols"],
            "flashinfer": self.kernels.version if self.kernels is not None else None,
        }

    def _pass(self, weights, rows, chunk):
        cols = weights.shape[1]
        flat = self.out.view(-1)
        while rows > 0:
            n = min(rows, chunk)
            self.torch.matmul(self.x[:n], weights, out=flat[: n * cols].view(n, cols))
            rows -= n

    def step(self, prefill_tokens: int, batch: int, sampled: bool = False) -> None:
        """One scheduler iteration: the prefill of newly admitted prompts, then one decode step of the batch (with
        the batch's attention and, when a request samples, its sampler: FlashInfer kernels where it is installed)."""
        cfg = self.cfg
        if self.kernels is not None:
            self.kernels.step(prefill_tokens, batch, sampled)
        if prefill_tokens:
            self._pass(self.target, prefill_tokens, PREFILL_ROWS)
        if batch:
            if cfg.speculative:
                for _ in range(cfg.draft_passes()):
                    self._pass(self.draft, batch * cfg.topk, DECODE_ROWS)
                self._pass(self.target, batch * cfg.draft_tokens, DECODE_ROWS)
            else:
                self._pass(self.target, batch, DECODE_ROWS)
        self.torch.cuda.synchronize()


class FlashInferKernels:
    """The FlashInfer kernels a serving step runs, as SGLang runs them: batch attention of a decode step (a paged
    decode), a prefill's attention, and top-k/top-p sampling when a request samples. Each JIT-compiles the first time
    it runs (FlashInfer's cache folder: $FLASHINFER_WORKSPACE_BASE/.cache/flashinfer) unless the cache holds it."""

    HEADS_QO, HEADS_KV, HEAD_DIM, KV_LEN, VOCAB = 32, 8, 128, 256, 32000

    def __init__(self, torch, flashinfer, device):
        self.torch, self.fi, self.device = torch, flashinfer, device
        self.version = getattr(flashinfer, "__version__", "?")
        opts = {"dtype": torch.bfloat16, "device": device}
        self.q = torch.randn(self.HEADS_QO, self.HEAD_DIM, **opts)
        self.k = torch.randn(self.KV_LEN, self.HEADS_KV, self.HEAD_DIM, **opts)
        self.v = torch.randn(self.KV_LEN, self.HEADS_KV, self.HEAD_DIM, **opts)
        self.qp = torch.randn(16, self.HEADS_QO, self.HEAD_DIM, **opts)
        self.probs = torch.softmax(torch.randn(MAX_RUNNING, self.VOCAB, device=device), dim=-1)

    @classmethod
    def load(cls, torch, device):
        if os.environ.get("LAB_SGLANG_FLASHINFER", "1") == "0":
            return None
        try:
            import flashinfer
        except ImportError:
            LOG.warning("GPU mode without flashinfer: no JIT-compiled kernels run")
            return None
        return cls(torch, flashinfer, device)

    def step(self, prefill_tokens: int, batch: int, sampled: bool) -> None:
        fi = self.fi
        if prefill_tokens:
            fi.single_prefill_with_kv_cache(self.qp, self.k, self.v, causal=True, backend="fa2")
        if batch:
            fi.single_decode_with_kv_cache(self.q, self.k, self.v)
            if sampled:
                fi.sampling.top_k_top_p_sampling_from_probs(self.probs[:batch], 20, 0.9)


def worker_main(rank: int, gpu: int, cfg: GpuConfig, conn) -> None:
    """A TP rank: reserve the GPU's memory, answer ready, then run each step the launcher sends until it stops."""
    try:
        import torch

        if not torch.cuda.is_available():
            raise WorkerError(f"torch {torch.__version__} sees no CUDA device")
        device = torch.device("cuda", gpu)
        torch.cuda.set_device(device)
        model = _Model(torch, device, cfg)
    except Exception as exc:  # the launcher reports it and exits, as SGLang does when a scheduler dies
        conn.send(("error", f"TP{rank} (GPU {gpu}): {type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", dict(model.info, rank=rank, gpu=gpu, pid=os.getpid())))
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):  # the launcher is gone: never outlive it
            return
        if message[0] == "stop":
            return
        try:
            model.step(*message[1:])
        except Exception as exc:
            conn.send(("error", f"TP{rank} (GPU {gpu}): {type(exc).__name__}: {exc}"))
            return
        conn.send(("done",))


# -- launcher side (no torch, no CUDA) -----------------------------------------------------------------------------
def visible_gpu_count() -> int:
    """GPUs a worker may use, asked of a short child process so the launcher itself never holds a CUDA context."""
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_count_gpus, args=(child,), name="lab_sglang-probe")
    proc.start()
    child.close()
    try:
        count = parent.recv() if parent.poll(120) else 0
    except EOFError:
        count = 0
    proc.join(30)
    return count


def _count_gpus(conn) -> None:
    try:
        import torch

        conn.send(torch.cuda.device_count() if torch.cuda.is_available() else 0)
    except Exception:
        conn.send(0)


class _Request:
    def __init__(self, prompt_tokens: int, sizes, sampled: bool = False):
        self.prompt_tokens = prompt_tokens
        self.sampled = sampled
        self.sizes = tuple(sizes)
        self.next = 0
        self.events: queue.Queue = queue.Queue()
        self.cancelled = False


class Engine:
    """The workers and the scheduler loop; ``ticks`` is what a request handler reads.

    ``worker`` is the function each worker process runs (``worker_main``; the unit tests give one without a GPU).
    """

    def __init__(self, cfg: GpuConfig, worker=None, start_method: str = "spawn"):
        self.cfg = cfg
        self._worker = worker or worker_main
        self._start_method = start_method
        self.workers: list[dict] = []
        self._conns: list = []
        self._procs: list = []
        self._cond = threading.Condition()
        self._waiting: list[_Request] = []
        self._running: list[_Request] = []
        self._stopped = False
        self.failure: str | None = None
        self.on_failure = None  # called once a worker failed (the launcher shuts its HTTP server down)
        self.steps = 0

    # lifecycle
    def start(self, startup_timeout: float = 600.0) -> None:
        count = self.cfg.tp_size or visible_gpu_count()
        if count < 1:
            raise WorkerError("GPU mode needs a CUDA GPU and torch with CUDA in the server's environment; none seen")
        ctx = multiprocessing.get_context(self._start_method)
        for rank in range(count):
            parent, child = ctx.Pipe()
            proc = ctx.Process(
                target=self._worker, args=(rank, rank, self.cfg, child), name=f"lab_sglang-TP{rank}", daemon=True
            )
            proc.start()
            child.close()
            self._conns.append(parent)
            self._procs.append(proc)
        deadline = time.monotonic() + startup_timeout
        for rank, conn in enumerate(self._conns):
            if not conn.poll(max(0.0, deadline - time.monotonic())):
                self.stop()
                raise WorkerError(f"TP{rank} did not report ready within {startup_timeout:g} s")
            try:
                kind, payload = conn.recv()
            except EOFError:
                kind, payload = "error", f"TP{rank} exited while loading (exit code {self._procs[rank].exitcode})"
            if kind != "ready":
                self.stop()
                raise WorkerError(payload)
            self.workers.append(payload)
        threading.Thread(target=self._loop, name="lab_sglang-scheduler", daemon=True).start()

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        for conn in self._conns:
            try:
                conn.send(("stop",))
            except (OSError, ValueError):
                pass
        for proc in self._procs:
            proc.join(10)
            if proc.is_alive():
                proc.terminate()
                proc.join(5)

    # requests
    def ticks(self, prompt_tokens: int, sizes, sampled: bool = False):
        """Yield once per chunk (``sizes``: tokens of each step, ``timing.step_sizes``), as soon as the GPU step that
        makes it has finished. Closing the generator early (a client gone, a stream cut) takes the request out.
        """
        request = _Request(prompt_tokens, sizes, sampled)
        if not request.sizes:
            return
        with self._cond:
            if self.failure:
                raise WorkerError(self.failure)
            self._waiting.append(request)
            self._cond.notify_all()
        try:
            for _ in request.sizes:
                event = request.events.get()
                if event is not None:
                    raise WorkerError(event)
                yield
        finally:
            request.cancelled = True

    # the scheduler loop
    def _exited(self, rank: int) -> WorkerError:
        self._procs[rank].join(1)
        return WorkerError(f"TP{rank} exited (exit code {self._procs[rank].exitcode})")

    def _step(self, prefill_tokens: int, batch: int, sampled: bool = False) -> None:
        for rank, conn in enumerate(self._conns):
            try:
                conn.send(("step", prefill_tokens, batch, sampled))
            except OSError as exc:
                raise self._exited(rank) from exc
        for rank, conn in enumerate(self._conns):
            try:
                reply = conn.recv()
            except (EOFError, OSError) as exc:
                raise self._exited(rank) from exc
            if reply[0] != "done":
                raise WorkerError(reply[1])
        self.steps += 1

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._stopped and not self._waiting and not self._running:
                    self._cond.wait()
                if self._stopped:
                    return
                self._running = [r for r in self._running if not r.cancelled]
                admitted = self._waiting[: max(0, MAX_RUNNING - len(self._running))]
                self._waiting = self._waiting[len(admitted) :]
                self._running.extend(r for r in admitted if not r.cancelled)
                batch = list(self._running)
            try:
                self._step(
                    sum(r.prompt_tokens for r in admitted if not r.cancelled), len(batch), any(r.sampled for r in batch)
                )
            except WorkerError as exc:
                self._fail(str(exc))
                return
            for request in batch:
                request.next += 1
                request.events.put(None)
            with self._cond:
                self._running = [r for r in self._running if r.next < len(r.sizes) and not r.cancelled]

    def _fail(self, why: str) -> None:
        LOG.error("a scheduler process failed: %s", why)
        with self._cond:
            self.failure = why
            pending = self._waiting + self._running
            self._waiting, self._running = [], []
        for request in pending:
            request.events.put(why)
        if self.on_failure is not None:
            self.on_failure()
