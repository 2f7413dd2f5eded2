# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""HTTP side of the stand-in: SGLang's paths, fields and streaming format, on the standard library.

Streams are Server-Sent Events (`data: {json}` lines, a blank line after each, `data: [DONE]` last)
sent with chunked transfer encoding, as SGLang's StreamingResponse does. /generate streams the
cumulative text (SGLang's default without --incremental-streaming-output); the OpenAI endpoints
stream deltas.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import logging
import os
import socket
import sys
import threading
import time
import uuid
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from lab_sglang.jit import kernels_for
from lab_sglang.stack import Rates
from lab_sglang.timing import Schedule, build_schedule, prompt_token_count

LOG = logging.getLogger("lab_sglang")

FAULTS = ("none", "http500", "slow", "malformed_json", "stream_cut", "never_healthy", "exit_on_start")
WORDS = (
    "the",
    "fleet",
    "upgrade",
    "kernel",
    "token",
    "draft",
    "verify",
    "accept",
    "cuda",
    "stack",
    "wheel",
    "serving",
    "bench",
    "host",
    "batch",
    "decode",
)


@dataclasses.dataclass
class Config:
    host: str
    port: int
    model_path: str
    served_model_name: str
    rates: Rates
    speculative_algorithm: str | None = None
    speculative_draft_model_path: str | None = None
    speculative_num_steps: int | None = None
    speculative_eagle_topk: int | None = None
    speculative_num_draft_tokens: int | None = None
    ttft_base_s: float = 0.02
    prefill_s_per_token: float = 0.00002
    batch_penalty: float = 0.0
    startup_s: float = 1.0
    fault: str = "none"
    fault_every: int = 1
    slow_s: float = 30.0
    context_length: int = 8192
    ignored_args: list[str] = dataclasses.field(default_factory=list)
    # SGLang 0.5.9 added /server_info (and deprecated /get_server_info); 0.5.3 answers only /get_server_info.
    server_info_path: bool = True
    # GPU mode (gpu.Engine, started): chunks come when the GPU has made them, not at the schedule's offsets.
    engine: object | None = None
    # Lab mode's JIT cache (jit.LabJit): the first request of a shape compiles its kernels; None = no JIT modelled.
    jit: object | None = None

    @property
    def speculative(self) -> bool:
        return bool(self.speculative_algorithm)

    @property
    def rate_tok_s(self) -> float:
        return self.rates.spec_tok_s if self.speculative else self.rates.nospec_tok_s

    @property
    def draft_tokens(self) -> int:
        """Draft tokens per verify step; when unset, SGLang's auto choice for most models (steps 3, topk 1, 4)."""
        return self.speculative_num_draft_tokens or 4


class State:
    """Counters shared by the request threads."""

    def __init__(self, config: Config):
        self.config = config
        self.lock = threading.Lock()
        self.started = time.monotonic()
        self.started_wall = time.time()
        self.active = 0
        self.requests = 0
        self.cum_tokens = 0
        self.cum_verify = 0
        self.last_gen_throughput = 0.0

    def ready(self) -> bool:
        if self.config.fault == "never_healthy":
            return False
        if self.config.engine is not None and self.config.engine.failure:
            return False
        return time.monotonic() - self.started >= self.config.startup_s

    def begin(self) -> tuple[int, int]:
        with self.lock:
            self.requests += 1
            self.active += 1
            return self.requests, self.active

    def account(self, schedule: Schedule) -> None:
        """Count a finished generation before its last bytes go out, as SGLang's scheduler counts a decode step
        before the detokenizer sends it: a client that reads /get_server_info right after a response sees it."""
        with self.lock:
            if schedule.completion_tokens:
                self.cum_tokens += schedule.completion_tokens
                self.cum_verify += schedule.verify_ct
                if schedule.e2e_latency > 0:
                    self.last_gen_throughput = schedule.completion_tokens / schedule.e2e_latency

    def end(self) -> None:
        with self.lock:
            self.active -= 1

    def fault_now(self, request_number: int) -> str:
        fault = self.config.fault
        if fault in ("none", "never_healthy", "exit_on_start"):
            return "none"
        return fault if request_number % max(1, self.config.fault_every) == 0 else "none"


def installed_distributions() -> dict[str, str]:
    found: dict[str, str] = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata.get("Name")
        if name:
            found[name] = dist.version
    return dict(sorted(found.items(), key=lambda item: item[0].lower()))


def token_text(seed: int, index: int) -> str:
    return " " + WORDS[(seed + index) % len(WORDS)]


def make_text(seed: int, start: int, count: int) -> str:
    return "".join(token_text(seed, i) for i in range(start, start + count))


class ClientGone(Exception):
    pass


class Handler(BaseHTTPRequestHandler):
    server_version = "lab-sglang"
    protocol_version = "HTTP/1.1"
    state: State  # set on the subclass built by make_server

    # -- plumbing -----------------------------------------------------------------------------
    def log_message(self, format: str, *args) -> None:
        # Access lines stay out of the journal by default: the unit's last lines should show its state.
        LOG.debug("%s - %s", self.address_string(), format % args)

    def _send_json(self, status: int, payload, raw: bytes | None = None) -> None:
        body = raw if raw is not None else json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)
        self.close_connection = True

    def _send_empty(self, status: int) -> None:
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True

    def _start_stream(self) -> None:
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True

    def _chunk(self, data: bytes) -> None:
        try:
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise ClientGone() from exc

    def _event(self, payload) -> None:
        self._chunk(b"data: " + json.dumps(payload).encode() + b"\n\n")

    def _end_stream(self) -> None:
        self._chunk(b"data: [DONE]\n\n")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _cut(self) -> None:
        """Drop the connection without the closing chunk: the client sees a truncated body."""
        self.wfile.flush()
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.close_connection = True

    def _read_json(self):
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            return json.loads(raw or b"{}")
        except json.JSONDecodeError as exc:
            self._send_json(HTTPStatus.BAD_REQUEST, {"error": {"message": f"invalid JSON body: {exc}"}})
            return None

    def _openai_error(self, status: int, message: str, kind: str) -> None:
        self._send_json(
            status, {"object": "error", "message": message, "type": kind, "param": None, "code": int(status)}
        )

    # -- routes -------------------------------------------------------------------------------
    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path in ("/health", "/health_generate"):
            self._send_empty(HTTPStatus.OK if self.state.ready() else HTTPStatus.SERVICE_UNAVAILABLE)
        elif path == "/get_server_info" or (path == "/server_info" and self.state.config.server_info_path):
            self._send_json(HTTPStatus.OK, self.server_info())
        elif path in ("/get_model_info", "/model_info"):
            cfg = self.state.config
            self._send_json(
                HTTPStatus.OK, {"model_path": cfg.model_path, "tokenizer_path": cfg.model_path, "is_generation": True}
            )
        elif path == "/v1/models":
            cfg = self.state.config
            self._send_json(
                HTTPStatus.OK,
                {
                    "object": "list",
                    "data": [
                        {
                            "id": cfg.served_model_name,
                            "object": "model",
                            "created": int(self.state.started_wall),
                            "owned_by": "sglang",
                            "root": cfg.served_model_name,
                            "parent": None,
                            "max_model_len": cfg.context_length,
                        }
                    ],
                },
            )
        else:
            self._send_json(HTTPStatus.NOT_FOUND, {"detail": "Not Found"})

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0]
        routes = {
            "/generate": self.generate,
            "/v1/completions": self.completions,
            "/v1/chat/completions": self.chat_completions,
            "/gpufleet_lab/fault": self.set_fault,
        }
        handler = routes.get(path)
        if handler is None:
            self._send_json(HTTPStatus.NOT_FOUND, {"detail": "Not Found"})
            return
        body = self._read_json()
        if body is None:
            return
        if path != "/gpufleet_lab/fault" and not self.state.ready():
            self._send_json(HTTPStatus.SERVICE_UNAVAILABLE, {"error": {"message": "server is not ready"}})
            return
        try:
            handler(body)
        except ClientGone:
            LOG.warning("client closed the connection during %s", path)

    # -- server info --------------------------------------------------------------------------
    def server_info(self) -> dict:
        from lab_sglang import __version__

        cfg = self.state.config
        workers = cfg.engine.workers if cfg.engine is not None else []
        weight_gb = workers[0]["weight_bytes"] / 2**30 if workers else 0.0
        kvcache_gb = (workers[0]["reserved_bytes"] / 2**30 - weight_gb) if workers else 0.0
        internal: dict = {
            "last_gen_throughput": self.state.last_gen_throughput,
            "memory_usage": {
                "weight": round(weight_gb, 2),
                "kvcache": round(kvcache_gb, 2),
                "token_capacity": cfg.context_length,
                "graph": 0.0,
            },
        }
        with self.state.lock:
            if cfg.speculative and self.state.cum_verify > 0:
                internal["avg_spec_accept_length"] = self.state.cum_tokens / self.state.cum_verify
        info = {
            "model_path": cfg.model_path,
            "tokenizer_path": cfg.model_path,
            "served_model_name": cfg.served_model_name,
            "host": cfg.host,
            "port": cfg.port,
            "tp_size": max(1, len(workers)),
            "dp_size": 1,
            "context_length": cfg.context_length,
            "speculative_algorithm": cfg.speculative_algorithm,
            "speculative_draft_model_path": cfg.speculative_draft_model_path,
            "speculative_num_steps": cfg.speculative_num_steps,
            "speculative_eagle_topk": cfg.speculative_eagle_topk,
            "speculative_num_draft_tokens": cfg.speculative_num_draft_tokens,
            "internal_states": [internal],
            "version": __version__,
            "gpufleet_lab": {
                "server": "lab-sglang",
                "version": __version__,
                "sys_prefix": sys.prefix,
                "sys_prefix_realpath": os.path.realpath(sys.prefix),
                "sys_executable": sys.executable,
                "python_version": ".".join(str(p) for p in sys.version_info[:3]),
                "cuda_home": os.environ.get("CUDA_HOME"),
                "path": os.environ.get("PATH"),
                "distributions": installed_distributions(),
                "stack": cfg.rates.stack,
                "rates": dataclasses.asdict(cfg.rates),
                "rate_in_effect_tok_s": cfg.rate_tok_s,
                "ttft_base_s": cfg.ttft_base_s,
                "prefill_s_per_token": cfg.prefill_s_per_token,
                "fault": cfg.fault,
                "fault_every": cfg.fault_every,
                "ignored_args": cfg.ignored_args,
                "pid": os.getpid(),
                "started_at": self.state.started_wall,
                "requests": self.state.requests,
            },
        }
        if cfg.engine is not None:
            info["gpufleet_lab"]["gpu"] = {
                "workers": workers,
                "config": dataclasses.asdict(cfg.engine.cfg),
                "steps": cfg.engine.steps,
                "failure": cfg.engine.failure,
            }
        return info

    def set_fault(self, body: dict) -> None:
        fault = body.get("fault", "none")
        if fault not in FAULTS:
            self._send_json(HTTPStatus.BAD_REQUEST, {"error": {"message": f"unknown fault {fault!r}"}})
            return
        self.state.config.fault = fault
        self.state.config.fault_every = int(body.get("every", 1))
        if "slow_s" in body:
            self.state.config.slow_s = float(body["slow_s"])
        LOG.warning("fault injection set to %s every %s request(s)", fault, self.state.config.fault_every)
        self._send_json(HTTPStatus.OK, {"fault": fault, "every": self.state.config.fault_every})

    # -- generation ---------------------------------------------------------------------------
    def _schedule(self, prompt: str, max_tokens: int, active: int) -> tuple[Schedule, int]:
        cfg = self.state.config
        prompt_tokens = prompt_token_count(prompt)
        schedule = build_schedule(
            max_tokens,
            prompt_tokens,
            speculative=cfg.speculative,
            rate_tok_s=cfg.rate_tok_s,
            accept_length=cfg.rates.accept_length,
            ttft_base_s=cfg.ttft_base_s,
            prefill_s_per_token=cfg.prefill_s_per_token,
            slowdown=1.0 + cfg.batch_penalty * (active - 1),
        )
        return schedule, prompt_tokens

    def _run(self, prompt: str, max_tokens: int, emit, finish, stream: bool, sampled: bool = False) -> None:
        """Common request life cycle: fault injection, the JIT compile of a new shape, timing, counters."""
        number, active = self.state.begin()
        schedule = None
        clock = None
        try:
            fault = self.state.fault_now(number)
            if fault == "http500":
                LOG.error("request %d: injected internal error", number)
                self._send_json(
                    HTTPStatus.INTERNAL_SERVER_ERROR,
                    {
                        "object": "error",
                        "message": "lab fault injection: internal server error",
                        "type": "InternalServerError",
                        "param": None,
                        "code": 500,
                    },
                )
                return
            if fault == "slow":
                time.sleep(self.state.config.slow_s)
            cfg = self.state.config
            if cfg.jit is not None:
                cfg.jit.ensure(kernels_for(sampled, active, cfg.speculative, cfg.draft_tokens))
            schedule, prompt_tokens = self._schedule(prompt, max_tokens, active)
            seed = sum(prompt.encode()) % len(WORDS)
            start = time.monotonic()
            engine = self.state.config.engine
            clock = (
                _Clock(schedule, start)
                if engine is None
                else _GpuClock(engine, schedule, prompt_tokens, start, sampled)
            )
            if stream:
                self._start_stream()
                cut_at = max(1, len(schedule.chunks) // 2) if fault == "stream_cut" else None
                done = 0
                for index, size in enumerate(schedule.chunks):
                    if cut_at is not None and index == cut_at:
                        LOG.error("request %d: injected stream cut after %d chunks", number, index)
                        self._cut()
                        schedule = None
                        return
                    clock.wait(index)
                    last = index == len(schedule.chunks) - 1
                    if fault == "malformed_json" and index == 1:
                        self._chunk(b'data: {"text": "broken\n\n')
                    if last:
                        schedule = clock.timed(schedule)
                        self.state.account(schedule)
                    emit(seed, done, size, index, last, prompt_tokens, schedule, time.monotonic() - start)
                    done += size
                finish(prompt_tokens, schedule)
                self._end_stream()
            else:
                for index in range(len(schedule.chunks)):
                    clock.wait(index)
                schedule = clock.timed(schedule)
                payload = finish(prompt_tokens, schedule)
                if fault != "stream_cut":
                    self.state.account(schedule)
                if fault == "malformed_json":
                    self._send_json(HTTPStatus.OK, None, raw=json.dumps(payload).encode()[:-7])
                elif fault == "stream_cut":
                    body = json.dumps(payload).encode()
                    self.send_response(HTTPStatus.OK)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.send_header("Connection", "close")
                    self.end_headers()
                    self.wfile.write(body[: len(body) // 2])
                    self._cut()
                    schedule = None
                else:
                    self._send_json(HTTPStatus.OK, payload)
        finally:
            if clock is not None:
                clock.close()
            self.state.end()
            if schedule is not None:
                LOG.info(
                    "request %d: prompt_tokens=%d completion_tokens=%d verify_ct=%d e2e=%.3fs",
                    number,
                    prompt_token_count(prompt),
                    schedule.completion_tokens,
                    schedule.verify_ct,
                    schedule.e2e_latency,
                )

    def _meta(
        self,
        rid: str,
        prompt_tokens: int,
        tokens: int,
        schedule: Schedule | None,
        finished: bool,
        elapsed: float | None = None,
    ) -> dict:
        """meta_info as SGLang 0.5.9's TokenizerManager._handle_batch_output builds it (metrics off)."""
        meta = {
            "id": rid,
            "finish_reason": None,
            "prompt_tokens": prompt_tokens,
            "weight_version": "default",
            "total_retractions": 0,
            "completion_tokens": tokens,
            "cached_tokens": 0,
        }
        if finished and schedule is not None:
            meta["finish_reason"] = {"type": "length", "length": schedule.completion_tokens}
            meta["e2e_latency"] = schedule.e2e_latency if elapsed is None else elapsed
            if self.state.config.speculative:
                meta.update(spec_metrics(schedule, self.state.config.draft_tokens))
        return meta

    def generate(self, body: dict) -> None:
        text = body.get("text")
        if isinstance(text, list):
            self._send_json(
                HTTPStatus.BAD_REQUEST,
                {"error": {"message": "batched /generate is not modelled by the lab stand-in; send one text"}},
            )
            return
        if not isinstance(text, str):
            self._send_json(
                HTTPStatus.BAD_REQUEST, {"error": {"message": "Either text or input_ids should be provided."}}
            )
            return
        params = body.get("sampling_params") or {}
        max_tokens = int(params.get("max_new_tokens", 128))
        rid = body.get("rid") or uuid.uuid4().hex
        seed_text: dict = {"text": ""}
        ids: list[int] = []
        start = time.monotonic()

        def emit(seed, done, size, _index, last, prompt_tokens, schedule, elapsed):
            seed_text["text"] += make_text(seed, done, size)
            ids.extend((seed + i) % len(WORDS) for i in range(done, done + size))
            self._event(
                {
                    "text": seed_text["text"],
                    "output_ids": list(ids),
                    "meta_info": self._meta(rid, prompt_tokens, done + size, schedule, last, elapsed),
                }
            )

        def finish(prompt_tokens, schedule):
            seed = sum(text.encode()) % len(WORDS)
            n = schedule.completion_tokens
            return {
                "text": make_text(seed, 0, n),
                "output_ids": [(seed + i) % len(WORDS) for i in range(n)],
                "meta_info": self._meta(rid, prompt_tokens, n, schedule, True, time.monotonic() - start),
            }

        self._run(text, max_tokens, emit, finish, bool(body.get("stream")), is_sampled(params))

    def completions(self, body: dict) -> None:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str):
            self._openai_error(HTTPStatus.BAD_REQUEST, "prompt must be one string", "BadRequestError")
            return
        self._openai(body, prompt, chat=False)

    def chat_completions(self, body: dict) -> None:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            self._openai_error(HTTPStatus.BAD_REQUEST, "messages must be a non-empty list", "BadRequestError")
            return
        prompt = "\n".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))
        self._openai(body, prompt, chat=True)

    def _openai(self, body: dict, prompt: str, chat: bool) -> None:
        """The OpenAI endpoints, chunk for chunk as SGLang 0.5.9's serving_completions.py / serving_chat.py send them.

        Completions: one chunk per step, the last one carrying finish_reason, then (include_usage) a usage chunk
        serialised without None fields. Chat: a first chunk with role "assistant" and content "", one chunk per
        step, a chunk with an empty delta carrying finish_reason, then (include_usage) a usage chunk.
        """
        cfg = self.state.config
        max_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
        rid = uuid.uuid4().hex
        created = int(time.time())
        obj = "chat.completion" if chat else "text_completion"
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))

        def chunk(choices, usage=None):
            return {
                "id": rid,
                "object": obj + (".chunk" if chat else ""),
                "created": created,
                "model": cfg.served_model_name,
                "choices": choices,
                "usage": usage,
            }

        def chat_choice(delta, reason=None):
            delta = {"role": None, "content": None, "reasoning_content": None, "tool_calls": None, **delta}
            return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason, "matched_stop": None}

        def emit(seed, done, size, index, last, prompt_tokens, schedule, _elapsed):
            piece = make_text(seed, done, size)
            if not chat:
                reason = "length" if last else None
                choice = {"index": 0, "text": piece, "logprobs": None, "finish_reason": reason, "matched_stop": None}
                self._event(chunk([choice]))
                return
            if index == 0:
                self._event(chunk([chat_choice({"role": "assistant", "content": ""})]))
            self._event(chunk([chat_choice({"content": piece})]))

        def finish(prompt_tokens, schedule):
            n = schedule.completion_tokens
            if body.get("stream"):
                if chat:
                    self._event(chunk([chat_choice({}, "length")]))
                if include_usage:
                    final = chunk([], openai_usage(prompt_tokens, n, drop_none=not chat))
                    self._event(final if chat else {k: v for k, v in final.items() if v is not None})
                return None
            seed = sum(prompt.encode()) % len(WORDS)
            text = make_text(seed, 0, n)
            if chat:
                message = {"role": "assistant", "content": text, "reasoning_content": None, "tool_calls": None}
                choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": "length"}
            else:
                choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length"}
            choice["matched_stop"] = None
            return {**chunk([choice], openai_usage(prompt_tokens, n)), "object": obj, "metadata": None}

        self._run(prompt, max_tokens, emit, finish, bool(body.get("stream")), is_sampled(body))


