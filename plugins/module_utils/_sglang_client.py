# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Minimal HTTP client of an SGLang server for spec_decode_bench (standard library only).

Every request streams, because only a stream shows when each token arrived (TTFT, inter-token
latency). Failures never raise out of a generation call: they come back as a request record with
ok=False and an error string that says what was seen, so one bad request is counted, not fatal.
Proxies are bypassed on purpose: the server is the host's own, and a site proxy would measure itself.
"""

from __future__ import annotations

import http.client
import json
import socket
import time
import urllib.error
import urllib.request

EXCERPT = 200


class ServerError(Exception):
    """A non-generation call (health, server info) failed; the message is for the operator."""


def _excerpt(data):
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else str(data)
    text = " ".join(text.split())
    return text if len(text) <= EXCERPT else text[:EXCERPT] + "..."


class Client:
    def __init__(self, base_url, timeout=120.0, clock=time.monotonic):
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        # The clock the request timings are read from (TTFT, ITL, E2E); tests pass their own to check the arithmetic.
        self.clock = clock
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    # -- plumbing -------------------------------------------------------------------------------
    def _open(self, path, body=None, timeout=None):
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base_url + path, data=data, method="POST" if body is not None else "GET")
        if body is not None:
            request.add_header("Content-Type", "application/json")
        return self._opener.open(request, timeout=self.timeout if timeout is None else timeout)

    def _describe(self, path, exc):
        """Operator-facing text of a failed call to path."""
        url = self.base_url + path
        if isinstance(exc, urllib.error.HTTPError):
            try:
                body = exc.read()
            except (OSError, http.client.HTTPException):
                body = b""
            return f"HTTP {exc.code} from {url}: {_excerpt(body) or exc.reason}"
        if isinstance(exc, (socket.timeout, TimeoutError)) or (
            isinstance(exc, urllib.error.URLError) and isinstance(exc.reason, (socket.timeout, TimeoutError))
        ):
            return f"no answer from {url} within {self.timeout:g}s (timeout)"
        if isinstance(exc, urllib.error.URLError):
            return f"cannot reach {url}: {exc.reason}"
        if isinstance(exc, http.client.IncompleteRead):
            return f"response from {url} cut off after {len(exc.partial)} bytes"
        if isinstance(exc, (http.client.HTTPException, ConnectionError)):
            return f"connection to {url} broke: {exc.__class__.__name__}: {exc}"
        return f"request to {url} failed: {exc.__class__.__name__}: {exc}"

    def get_json(self, path):
        try:
            with self._open(path) as resp:
                raw = resp.read()
        except Exception as exc:  # every transport failure becomes one operator-facing message
            raise ServerError(self._describe(path, exc)) from exc
        try:
            return json.loads(raw)
        except ValueError as exc:
            raise ServerError(f"malformed JSON from {self.base_url}{path}: {_excerpt(raw)}") from exc

    def server_info(self):
        """GET /server_info, or /get_server_info from a server that has no /server_info (SGLang < 0.5.9).

        SGLang 0.5.9 answers both but logs /get_server_info as deprecated, to be removed; 0.5.3 has only that one.
        """
        try:
            return self.get_json("/server_info")
        except ServerError as exc:
            if not isinstance(exc.__cause__, urllib.error.HTTPError) or exc.__cause__.code != 404:
                raise
        return self.get_json("/get_server_info")

    def health(self, timeout=5.0):
        """(True, 'HTTP 200') when /health answers 200, else (False, what was seen)."""
        try:
            with self._open("/health", timeout=timeout) as resp:
                resp.read()
                return resp.status == 200, f"HTTP {resp.status}"
        except urllib.error.HTTPError as exc:
            return False, f"HTTP {exc.code}"
        except Exception as exc:
            return False, self._describe("/health", exc)

    def wait_healthy(self, timeout, interval=0.5, clock=time.monotonic, sleep=time.sleep):
        deadline = clock() + timeout
        while True:
            ok, seen = self.health(timeout=min(5.0, max(0.5, timeout)))
            if ok:
                return True, seen
            if clock() >= deadline:
                return False, seen
            sleep(interval)

    # -- generation -----------------------------------------------------------------------------
    def generate(self, prompt, max_new_tokens, sampling=None):
        """Stream one request through SGLang's native /generate (meta_info has spec_verify_ct).

        Greedy by default; ``sampling`` (temperature, top_p, top_k) asks for a sampled request, which runs the
        server's sampling kernels (the warm-up sends both)."""
        params = {"temperature": 0, "max_new_tokens": max_new_tokens, "ignore_eos": True}
        params.update(sampling or {})
        body = {"text": prompt, "sampling_params": params, "stream": True}
        return self._stream("/generate", body, self._generate_event)

    def completion(self, prompt, max_tokens, model):
        """Stream one request through the OpenAI-compatible /v1/completions (usage in the last event)."""
        body = {
            "model": model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        return self._stream("/v1/completions", body, self._completion_event)

    @staticmethod
    def _generate_event(event, state):
        """Tokens so far from a /generate event (cumulative meta_info.completion_tokens)."""
        meta = event.get("meta_info")
        if not isinstance(meta, dict) or "completion_tokens" not in meta:
            raise ValueError("event without meta_info.completion_tokens")
        state["prompt_tokens"] = meta.get("prompt_tokens")
        if meta.get("spec_verify_ct") is not None:
            state["spec_verify_ct"] = meta["spec_verify_ct"]
        if meta.get("e2e_latency") is not None:
            state["server_e2e_s"] = meta["e2e_latency"]
        return int(meta["completion_tokens"])

    @staticmethod
    def _completion_event(event, state):
        """Tokens so far from a /v1/completions event: one chunk of text counts as progress."""
        usage = event.get("usage")
        if isinstance(usage, dict):
            state["prompt_tokens"] = usage.get("prompt_tokens")
            state["usage_tokens"] = usage.get("completion_tokens")
        choices = event.get("choices")
        if not isinstance(choices, list):
            raise ValueError("event without a choices list")
        chunks = state.get("chunks", 0) + sum(1 for c in choices if isinstance(c, dict) and c.get("text"))
        state["chunks"] = chunks
        return chunks

    def _stream(self, path, body, on_event):
        url = self.base_url + path
        record = {
            "ok": False,
            "error": None,
            "prompt_tokens": None,
            "completion_tokens": 0,
            "spec_verify_ct": None,
            "ttft_s": None,
            "e2e_s": None,
            "itl_s": [],
            "server_e2e_s": None,
        }
        state = {}
        start = self.clock()
        last_token_at = None
        progress = 0
        done = False
        try:
            with self._open(path, body) as resp:
                while True:
                    line = resp.readline()
                    if not line:
                        break
                    line = line.strip()
                    if not line.startswith(b"data:"):
                        continue
                    payload = line[5:].strip()
                    if payload == b"[DONE]":
                        done = True
                        break
                    try:
                        event = json.loads(payload)
                    except ValueError:
                        record["error"] = f"malformed JSON in stream from {url}: {_excerpt(payload)}"
                        return record
                    if isinstance(event, dict) and event.get("error"):
                        record["error"] = f"server error in stream from {url}: {_excerpt(json.dumps(event['error']))}"
                        return record
                    try:
                        now_progress = on_event(event, state)
                    except (ValueError, TypeError) as exc:
                        record["error"] = f"unexpected event from {url} ({exc}): {_excerpt(payload)}"
                        return record
                    if now_progress > progress:
                        now = self.clock()
                        if last_token_at is None:
                            record["ttft_s"] = now - start
                        else:
                            record["itl_s"].append(now - last_token_at)
                        last_token_at = now
                        progress = now_progress
        except Exception as exc:  # transport failures are data for the error statistics
            record["error"] = self._describe(path, exc)
            if progress:
                record["error"] += f" (stream cut off before [DONE] after {progress} token chunk(s))"
            return record
        if not done:
            record["error"] = f"stream from {url} cut off before [DONE] after {progress} token chunk(s)"
            return record
        record["e2e_s"] = self.clock() - start
        record["prompt_tokens"] = state.get("prompt_tokens")
        record["spec_verify_ct"] = state.get("spec_verify_ct")
        record["server_e2e_s"] = state.get("server_e2e_s")
        tokens = state.get("usage_tokens") if path != "/generate" else progress
        if tokens is None:
            record["error"] = f"stream from {url} carried no usage: cannot count output tokens"
            return record
        record["completion_tokens"] = int(tokens)
        record["ok"] = True
        return record
