# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The benchmark client and the lab stand-in held to SGLang 0.5.9's own code.

Runs under .venv/sglang/bin/python: scripts/setup.sh installs SGLang 0.5.9's wheel there without its heavy
dependencies, and `make unit` runs this file with it; any other Python skips it. Every field is checked against the
SGLang module that defines or produces it (paths below are under sglang/srt/):

- request and response bodies of the OpenAI-compatible API: pydantic models of entrypoints/openai/protocol.py;
- /generate requests: GenerateReqInput (managers/io_struct.py) and SamplingParams (sampling/sampling_params.py);
- /generate events and their meta_info: TokenizerManager._handle_batch_output and _calculate_spec_decoding_metrics
  (managers/tokenizer_manager.py), framed by generate_request (entrypoints/http_server.py);
- /v1/completions and /v1/chat/completions streams: entrypoints/openai/serving_completions.py, serving_chat.py;
- /server_info: server_info (entrypoints/http_server.py), Scheduler.get_internal_state (managers/scheduler.py) and
  the fields of ServerArgs (server_args.py).

Modules that import torch at the top (all but protocol.py and sampling_params.py) cannot be imported here, so the
definitions used are compiled by name from the wheel's own source file (`sglang_code`) into a namespace that
supplies only the names they touch: the code that runs is SGLang's, and a traceback points into the wheel.
"""

from __future__ import annotations
import __future__

import abc
import ast
import asyncio
import dataclasses
import json
import logging
import sys
import time
import types
import typing
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import pytest

SGLANG_VERSION = "0.5.9"
WHY = (
    f"SGLang {SGLANG_VERSION} is not importable by {sys.executable}: `make unit` runs this file with "
    ".venv/sglang/bin/python, which scripts/setup.sh builds"
)
sglang = pytest.importorskip("sglang", reason=WHY)
if sglang.__version__ != SGLANG_VERSION:
    pytest.skip(f"{WHY} (found SGLang {sglang.__version__})", allow_module_level=True)
protocol = pytest.importorskip("sglang.srt.entrypoints.openai.protocol", reason=WHY)
orjson = pytest.importorskip("orjson", reason=WHY)

from pydantic import BaseModel, TypeAdapter  # noqa: E402
from sglang.srt.entrypoints.openai.usage_processor import UsageProcessor  # noqa: E402
from sglang.srt.sampling.sampling_params import SamplingParams  # noqa: E402

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _bench  # noqa: E402
from ansible_collections.gpufleet.upgrade.plugins.module_utils._sglang_client import Client  # noqa: E402

REPO = Path(__file__).resolve().parents[4]

# lab_sglang is made importable by conftest.py.
from lab_sglang.stack import Rates  # noqa: E402
from lab_sglang.timing import step_sizes  # noqa: E402

SRT = Path(sglang.__file__).parent / "srt"
TYPING = {name: getattr(typing, name) for name in typing.__all__}
FAST = Rates("test", nospec_tok_s=2000.0, spec_tok_s=4000.0, accept_length=3.0)
DRAFT_TOKENS = 16


# -- SGLang's code, compiled from the wheel ----------------------------------------------------------------------
def sglang_code(relpath, *names, **namespace):
    """Definitions of sglang/srt/<relpath> ("Class", "function" or "Class.method"), compiled from the file.

    Run in one module namespace holding `namespace`: what the definitions touch that the file would import. Route
    decorators (FastAPI's app) are dropped; class decorators (@dataclass) stay. The file's own
    `from __future__ import annotations` is kept, and the namespace is registered as a module, so pydantic can
    resolve the annotations as it does in SGLang.
    """
    path = SRT / relpath
    source = path.read_text(encoding="utf-8")
    tree = ast.parse(source, filename=str(path))
    top = {
        node.name: node for node in tree.body if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
    }
    future = "from __future__ import annotations" in source
    module = types.ModuleType("sglang_source." + relpath.replace("/", ".").removesuffix(".py"))
    module.__dict__.update(TYPING, **namespace)
    sys.modules[module.__name__] = module
    found = []
    for name in names:
        owner, _dot, method = name.partition(".")
        node = top[owner]
        if method:
            node = next(n for n in node.body if getattr(n, "name", None) == method)
        if not isinstance(node, ast.ClassDef):
            node.decorator_list = []
        flags = __future__.annotations.compiler_flag if future else 0
        code = compile(ast.Module(body=[node], type_ignores=[]), str(path), "exec", flags=flags, dont_inherit=True)
        exec(code, module.__dict__)
        found.append(module.__dict__[node.name])
    return found[0] if len(found) == 1 else found


def dataclass_fields(relpath, class_name):
    """Field names of a dataclass of SGLang, read from its source (server_args.py imports torch-only modules)."""
    tree = ast.parse((SRT / relpath).read_text(encoding="utf-8"))
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name)
    return {n.target.id for n in node.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}


class BatchStrOutput(SimpleNamespace):
    """What the detokenizer sends the tokenizer manager for one decode step (io_struct.BatchStrOutput)."""


class Other:
    """The output classes a text request never gets (embeddings, token ids, multimodal)."""


BaseFinishReason, FINISH_LENGTH = sglang_code("managers/schedule_batch.py", "BaseFinishReason", "FINISH_LENGTH")
GenerateReqInput = sglang_code(
    "managers/io_struct.py",
    "BaseReq",
    "APIServingTimingMixin",
    "GenerateReqInput",
    dataclass=dataclasses.dataclass,
    field=dataclasses.field,
    ABC=abc.ABC,
    uuid=__import__("uuid"),
    MultimodalDataInputFormat=typing.Any,
)[-1]


def step_outputs(steps, *, speculative=True, draft_tokens=DRAFT_TOKENS, prompt_tokens=7, rid="0123abcd"):
    """The events SGLang's TokenizerManager._handle_batch_output makes of a request decoded in `steps` tokens.

    One BatchStrOutput per step, as the scheduler (managers/scheduler_output_processor_mixin.py) fills it:
    completion_tokens, spec_verify_ct and spec_accepted_tokens are the request's running totals, output_strs and
    output_ids the step's new text and ids; finished_reasons is FINISH_LENGTH(...).to_json() on the last step.
    """
    handle, spec_metrics = sglang_code(
        "managers/tokenizer_manager.py",
        "TokenizerManager._handle_batch_output",
        "TokenizerManager._calculate_spec_decoding_metrics",
        BatchStrOutput=BatchStrOutput,
        BatchEmbeddingOutput=Other,
        BatchMultimodalOutput=Other,
        BatchTokenIDOutput=Other,
        ReqState=SimpleNamespace,
        time=time,
        asyncio=asyncio,
        logger=logging.getLogger("sglang_source"),
        trace_req_finish=lambda *args, **kwargs: None,
    )
    server_args = SimpleNamespace(
        weight_version="default",
        speculative_algorithm="EAGLE3" if speculative else None,
        speculative_num_draft_tokens=draft_tokens,
        stream_output=False,
        enable_lora=False,
        dp_size=1,
    )
    manager = SimpleNamespace(
        rid_to_state={},
        server_args=server_args,
        enable_metrics=False,
        dump_requests_folder=None,
        crash_dump_folder=None,
        convert_to_span_attrs=lambda *args: {},
    )
    manager._calculate_spec_decoding_metrics = types.MethodType(spec_metrics, manager)
    state = SimpleNamespace(
        obj=SimpleNamespace(stream=True, return_logprob=False, log_metrics=True, lora_path=None),
        text="",
        output_ids=[],
        last_output_offset=0,
        finished=False,
        created_time=time.time(),
        out_list=[],
        event=SimpleNamespace(set=lambda: None),
    )
    done = accepted = 0
    histogram = []
    for index, size in enumerate(steps):
        manager.rid_to_state[rid] = state
        done += size
        accepted += size - 1
        histogram += [0] * (size - len(histogram))
        histogram[size - 1] += 1
        last = index == len(steps) - 1
        handle(
            manager,
            BatchStrOutput(
                rids=[rid],
                finished_reasons=[FINISH_LENGTH(length=done).to_json() if last else None],
                prompt_tokens=[prompt_tokens],
                retraction_counts=[0],
                completion_tokens=[done],
                cached_tokens=[0],
                cached_tokens_details=None,
                output_strs=["".join(f" w{i}" for i in range(done - size, done))],
                output_ids=[list(range(done - size, done))],
                spec_verify_ct=[index + 1] if speculative else [],
                spec_accepted_tokens=[accepted] if speculative else [],
                spec_acceptance_histogram=[list(histogram)] if speculative else [],
                load=None,
            ),
        )
    return state.out_list


async def _collect(body_iterator):
    return b"".join([part if isinstance(part, bytes) else part.encode() async for part in body_iterator])


class StreamingResponse:
    """Starlette's StreamingResponse, as far as SGLang's endpoints use it: the body iterator and the media type."""

    def __init__(self, content, media_type=None, background=None):
        self.body_iterator = content
        self.media_type = media_type


def generate_stream_bytes(outputs, error=None):
    """The bytes of http_server.generate_request's stream for these TokenizerManager events (then error, if any)."""

    async def generate_request(_obj, _request):
        for out in outputs:
            yield out
        if error:
            raise ValueError(error)

    endpoint = sglang_code(
        "entrypoints/http_server.py",
        "generate_request",
        _global_state=SimpleNamespace(
            tokenizer_manager=SimpleNamespace(generate_request=generate_request, create_abort_task=lambda obj: None)
        ),
        StreamingResponse=StreamingResponse,
        orjson=orjson,
        logger=logging.getLogger("sglang_source"),
        GenerateReqInput=GenerateReqInput,
        Request=object,
        AsyncIterator=typing.AsyncIterator,
        _create_error_response=None,
    )
    response = asyncio.run(endpoint(SimpleNamespace(stream=True), None))
    assert response.media_type == "text/event-stream"
    return asyncio.run(_collect(response.body_iterator))


def serving(relpath, method, outputs, error=None, **self_attrs):
    """An OpenAI serving class's stream method of SGLang, fed with these TokenizerManager events."""

    async def generate_request(_adapted, _raw):
        for out in outputs:
            yield out
        if error:
            raise ValueError(error)

    stream = sglang_code(
        relpath,
        method,
        time=time,
        UsageProcessor=UsageProcessor,
        **{name: getattr(protocol, name) for name in dir(protocol) if isinstance(getattr(protocol, name), type)},
    )
    error_response = sglang_code(
        "entrypoints/openai/serving_base.py",
        "OpenAIServingBase.create_streaming_error_response",
        json=json,
        ErrorResponse=protocol.ErrorResponse,
    )
    manager = SimpleNamespace(generate_request=generate_request, server_args=SimpleNamespace(enable_cache_report=False))
    self = SimpleNamespace(tokenizer_manager=manager, reasoning_parser=None, tool_call_parser=None, **self_attrs)
    self.create_streaming_error_response = types.MethodType(error_response, self)
    return lambda request: asyncio.run(_collect(stream(self, None, request, None)))


# -- a server that replays bytes made by SGLang's code, and records what the client sent --------------------------
@pytest.fixture
def replay(loopback):
    def start(routes):
        """routes: path -> (content type, body bytes or list of SSE events); returns (url, requests seen)."""
        seen = []

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _answer(self, body=None):
                seen.append((self.command, self.path, body))
                if self.path not in routes:
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                kind, payload = routes[self.path]
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for part in payload if isinstance(payload, list) else [payload]:
                    self.wfile.write(f"{len(part):x}\r\n".encode() + part + b"\r\n")
                self.wfile.write(b"0\r\n\r\n")

            def do_GET(self):
                self._answer()

            def do_POST(self):
                self._answer(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        return loopback(server), seen

    return start


@pytest.fixture
def stand_in_config():
    """The tuning flags SGLang's EAGLE-3 command line sets (conftest.py's `serve` takes these)."""
    return {
        "rates": FAST,
        "speculative_num_steps": 3,
        "speculative_eagle_topk": 4,
        "speculative_num_draft_tokens": DRAFT_TOKENS,
        "ttft_base_s": 0.001,
    }


@pytest.fixture
def stand_in(serve):
    """start(**fields) -> the URL of a stand-in."""
    return lambda **fields: serve(**fields)[1]


def sse_events(raw):
    """SSE as SGLang frames it: `data: <json>` events each followed by a blank line, `data: [DONE]` last."""
    assert raw.endswith(b"data: [DONE]\n\n"), raw[-80:]
    frames = raw.split(b"\n\n")
    assert frames[-1] == b"" and all(f.startswith(b"data: ") for f in frames[:-1]), raw[:200]
    return [json.loads(f[6:]) for f in frames[:-2]]


def sse_frames(events):
    return [b"data: " + json.dumps(e).encode() + b"\n\n" for e in events] + [b"data: [DONE]\n\n"]


def post(url, path, body):
    request = urllib.request.Request(url + path, data=json.dumps(body).encode(), method="POST")
    request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=10) as resp:
        return resp.headers.get_content_type(), resp.read()


def get(url, path):
    with urllib.request.urlopen(url + path, timeout=10) as resp:
        return json.loads(resp.read())


def sent_bodies(monkeypatch):
    """What the client POSTs, by path, recorded on its way out."""
    sent = []
    original = Client._open

    def record(self, path, body=None, timeout=None):
        if body is not None:
            sent.append((path, json.loads(json.dumps(body))))
        return original(self, path, body, timeout)

    monkeypatch.setattr(Client, "_open", record)
    return sent


def same_as_sglang_dump(model, data, **dump):
    """data is what SGLang's model serialises: validated by it, and dumped back field for field, no extra key."""
    parsed = model.model_validate(data)
    assert parsed.model_dump(mode="json", **dump) == data, f"{model.__name__} ({model.__module__})"
    return parsed


def unmask(events, *keys):
    """Events without the fields that differ between any two answers (ids, clocks)."""
    return [{k: v for k, v in e.items() if k not in keys} for e in events]


# -- what the client reads, and where SGLang 0.5.9 produces it ----------------------------------------------------
META_INFO_READ = {
    "completion_tokens": "managers/tokenizer_manager.py TokenizerManager._handle_batch_output (every event)",
    "prompt_tokens": "managers/tokenizer_manager.py TokenizerManager._handle_batch_output (every event)",
    "e2e_latency": "managers/tokenizer_manager.py TokenizerManager._handle_batch_output (once finished)",
    "spec_verify_ct": "managers/tokenizer_manager.py TokenizerManager._calculate_spec_decoding_metrics (finished)",
}
USAGE_READ = {
    "prompt_tokens": "entrypoints/openai/protocol.py UsageInfo",
    "completion_tokens": "entrypoints/openai/protocol.py UsageInfo",
}


def _keys_read(function_name, variable):
    """String keys the client reads from `variable` in one of its functions: var["k"] and var.get("k")."""
    tree = ast.parse((REPO / "plugins" / "module_utils" / "_sglang_client.py").read_text(encoding="utf-8"))
    function = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == function_name)
    keys = set()
    for node in ast.walk(function):
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == variable:
            keys.add(node.slice.value)
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get"
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == variable
        ):
            keys.add(node.args[0].value)
    return keys


