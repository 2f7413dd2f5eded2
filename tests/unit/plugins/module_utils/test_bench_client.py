"""The SGLang client against the lab stand-in served in-process: known timing, and every failure mode."""

from __future__ import annotations

import json
import socket
import urllib.request

import pytest

# lab_sglang is made importable by conftest.py.
from lab_sglang.server import spec_metrics
from lab_sglang.stack import Rates
from lab_sglang.timing import Schedule, build_schedule, step_sizes

from ansible_collections.gpufleet.upgrade.plugins.module_utils._sglang_client import Client, ServerError

FAST = Rates("test", nospec_tok_s=400.0, spec_tok_s=800.0, accept_length=3.0)


@pytest.fixture
def stand_in_config():
    return {"rates": FAST, "ttft_base_s": 0.005}


# -- the stand-in's schedule is what the statistics are checked against --------------------------
def test_step_sizes_follow_the_accept_length():
    assert step_sizes(16, 3.0) == [3, 3, 3, 3, 3, 1]
    assert step_sizes(10, 1.6) == [1, 2, 1, 2, 2, 1, 1]
    assert step_sizes(5, 1.0) == [1] * 5


def test_schedule_ends_at_n_over_rate():
    s = build_schedule(
        60, 100, speculative=True, rate_tok_s=96.1, accept_length=3.0, ttft_base_s=0.02, prefill_s_per_token=0.0
    )
    assert s.verify_ct == 20
    assert s.completion_tokens == 60
    assert s.offsets[0] == pytest.approx(0.02)
    assert s.e2e_latency == pytest.approx(60 / 96.1)


