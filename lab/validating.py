# Copyright: (c) 2026, gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Validators in front of a lab index (lab/recorded_index.py), as real indexes serve them, and a log of who asked how.

Real indexes answer a project page, a METADATA file or a wheel's HEAD with an ETag and a Last-Modified and answer
If-None-Match / If-Modified-Since with 304 Not Modified. The recorded indexes serve neither; wrapped here, each
answer of status 200 gets ``ETag`` (the sha256 of the body a GET of that path gives) and a fixed ``Last-Modified``
unless it has one, and a request whose validators match gets 304 without a body. Every request is logged with its
method, path, status, user agent and the conditional headers it carried, so a test or a benchmark counts what a
plan asked and how.

    with validating(RecordedPages)("sgl-whl-cu130") as idx:
        idx.asked  # [{"method", "path", "status", "agent", "conditional"}]
"""

from __future__ import annotations

import hashlib
import threading
import time
from email.utils import parsedate_to_datetime

FIXED_LAST_MODIFIED = "Tue, 03 Feb 2026 10:00:00 GMT"


def _body(app, environ) -> tuple:
    """Status, headers and body of a GET of the request's path (a HEAD is answered from the GET's validators)."""
    seen = {}

    def start(status, headers, exc_info=None):
        seen["status"], seen["headers"] = status, headers

    get = dict(environ, REQUEST_METHOD="GET")
    get.pop("HTTP_RANGE", None)
    body = b"".join(app(get, start))
    return seen["status"], seen["headers"], body


def _matches(environ, etag: str, last_modified: str) -> bool:
    inm = environ.get("HTTP_IF_NONE_MATCH")
    if inm is not None:
        return etag in [t.strip() for t in inm.split(",")] or inm.strip() == "*"
    ims = environ.get("HTTP_IF_MODIFIED_SINCE")
    if ims:
        try:
            return parsedate_to_datetime(last_modified) <= parsedate_to_datetime(ims)
        except (TypeError, ValueError):
            return False
    return False


def validating(index_class):
    """A subclass of a lab index class (a ``_Loopback``) whose answers carry validators and honour them."""

    class Validating(index_class):
        def __init__(self, *args, latency: float = 0.0, **kwargs):
            # One round trip per request: the wrapped index is asked twice for some, so it keeps no latency itself.
            super().__init__(*args, **kwargs)
            self.delay = latency

        def _start_log(self):
            super()._start_log()
            self.asked = []
            self._asked_lock = threading.Lock()

        def __call__(self, environ, start_response):
            if self.delay:
                time.sleep(self.delay)
            status, headers, full = _body(super().__call__, dict(environ, HTTP_ACCEPT=environ.get("HTTP_ACCEPT", "")))
            named = {k.lower(): v for k, v in headers}
            etag = named.get("etag") or '"' + hashlib.sha256(full).hexdigest()[:32] + '"'
            last_modified = named.get("last-modified") or FIXED_LAST_MODIFIED
            conditional = {
                h: environ[k]
                for h, k in (("If-None-Match", "HTTP_IF_NONE_MATCH"), ("If-Modified-Since", "HTTP_IF_MODIFIED_SINCE"))
                if k in environ
            }
            ok = status.startswith("200")
            answer = "304" if ok and _matches(environ, etag, last_modified) else status.split()[0]
            with self._asked_lock:
                self.asked.append(
                    {
                        "method": environ["REQUEST_METHOD"],
                        "path": environ.get("PATH_INFO", ""),
                        "status": int(answer),
                        "agent": environ.get("HTTP_USER_AGENT", ""),
                        "range": environ.get("HTTP_RANGE"),
                        "conditional": conditional,
                    }
                )
            if answer == "304":
                start_response("304 Not Modified", [("ETag", etag), ("Last-Modified", last_modified)])
                return [b""]
            if not ok:  # errors, partial content: as the index answers them
                return index_class.__call__(self, environ, start_response)
            extra = [(k, v) for k, v in (("ETag", etag), ("Last-Modified", last_modified)) if k.lower() not in named]
            if environ.get("HTTP_RANGE") and environ["REQUEST_METHOD"] == "GET":
                return index_class.__call__(self, environ, lambda s, h, e=None: start_response(s, h + extra, e))
            start_response(status, headers + extra)
            return [b"" if environ["REQUEST_METHOD"] == "HEAD" else full]

    Validating.__name__ = f"Validating{index_class.__name__}"
    return Validating


def by_agent(asked: list, agent_prefix: str) -> list:
    """The logged requests whose user agent starts with ``agent_prefix`` (the planner's own: gpufleet-wheel-plan)."""
    return [a for a in asked if a["agent"].startswith(agent_prefix)]