def is_sampled(params: dict) -> bool:
    """A request that samples (temperature above 0; SGLang's default is 1.0) rather than decoding greedily."""
    try:
        return float(params.get("temperature", 1.0)) > 0
    except (TypeError, ValueError):
        return True


def openai_usage(prompt_tokens: int, completion_tokens: int, drop_none: bool = False) -> dict:
    """SGLang's UsageInfo (protocol.py); a completions stream's usage chunk is dumped with exclude_none."""
    usage = {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": None,
        "reasoning_tokens": 0,
    }
    return {k: v for k, v in usage.items() if v is not None} if drop_none else usage


def spec_metrics(schedule: Schedule, draft_tokens: int) -> dict:
    """The speculative fields of a finished request's meta_info, as SGLang 0.5.9 computes them
    (TokenizerManager._calculate_spec_decoding_metrics): a verify step that yields k tokens accepted k - 1 drafts.
    When a step has no draft token to accept (draft tokens <= 1) SGLang gives only the histogram."""
    if schedule.verify_ct <= 0:
        return {}
    guesses = draft_tokens - 1
    accepted = [size - 1 for size in schedule.chunks]
    histogram = [0] * (max(accepted) + 1)
    for count in accepted:
        histogram[count] += 1
    if guesses <= 0:
        return {"spec_accept_histogram": histogram}
    return {
        "spec_accept_rate": sum(accepted) / (schedule.verify_ct * guesses),
        "spec_accept_length": schedule.completion_tokens / schedule.verify_ct,
        "spec_accept_token_num": sum(accepted),
        "spec_draft_token_num": schedule.verify_ct * guesses,
        "spec_verify_ct": schedule.verify_ct,
        "spec_accept_histogram": histogram,
    }