def test_the_client_reads_only_fields_listed_here_with_their_sglang_source():
    assert _keys_read("_generate_event", "meta") == set(META_INFO_READ)
    assert _keys_read("_completion_event", "usage") == set(USAGE_READ)
    assert _keys_read("_completion_event", "event") == {"usage", "choices"}


def test_generate_meta_info_keys_the_client_reads_are_produced_by_the_tokenizer_manager():
    """managers/tokenizer_manager.py: completion_tokens (a running total) and prompt_tokens in every event;
    e2e_latency and spec_verify_ct only in the finished one, spec_verify_ct only with speculative decoding."""
    outputs = step_outputs([3, 3, 3, 1])
    assert [sorted(o) for o in outputs] == [["meta_info", "output_ids", "text"]] * 4
    metas = [o["meta_info"] for o in outputs]
    assert [m["completion_tokens"] for m in metas] == [3, 6, 9, 10]
    assert all(m["prompt_tokens"] == 7 for m in metas)
    assert all("spec_verify_ct" not in m and "e2e_latency" not in m for m in metas[:-1])
    assert metas[-1]["spec_verify_ct"] == 4 and metas[-1]["e2e_latency"] >= 0
    assert metas[-1]["spec_accept_length"] == 10 / 4  # SGLang's own per-request accept length is the client's
    assert metas[-1]["finish_reason"] == {"type": "length", "length": 10}  # managers/schedule_batch.py FINISH_LENGTH
    assert outputs[-1]["text"] == "".join(f" w{i}" for i in range(10))  # cumulative text without stream_output
    plain = step_outputs([1, 1, 1], speculative=False)[-1]["meta_info"]
    assert "spec_verify_ct" not in plain and plain["completion_tokens"] == 3