# -- normal answers ----------------------------------------------------------------------------
class StepClock:
    """A clock that moves one second each time it is read: the timings then say how they were computed."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        self.now += 1.0
        return self.now


def test_generate_stream_counts_tokens_verify_steps_and_timing(serve):
    _server, url = serve()
    r = Client(url, timeout=5, clock=StepClock()).generate("hello there", 16)
    assert r["ok"], r["error"]
    assert r["completion_tokens"] == 16
    assert r["spec_verify_ct"] == 6
    # Read at the request (1), at each of the six token chunks (2..7) and at [DONE] (8): TTFT is the first chunk's
    # reading less the request's, each ITL the gap to the chunk before, E2E the end less the request.
    assert r["ttft_s"] == 1.0
    assert r["itl_s"] == [1.0] * 5
    assert r["e2e_s"] == 7.0
    assert r["server_e2e_s"] is not None


def test_generate_stream_on_the_real_clock_is_never_faster_than_the_stand_ins_pace(serve):
    """The stand-in paces 16 tokens at 800 tok/s after a 5 ms first token: a load can only slow it, so only the lower
    bounds are checked (a wall-clock upper bound fails on a busy machine)."""
    _server, url = serve()
    r = Client(url, timeout=5).generate("hello there", 16)
    assert r["ok"], r["error"]
    assert r["ttft_s"] >= 0.004
    assert r["e2e_s"] >= 16 / 800.0 * 0.9 and r["e2e_s"] >= r["ttft_s"] + sum(r["itl_s"]) - 1e-6


def test_completion_stream_counts_usage_tokens(serve):
    _server, url = serve()
    r = Client(url, timeout=5).completion("hello there", 16, "lab-model")
    assert r["ok"], r["error"]
    assert r["completion_tokens"] == 16
    assert r["spec_verify_ct"] is None
    assert len(r["itl_s"]) == 5
    assert r["prompt_tokens"] == 3


def test_server_info_reports_the_average_accept_length(serve):
    _server, url = serve()
    client = Client(url, timeout=5)
    client.generate("a", 16)
    client.generate("b", 30)
    info = client.get_json("/get_server_info")
    assert info["internal_states"][0]["avg_spec_accept_length"] == pytest.approx(46 / 16)
    assert info["speculative_algorithm"] == "EAGLE3"


@pytest.mark.parametrize("stream", [True, False])
def test_a_generation_is_counted_before_its_response_ends(serve, monkeypatch, stream):
    """A client that reads the server info right after a response must see that request counted: the stand-in counts
    it before the last bytes go out, as SGLang's scheduler does. Counting after them once let the benchmark read an
    average of 368/128 instead of 432/150 (its last request of 64 tokens missing)."""
    server, url = serve()
    handler = server.RequestHandlerClass
    seen = []
    last_write = "_end_stream" if stream else "_send_json"
    original = getattr(handler, last_write)

    def spy(self, *args, **kwargs):
        if self.path == "/generate":
            seen.append((self.state.cum_tokens, self.state.cum_verify))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(handler, last_write, spy)
    body = json.dumps({"text": "a", "sampling_params": {"max_new_tokens": 16}, "stream": stream}).encode()
    request = urllib.request.Request(url + "/generate", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=5) as resp:
        resp.read()
    assert seen == [(16, 6)]


@pytest.mark.parametrize("new_path", [True, False])
def test_server_info_prefers_the_new_path_and_falls_back_to_the_old(serve, monkeypatch, new_path):
    """SGLang 0.5.9 serves /server_info (and deprecates /get_server_info); 0.5.3 only /get_server_info."""
    _server, url = serve(server_info_path=new_path)
    asked = []
    original = Client.get_json

    def record(self, path):
        asked.append(path)
        return original(self, path)

    monkeypatch.setattr(Client, "get_json", record)
    assert Client(url, timeout=5).server_info()["speculative_algorithm"] == "EAGLE3"
    assert asked == (["/server_info"] if new_path else ["/server_info", "/get_server_info"])


def test_server_info_other_failures_are_not_hidden_by_the_fallback(serve):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]
    with pytest.raises(ServerError, match=r"cannot reach http://127.0.0.1:\d+/server_info"):
        Client(f"http://127.0.0.1:{closed}", timeout=2).server_info()


def test_final_meta_info_carries_sglangs_speculative_fields(serve):
    _server, url = serve(speculative_num_draft_tokens=16)
    body = {"text": "hello there", "sampling_params": {"max_new_tokens": 16}}
    request = urllib.request.Request(url + "/generate", data=json.dumps(body).encode(), method="POST")
    with urllib.request.urlopen(request, timeout=5) as resp:
        meta = json.loads(resp.read())["meta_info"]
    assert meta["spec_verify_ct"] == 6 and meta["spec_accept_length"] == pytest.approx(16 / 6)
    assert meta["spec_accept_token_num"] == 10 and meta["spec_draft_token_num"] == 6 * 15
    assert meta["spec_accept_histogram"] == [1, 0, 5] and meta["total_retractions"] == 0


def test_spec_metrics_without_draft_tokens_to_accept_give_only_the_histogram():
    schedule = Schedule(chunks=(1, 1), offsets=(0.1, 0.2), verify_ct=2)
    assert spec_metrics(schedule, 1) == {"spec_accept_histogram": [2]}
    assert spec_metrics(Schedule(chunks=(), offsets=(), verify_ct=0), 16) == {}


def test_without_speculation_there_is_no_verify_count(serve):
    _server, url = serve(speculative_algorithm=None, speculative_draft_model_path=None)
    r = Client(url, timeout=5).generate("x", 8)
    assert r["ok"] and r["spec_verify_ct"] is None and len(r["itl_s"]) == 7
    assert "avg_spec_accept_length" not in Client(url).get_json("/get_server_info")["internal_states"][0]


# -- failure modes give one clear error each -----------------------------------------------------
@pytest.mark.parametrize("api", ["generate", "completion"])
@pytest.mark.parametrize(
    ("fault", "expected"),
    [
        ("http500", "HTTP 500 from http://127.0.0.1:"),
        ("malformed_json", "malformed JSON in stream from"),
        ("stream_cut", "cut off before [DONE] after"),
    ],
)
def test_fault_becomes_an_error_record(serve, api, fault, expected):
    _server, url = serve(fault=fault)
    client = Client(url, timeout=5)
    r = client.generate("x", 16) if api == "generate" else client.completion("x", 16, "m")
    assert r["ok"] is False
    assert expected in r["error"], r["error"]


def test_slow_server_times_out(serve):
    _server, url = serve(fault="slow", slow_s=3.0)
    r = Client(url, timeout=0.5).generate("x", 4)
    assert r["ok"] is False
    assert "within 0.5s (timeout)" in r["error"]


def test_fault_every_second_request(serve):
    _server, url = serve(fault="http500", fault_every=2)
    client = Client(url, timeout=5)
    assert [client.generate("x", 4)["ok"] for _attempt in range(4)] == [True, False, True, False]


def test_never_healthy_and_unreachable(serve):
    _server, url = serve(fault="never_healthy")
    ticks = iter(range(100))
    ok, seen = Client(url).wait_healthy(3, clock=lambda: next(ticks), sleep=lambda _s: None)
    assert (ok, seen) == (False, "HTTP 503")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]
    ok, seen = Client(f"http://127.0.0.1:{closed}").wait_healthy(0)
    assert ok is False and "cannot reach" in seen


def test_malformed_server_info_is_a_server_error(serve):
    _server, url = serve()
    with pytest.raises(ServerError, match=r"HTTP 404 from .*/nowhere"):
        Client(url).get_json("/nowhere")


def test_stand_in_chat_completions_stream_deltas(serve):
    """The optional chat endpoint, as SGLang streams it: a role chunk, content deltas, a finish chunk, [DONE]."""
    _server, url = serve()
    body = {"model": "lab-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 7, "stream": True}
    request = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(), method="POST")
    with urllib.request.urlopen(request, timeout=5) as resp:
        lines = [line.strip() for line in resp.read().decode().splitlines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    events = [json.loads(line[6:]) for line in lines[:-1]]
    assert events[0]["object"] == "chat.completion.chunk"
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    assert events[0]["choices"][0]["delta"]["content"] == ""
    assert len("".join(e["choices"][0]["delta"]["content"] or "" for e in events).split()) == 7
    assert [e["choices"][0]["finish_reason"] for e in events] == [None] * (len(events) - 1) + ["length"]
    assert events[-1]["choices"][0]["delta"]["content"] is None