def _sleep_until(deadline: float) -> None:
    remaining = deadline - time.monotonic()
    if remaining > 0:
        time.sleep(remaining)


class _Clock:
    """CPU mode: chunk k is due at the schedule's offset k after the request started."""

    def __init__(self, schedule: Schedule, start: float):
        self.schedule = schedule
        self.start = start

    def wait(self, index: int) -> None:
        _sleep_until(self.start + self.schedule.offsets[index])

    def timed(self, schedule: Schedule) -> Schedule:
        return schedule

    def close(self) -> None:
        pass


class _GpuClock:
    """GPU mode: chunk k is due when the engine's GPU step that makes it has finished; offsets are measured."""

    def __init__(self, engine, schedule: Schedule, prompt_tokens: int, start: float, sampled: bool = False):
        self.start = start
        self.offsets: list[float] = []
        self.ticks = engine.ticks(prompt_tokens, schedule.chunks, sampled)

    def wait(self, _index: int) -> None:
        next(self.ticks)
        self.offsets.append(time.monotonic() - self.start)

    def timed(self, schedule: Schedule) -> Schedule:
        return dataclasses.replace(schedule, offsets=tuple(self.offsets))

    def close(self) -> None:
        self.ticks.close()


def make_server(config: Config) -> ThreadingHTTPServer:
    state = State(config)
    handler = type("BoundHandler", (Handler,), {"state": state})
    server = ThreadingHTTPServer((config.host, config.port), handler)
    server.daemon_threads = True
    server.state = state  # type: ignore[attr-defined]
    return server