def test_sglang_gives_no_verify_count_without_draft_tokens_to_accept():
    """_calculate_spec_decoding_metrics gives only the histogram when speculative_num_draft_tokens is 1."""
    meta = step_outputs([1, 1], draft_tokens=1)[-1]["meta_info"]
    assert [k for k in meta if k.startswith("spec_")] == ["spec_accept_histogram"]


# -- our client's requests, validated as SGLang validates them ----------------------------------------------------
def test_generate_request_is_a_valid_generate_req_input(stand_in, monkeypatch):
    """POST /generate: FastAPI validates the body as managers/io_struct.py GenerateReqInput, the tokenizer manager
    normalises it and builds sampling/sampling_params.py SamplingParams(**sampling_params), then verify()."""
    sent = sent_bodies(monkeypatch)
    assert Client(stand_in(), timeout=10).generate("hello there", 12)["ok"]
    [(path, body)] = sent
    assert path == "/generate"
    fields = {f.name for f in dataclasses.fields(GenerateReqInput)}
    assert set(body) <= fields, set(body) - fields  # FastAPI would drop an unknown key without a word
    request = TypeAdapter(GenerateReqInput).validate_python(body)
    request.normalize_batch_and_arguments()
    assert request.is_single and request.stream is True
    params = SamplingParams(**request.sampling_params)
    params.verify(32000)
    assert (params.max_new_tokens, params.ignore_eos, params.temperature, params.top_k) == (12, True, 1.0, 1)


def test_completion_request_is_a_valid_completion_request(stand_in, monkeypatch):
    """POST /v1/completions: entrypoints/openai/protocol.py CompletionRequest, with no field it would ignore;
    serving_completions.py turns it into sampling params that SamplingParams accepts."""
    sent = sent_bodies(monkeypatch)
    assert Client(stand_in(), timeout=10).completion("hello there", 12, "lab-model")["ok"]
    [(path, body)] = sent
    assert path == "/v1/completions"
    assert set(body) <= set(protocol.CompletionRequest.model_fields)
    request = protocol.CompletionRequest.model_validate(body)
    assert request.stream and request.stream_options.include_usage and request.ignore_eos
    build = sglang_code("entrypoints/openai/serving_completions.py", "OpenAIServingCompletion._build_sampling_params")
    params = build(SimpleNamespace(), request)
    params.pop("stop_regex")  # passed by name through normalize(); not an argument of SamplingParams here
    SamplingParams(**params).verify(32000)
    assert params["max_new_tokens"] == 12 and params["ignore_eos"] is True


# -- SGLang's answers, fed to our client --------------------------------------------------------------------------
def test_client_parses_the_generate_stream_sglang_frames(replay):
    """Events from managers/tokenizer_manager.py, framed by entrypoints/http_server.py generate_request
    (`data: ` + orjson + blank line, `data: [DONE]`)."""
    raw = generate_stream_bytes(step_outputs([3, 3, 3, 3, 3, 1]))
    assert len(sse_events(raw)) == 6
    url, _seen = replay({"/generate": ("text/event-stream", raw)})
    record = Client(url, timeout=10).generate("x", 16)
    assert record["ok"], record["error"]
    assert (record["completion_tokens"], record["spec_verify_ct"], record["prompt_tokens"]) == (16, 6, 7)
    assert len(record["itl_s"]) == 5 and record["server_e2e_s"] is not None
    assert _bench.accept_length(record) == 16 / 6


def test_client_reports_the_error_event_sglang_streams(replay):
    """http_server.generate_request turns a ValueError into `data: {"error": {"message": ...}}` before [DONE]."""
    raw = generate_stream_bytes(step_outputs([1, 1]), error="The input is too long")
    url, _seen = replay({"/generate": ("text/event-stream", raw)})
    record = Client(url, timeout=10).generate("x", 16)
    assert record["ok"] is False and "server error in stream" in record["error"]
    assert "The input is too long" in record["error"]


def test_client_parses_the_completions_stream_sglang_makes(replay):
    """entrypoints/openai/serving_completions.py _generate_completion_stream: CompletionStreamResponse chunks
    (model_dump_json), the usage chunk (exclude_none), [DONE]; fed with the client's own request."""
    stream = serving(
        "entrypoints/openai/serving_completions.py",
        "OpenAIServingCompletion._generate_completion_stream",
        step_outputs([3, 3, 3, 3, 3, 1]),
    )
    body = {
        "model": "m",
        "prompt": "x",
        "max_tokens": 16,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    raw = stream(protocol.CompletionRequest.model_validate(body))
    events = sse_events(raw)
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 16
    url, seen = replay({"/v1/completions": ("text/event-stream", raw)})
    record = Client(url, timeout=10).completion("x", 16, "m")
    assert seen[0][2] == body
    assert record["ok"], record["error"]
    assert (record["completion_tokens"], record["prompt_tokens"], record["spec_verify_ct"]) == (16, 7, None)
    assert len(record["itl_s"]) == 5


def test_client_reports_the_error_chunk_of_a_completions_stream(replay):
    """serving_completions.py turns an exception into serving_base.py create_streaming_error_response."""
    stream = serving(
        "entrypoints/openai/serving_completions.py",
        "OpenAIServingCompletion._generate_completion_stream",
        step_outputs([1]),
        error="boom",
    )
    raw = stream(protocol.CompletionRequest(prompt="x", stream=True))
    url, _seen = replay({"/v1/completions": ("text/event-stream", raw)})
    record = Client(url, timeout=10).completion("x", 16, "m")
    assert record["ok"] is False and "server error in stream" in record["error"] and "boom" in record["error"]


def sglang_server_info(spec_accepted=300, spec_forward_ct=100):
    """GET /server_info as entrypoints/http_server.py server_info builds it: ServerArgs (server_args.py) as a
    dict, scheduler info, internal_states from managers/scheduler.py Scheduler.get_internal_state, version."""
    values = {
        "model_path": "/models/llama",
        "served_model_name": "llama",
        "speculative_algorithm": "EAGLE3",
        "speculative_draft_model_path": "/models/eagle3",
        "speculative_num_steps": 3,
        "speculative_eagle_topk": 4,
        "speculative_num_draft_tokens": 16,
    }
    names = sorted(dataclass_fields("server_args.py", "ServerArgs"))
    assert set(values) <= set(names)
    ServerArgs = dataclasses.make_dataclass("ServerArgs", [(n, typing.Any, None) for n in names])
    server_args = ServerArgs(**values)
    get_internal_state = sglang_code(
        "managers/scheduler.py",
        "Scheduler.get_internal_state",
        get_global_server_args=lambda: server_args,
        GetInternalStateReq=object,
        GetInternalStateReqOutput=lambda internal_state: internal_state,
        RECORD_STEP_TIME=False,
    )
    scheduler = SimpleNamespace(
        last_gen_throughput=95.0,
        tp_worker=SimpleNamespace(model_runner=SimpleNamespace(weight_load_mem_usage=15.0, graph_mem_usage=1.0)),
        token_to_kv_pool_allocator=SimpleNamespace(get_kvcache=lambda: SimpleNamespace(mem_usage=40.0)),
        max_total_num_tokens=100000,
        max_running_requests=64,
        spec_algorithm=SimpleNamespace(is_none=lambda: False),
        spec_total_num_accepted_tokens=spec_accepted,
        spec_total_num_forward_ct=spec_forward_ct,
    )
    internal = dict(get_internal_state(scheduler, None))

    async def internal_states():
        return [internal]

    server_info = sglang_code(
        "entrypoints/http_server.py",
        "server_info",
        _global_state=SimpleNamespace(
            tokenizer_manager=SimpleNamespace(server_args=server_args, get_internal_state=internal_states),
            scheduler_info={"max_total_num_tokens": 100000},
        ),
        dataclasses=dataclasses,
        __version__=SGLANG_VERSION,
    )
    return json.loads(json.dumps(asyncio.run(server_info()), default=str))


def test_server_info_fields_the_bench_keeps_come_from_sglang(replay):
    """The benchmark keeps ServerArgs fields (server_args.py), `version` (http_server.py) and
    internal_states[0].avg_spec_accept_length (managers/scheduler.py: accepted tokens / forward passes)."""
    info = sglang_server_info()
    url, seen = replay({"/server_info": ("application/json", json.dumps(info).encode())})
    summary = _bench.server_summary(Client(url, timeout=10).server_info())
    assert [s[1] for s in seen] == ["/server_info"]
    assert summary == {
        "version": SGLANG_VERSION,
        "model_path": "/models/llama",
        "served_model_name": "llama",
        "speculative_algorithm": "EAGLE3",
        "speculative_draft_model_path": "/models/eagle3",
        "speculative_num_steps": 3,
        "speculative_eagle_topk": 4,
        "speculative_num_draft_tokens": 16,
        "avg_spec_accept_length": 3.0,
    }
    assert "avg_spec_accept_length" not in sglang_server_info(spec_accepted=0, spec_forward_ct=0)["internal_states"][0]


def test_client_falls_back_to_get_server_info_on_an_older_server(replay):
    """SGLang 0.5.3 has only /get_server_info; 0.5.9 answers both and logs that one as deprecated."""
    info = sglang_server_info()
    url, seen = replay({"/get_server_info": ("application/json", json.dumps(info).encode())})
    assert Client(url, timeout=10).server_info()["version"] == SGLANG_VERSION
    assert [s[1] for s in seen] == ["/server_info", "/get_server_info"]


# -- the stand-in's answers, held to SGLang's ------------------------------------------------------------------
def stand_in_generate(url, n, stream=True):
    kind, raw = post(
        url, "/generate", {"text": "hello there", "sampling_params": {"max_new_tokens": n}, "stream": stream}
    )
    return kind, raw


def test_stand_in_generate_stream_is_what_sglang_sends(stand_in):
    """Same framing as http_server.generate_request, and event for event the keys and values that
    tokenizer_manager.py makes of the same steps (but the request id and the clock)."""
    kind, raw = stand_in_generate(stand_in(), 16)
    assert kind == "text/event-stream"
    ours = sse_events(raw)
    theirs = sse_events(generate_stream_bytes(step_outputs(step_sizes(16, FAST.accept_length), prompt_tokens=3)))
    assert len(ours) == len(theirs) == 6
    for mine, sglangs in zip(ours, theirs, strict=True):
        assert sorted(mine) == sorted(sglangs)
        assert len(mine["output_ids"]) == len(sglangs["output_ids"]) == mine["meta_info"]["completion_tokens"]
        assert unmask([mine["meta_info"]], "id", "e2e_latency") == unmask([sglangs["meta_info"]], "id", "e2e_latency")
        assert sorted(mine["meta_info"]) == sorted(sglangs["meta_info"])
        assert mine["text"].startswith(ours[0]["text"])  # cumulative, as SGLang without --stream-output


def test_stand_in_generate_without_speculation_matches_sglang(stand_in):
    ours = sse_events(stand_in_generate(stand_in(speculative_algorithm=None), 4)[1])
    theirs = sse_events(generate_stream_bytes(step_outputs([1] * 4, speculative=False, prompt_tokens=3)))
    assert [sorted(e["meta_info"]) for e in ours] == [sorted(e["meta_info"]) for e in theirs]


def test_stand_in_generate_answer_without_stream_has_sglang_keys(stand_in):
    """Without stream the endpoint returns the last event of tokenizer_manager.py, as JSON."""
    kind, raw = stand_in_generate(stand_in(), 16, stream=False)
    assert kind == "application/json"
    mine = json.loads(raw)
    theirs = step_outputs(step_sizes(16, FAST.accept_length), prompt_tokens=3)[-1]
    assert sorted(mine) == sorted(theirs) and sorted(mine["meta_info"]) == sorted(theirs["meta_info"])


def openai_body(chat, stream, include_usage=True):
    body = {"model": "lab-model", "max_tokens": 16, "temperature": 0, "ignore_eos": True, "stream": stream}
    if chat:
        body["messages"] = [{"role": "user", "content": "hello there"}]
    else:
        body["prompt"] = "hello there"
    if stream:
        body["stream_options"] = {"include_usage": include_usage}
    return body


@pytest.mark.parametrize("include_usage", [True, False])
def test_stand_in_completions_stream_is_what_serving_completions_sends(stand_in, include_usage):
    """Chunk for chunk the CompletionStreamResponse dumps of serving_completions.py for the same steps."""
    body = openai_body(chat=False, stream=True, include_usage=include_usage)
    kind, raw = post(stand_in(), "/v1/completions", body)
    assert kind == "text/event-stream"
    ours = sse_events(raw)
    outputs = step_outputs(step_sizes(16, FAST.accept_length), prompt_tokens=3)
    stream = serving(
        "entrypoints/openai/serving_completions.py", "OpenAIServingCompletion._generate_completion_stream", outputs
    )
    theirs = sse_events(stream(protocol.CompletionRequest.model_validate(body)))
    for event in ours[:-1] if include_usage else ours:
        same_as_sglang_dump(protocol.CompletionStreamResponse, event)
    if include_usage:
        same_as_sglang_dump(protocol.CompletionStreamResponse, ours[-1], exclude_none=True)
    assert [len(e["choices"]) for e in ours] == [len(e["choices"]) for e in theirs]
    masked = [unmask(e["choices"], "text") for e in ours], [unmask(e["choices"], "text") for e in theirs]
    assert masked[0] == masked[1]
    assert unmask(ours, "id", "created", "choices") == unmask(theirs, "id", "created", "choices")


@pytest.mark.parametrize("include_usage", [True, False])
def test_stand_in_chat_stream_is_what_serving_chat_sends(stand_in, include_usage):
    """serving_chat.py _generate_chat_stream: a role chunk, content chunks, an empty-delta finish chunk, usage."""
    body = openai_body(chat=True, stream=True, include_usage=include_usage)
    request = protocol.ChatCompletionRequest.model_validate(body)
    assert set(body) <= set(protocol.ChatCompletionRequest.model_fields)
    _kind, raw = post(stand_in(), "/v1/chat/completions", body)
    ours = sse_events(raw)
    outputs = step_outputs(step_sizes(16, FAST.accept_length), prompt_tokens=3)
    stream = serving("entrypoints/openai/serving_chat.py", "OpenAIServingChat._generate_chat_stream", outputs)
    theirs = sse_events(stream(request))
    for event in ours:
        same_as_sglang_dump(protocol.ChatCompletionStreamResponse, event)

    def shape(events):
        return [
            [
                {**c, "delta": {k: (v if k != "content" or not v else "...") for k, v in c["delta"].items()}}
                for c in e["choices"]
            ]
            for e in events
        ]

    assert shape(ours) == shape(theirs)
    assert unmask(ours, "id", "created", "choices") == unmask(theirs, "id", "created", "choices")


@pytest.mark.parametrize(("chat", "model"), [(False, "CompletionResponse"), (True, "ChatCompletionResponse")])
def test_stand_in_answers_without_stream_are_sglang_responses(stand_in, chat, model):
    """entrypoints/openai/protocol.py CompletionResponse / ChatCompletionResponse, dumped as FastAPI does."""
    path = "/v1/chat/completions" if chat else "/v1/completions"
    body = openai_body(chat=chat, stream=False)
    (protocol.ChatCompletionRequest if chat else protocol.CompletionRequest).model_validate(body)
    _kind, raw = post(stand_in(), path, body)
    parsed = same_as_sglang_dump(getattr(protocol, model), json.loads(raw))
    assert parsed.usage.completion_tokens == 16 and parsed.choices[0].finish_reason == "length"


def test_stand_in_models_and_errors_are_sglang_models(stand_in):
    """/v1/models is protocol.py ModelList; an injected 500 is protocol.py ErrorResponse."""
    url = stand_in(fault="http500")
    same_as_sglang_dump(protocol.ModelList, get(url, "/v1/models"))
    with pytest.raises(urllib.error.HTTPError) as failed:
        post(url, "/v1/completions", openai_body(chat=False, stream=False))
    same_as_sglang_dump(protocol.ErrorResponse, json.loads(failed.value.read()))


def test_stand_in_server_info_has_only_fields_sglang_has(stand_in):
    """Top level: ServerArgs fields (server_args.py), internal_states and version (http_server.py), plus the lab's
    own gpufleet_lab block; internal_states[0] and its memory_usage: keys of managers/scheduler.py."""
    url = stand_in()
    assert Client(url, timeout=10).generate("hello there", 16)["ok"]
    mine = get(url, "/server_info")
    theirs = sglang_server_info()
    allowed = dataclass_fields("server_args.py", "ServerArgs") | {"internal_states", "version", "gpufleet_lab"}
    assert set(mine) <= allowed, set(mine) - allowed
    assert set(mine["internal_states"][0]) <= set(theirs["internal_states"][0])
    assert set(mine["internal_states"][0]["memory_usage"]) == set(theirs["internal_states"][0]["memory_usage"])
    assert mine["internal_states"][0]["avg_spec_accept_length"] == pytest.approx(16 / 6)
    assert get(url, "/get_server_info")["version"] == mine["version"]


def test_stand_in_of_an_old_version_has_no_server_info_path_and_the_client_copes(stand_in):
    url = stand_in(server_info_path=False)
    with pytest.raises(urllib.error.HTTPError):
        get(url, "/server_info")
    assert Client(url, timeout=10).server_info()["speculative_algorithm"] == "EAGLE3"


def test_base_model_walk_sanity():
    """same_as_sglang_dump catches a key that SGLang's model does not have."""
    with pytest.raises(AssertionError):
        same_as_sglang_dump(
            protocol.ErrorResponse, {**protocol.ErrorResponse(message="m", type="t", code=1).model_dump(), "x": 1}
        )
    assert issubclass(protocol.ErrorResponse, BaseModel)
