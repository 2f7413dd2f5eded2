# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Talking to package indexes: project listings (PEP 691 JSON, else PEP 503 HTML), wheel METADATA
(PEP 658 file, else an HTTP range read of the wheel's zip directory) and verified downloads.

What real indexes do that a listing must survive:
- a static page lists one file name several times with different sha256 when the file was republished (the
  sgl-kernel cu130 page lists one wheel five times): only the newest is served, so the listing keeps the newest
  entry (the last on a PEP 503 page; on PEP 691 the latest upload-time when every entry has one) and remembers
  every hash it listed (``Candidate.listed_hashes``); the download then locks the hash the served file has;
- an index answers 403, not 404, for a project it does not carry (PyTorch's): the listing is empty and the index
  is noted as not carrying it (``Fetcher.not_carried``), the plan goes on with the other indexes the profile names
  for the package, and says so (``index_refusals``); an index that does not answer at all is noted as down
  (``Fetcher.down``, asked once per plan) and refuses every package the same way;
- a link may carry no sha256 (PyTorch's nightly pages carry none): the file is downloaded once on the
  controller and hashed (``settle_hashes``), and that hash is locked, marked as computed by the controller. The hash
  is recorded in the controller's cache (``UrlHashRecord``) with the size, ETag and Last-Modified the index served
  the file with: a later plan (check mode too) asks for those with one HEAD request and downloads nothing while
  they are the same.

Re-planning an unchanged profile asks only whether anything changed: every project page, METADATA file, wheel whose
METADATA was read by range, and HEAD answer is kept under the controller's cache folder with the validators it was
served with (``ValidatorCache``: ETag, Last-Modified), and asked for again with If-None-Match / If-Modified-Since;
a 304 reuses what is kept.
"""

from __future__ import annotations

import datetime as _dt
import email.utils
import hashlib
import io
import json
import os
import tempfile
import threading
import traceback
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from concurrent.futures import ThreadPoolExecutor

try:
    from packaging.metadata import Metadata
    from packaging.utils import canonicalize_name

    HAS_PACKAGING = True
    PACKAGING_IMPORT_ERROR = None
except ImportError:  # the planner runs on the controller; callers check HAS_PACKAGING before planning
    HAS_PACKAGING = False
    PACKAGING_IMPORT_ERROR = traceback.format_exc()

from ansible.module_utils.urls import open_url

from ansible_collections.gpufleet.upgrade.plugins.module_utils._hash_record import (
    HashRecord,
    UrlHashRecord,
    _Record,
    file_sha256,
)
from ansible_collections.gpufleet.upgrade.plugins.plugin_utils._wheels import (
    Candidate,
    PlanError,
    parse_project_html,
    parse_project_json,
)

JSON_TYPE = "application/vnd.pypi.simple.v1+json"
ACCEPT = f"{JSON_TYPE}, application/vnd.pypi.simple.v1+html;q=0.2, text/html;q=0.1"
USER_AGENT = "gpufleet-wheel-plan/1"
HEAD_WORKERS = 8  # concurrent HEAD requests when dating builds by Last-Modified
NOT_CARRIED = (403, 404)  # statuses of a project listing that mean "this index does not carry it"


class IndexUnreachable(PlanError):
    """An index that does not answer; the message names it, its URL and the error."""


class IndexDown(IndexUnreachable):
    """An index that could not be reached at all (connection refused, name not resolved, timed out): for the plan it
    refuses every package, as an index answering 403 for every path does."""


class HashMismatch(PlanError):
    """A file whose content does not have the sha256 its index listed."""


CONDITIONS = {"etag": "If-None-Match", "last_modified": "If-Modified-Since"}


class ValidatorCache(_Record):
    """What the indexes served, kept with the validators they served it with, so a later plan asks only whether it
    changed: ``<cache_dir>/index/validators.json`` holds per request (``kind`` and URL) the ETag and Last-Modified,
    the final URL, the content type and, for a HEAD, the size; a body (a project page, a METADATA file, the METADATA
    read from a wheel by range) is a file beside it named by the sha256 of the request, whose own sha256 the table
    records (a body changed or gone since is not used: the request is made without validators). A response without a
    validator is not kept: there is nothing to ask with. The record is written when the plan ends (``save``)."""

    NAME = "validators.json"

    def __init__(self, cache_dir: str):
        super().__init__(os.path.join(cache_dir, "index"))
        self._mutex = threading.Lock()
        self.revalidated = 0  # 304 answers: kept copies used
        self.by_content = 0  # METADATA taken by the listed sha256 of its wheel, no request
        self._checked = {}  # key -> body checked by conditions(), handed out by kept() on a 304

    @staticmethod
    def _valid(entry) -> bool:
        return isinstance(entry, dict) and bool(entry.get("etag") or entry.get("last_modified") or entry.get("sha256"))

    @staticmethod
    def key(kind: str, url: str) -> str:
        return f"{kind} {url}"

    def _body_path(self, key: str) -> str:
        return os.path.join(self.folder, hashlib.sha256(key.encode()).hexdigest())

    def _body(self, key: str) -> bytes | None:
        """The kept body of ``key`` if its file is there with the sha256 recorded for it (a record read back is
        checked before it is used: a body changed or cut short is not), else None."""
        entry = self._table.get(key) or {}
        try:
            with open(self._body_path(key), "rb") as handle:
                body = handle.read()
        except OSError:
            return None
        return body if hashlib.sha256(body).hexdigest() == entry.get("body") else None

    def conditions(self, key: str) -> dict:
        """The conditional headers for a request kept before, else none (nothing kept, or its body is not intact)."""
        entry = self._table.get(key)
        if not entry:
            return {}
        if entry.get("body"):
            body = self._body(key)
            if body is None:
                return {}
            with self._mutex:
                self._checked[key] = body
        return {header: entry[field] for field, header in CONDITIONS.items() if entry.get(field)}

    def kept(self, key: str):
        """``(entry, body)`` as kept for a request the index answered 304 (``conditions`` checked the body); the body
        None for a HEAD."""
        with self._mutex:
            self.revalidated += 1
            return self._table[key], self._checked.pop(key, None)

    def put(self, key: str, headers, final_url: str, body: bytes | None = None, **extra) -> None:
        """Keep a response (its ``headers``) and its body; a response without ETag and Last-Modified is dropped."""
        length = headers.get("Content-Length")
        entry = {
            "etag": headers.get("ETag"),
            "last_modified": headers.get("Last-Modified"),
            "content_type": headers.get("Content-Type", ""),
            "final_url": final_url,
            "size": int(length) if length and length.isdigit() else None,
            "body": hashlib.sha256(body).hexdigest() if body is not None else None,
            **extra,
        }
        with self._mutex:
            if not self._valid(entry):
                self._changed = self._changed or self._table.pop(key, None) is not None
                return
            if body is not None:
                os.makedirs(self.folder, exist_ok=True)
                fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=".body-")
                with os.fdopen(fd, "wb") as handle:
                    handle.write(body)
                os.replace(tmp, self._body_path(key))
            self._table[key] = entry
            self._changed = True

    def by_digest(self, kind: str, sha256: str) -> bytes | None:
        """A body kept by the sha256 of the file it was read from (``put_digest``), else None."""
        body = self._body(self.key(kind, f"sha256:{sha256}"))
        if body is not None:
            with self._mutex:
                self.by_content += 1
        return body

    def put_digest(self, kind: str, sha256: str, body: bytes) -> None:
        """Keep what was read of the file with that sha256 (its METADATA): the same for as long as the sha256 is."""
        self.put(self.key(kind, f"sha256:{sha256}"), {}, "", body, sha256=sha256)

    def _kept(self) -> dict:
        return {k: e for k, e in self._table.items() if not e.get("body") or os.path.isfile(self._body_path(k))}


class _Served:
    """One answer, fresh or kept: headers (a mapping), body, the URL it came from, and whether it was kept."""

    def __init__(self, headers, body, url, kept=False):
        self.headers, self.body, self.url, self.kept = headers, body, url, kept


class Fetcher:
    """HTTP access with counters, so the plan can report what crossed from the indexes."""

    def __init__(self, timeout: float = 30.0, head_workers: int = HEAD_WORKERS, cache: ValidatorCache | None = None):
        self.timeout = timeout
        self.head_workers = head_workers
        self.cache = cache  # set by make_lock from the controller's cache folder when not given
        self.requests = 0
        self.conditional = 0  # requests that carried If-None-Match or If-Modified-Since
        self.bytes_in = 0
        self.downloads = []
        self.not_carried = {}  # (index, canonical project) -> "HTTP 403"
        self.down = {}  # index -> why it could not be reached (asked once per plan)
        self.unhashed_hosts = set()  # hosts that listed a file without a sha256 (uv hashes such files itself)
        self._lock = threading.Lock()

    @property
    def revalidated(self) -> int:
        """Answers 304 (Not Modified): what the cache kept was used."""
        return self.cache.revalidated if self.cache else 0

    @property
    def metadata_by_sha256(self) -> int:
        """METADATA taken from the cache by the listed sha256 of its wheel, without a request."""
        return self.cache.by_content if self.cache else 0

    def _count(self, requests=0, nbytes=0, conditional=0):
        with self._lock:
            self.requests += requests
            self.bytes_in += nbytes
            self.conditional += conditional

    def _open(self, url: str, headers=None, method="GET"):
        headers = headers or {}
        self._count(requests=1, conditional=int(any(h in headers for h in CONDITIONS.values())))
        # decompress and netrc off: range reads need the raw bytes, and requests carry only the headers given here.
        return open_url(
            url,
            headers={"User-Agent": USER_AGENT, **headers},
            method=method,
            timeout=self.timeout,
            http_agent=USER_AGENT,
            decompress=False,
            use_netrc=False,
        )

    def _served(self, kind: str, url: str, headers=None, method="GET") -> _Served:
        """GET (or HEAD) ``url`` through the validator cache: asked with the validators of what was kept for it, a
        304 answer gives the kept copy; a fresh answer is kept with its validators. HTTP errors are raised."""
        key = ValidatorCache.key(kind, url)
        conditions = self.cache.conditions(key) if self.cache else {}
        try:
            with self._open(url, {**(headers or {}), **conditions}, method) as resp:
                body = resp.read() if method == "GET" else None
                got = _Served(resp.headers, body, resp.geturl())
        except urllib.error.HTTPError as exc:
            if exc.code == 304 and conditions:
                entry, body = self.cache.kept(key)
                fields = {"Content-Type": entry.get("content_type") or "", "ETag": entry.get("etag")}
                fields.update({"Last-Modified": entry.get("last_modified"), "Content-Length": entry.get("size")})
                kept_headers = {k: str(v) for k, v in fields.items() if v is not None}
                return _Served(kept_headers, body, entry.get("final_url") or url, kept=True)
            raise
        if body is not None:
            self._count(nbytes=len(body))
        if self.cache:
            self.cache.put(key, got.headers, got.url, body)
        return got

    def listing(self, index: str, base_url: str, project: str) -> list:
        """Every wheel the index lists for a project, one entry per file name (``collapse_republished``); an empty
        list when the index does not carry it (HTTP 404, or 403 as an index on a bucket that may not be listed
        answers), noted in ``not_carried``. An index that cannot be reached raises IndexDown, at once for the
        projects after the first (``down``)."""
        url = directory_index(f"{base_url.rstrip('/')}/{canonicalize_name(project)}/")
        if index in self.down:
            raise IndexDown(self._down_message(index, base_url))
        try:
            got = self._served("page", url, {"Accept": ACCEPT})
        except urllib.error.HTTPError as exc:
            if exc.code in NOT_CARRIED:
                with self._lock:
                    self.not_carried[(index, canonicalize_name(project))] = f"HTTP {exc.code}"
                return []
            raise IndexUnreachable(
                f"index {index!r} ({base_url}) answered HTTP {exc.code} for {url}; fix: plan again once the index"
                " answers, or map it to a mirror that does (gpufleet_index_urls)"
            ) from exc
        except (urllib.error.URLError, OSError) as exc:
            with self._lock:
                self.down[index] = str(getattr(exc, "reason", exc))
            raise IndexDown(self._down_message(index, base_url)) from exc
        body, ctype, final = got.body, got.headers.get("Content-Type", ""), got.url
        if JSON_TYPE in ctype:
            cands = parse_project_json(json.loads(body), final, index)
        else:
            cands = parse_project_html(body.decode("utf-8", "replace"), final, index)
        with self._lock:
            self.unhashed_hosts.update(urllib.parse.urlsplit(c.url).netloc for c in cands if not c.sha256)
        return collapse_republished(cands)

    def _down_message(self, index: str, base_url: str) -> str:
        return (
            f"index {index!r} ({base_url}) is unreachable: {self.down[index]};"
            " check the URL or its gpufleet_index_urls mirror"
        )

    def date_undated(self, cands: list) -> None:
        """Give candidates without upload-time or dev date the file's Last-Modified: one HEAD request each,
        ``head_workers`` at a time. A file that does not answer, or answers without a readable Last-Modified, stays
        undated (the plan then judges its source by version gap, or as undatable)."""
        undated = [c for c in cands if c.date is None]
        if not undated:
            return
        with ThreadPoolExecutor(max_workers=max(1, min(self.head_workers, len(undated)))) as pool:
            for cand, stamp in zip(undated, pool.map(self._last_modified, undated), strict=True):
                cand.last_modified = stamp

    def _last_modified(self, cand: Candidate):
        try:
            stamp = self._served("head", cand.url, method="HEAD").headers.get("Last-Modified")
        except (urllib.error.URLError, OSError):
            return None
        try:
            return email.utils.parsedate_to_datetime(stamp).astimezone(_dt.timezone.utc) if stamp else None
        except (TypeError, ValueError):
            return None

    def served_stamp(self, url: str) -> dict:
        """What the index serves ``url`` with (one HEAD request): size (Content-Length), ETag and Last-Modified;
        an empty dict when it does not answer."""
        try:
            headers = self._served("head", url, method="HEAD").headers
        except (urllib.error.URLError, OSError):
            return {}
        length = headers.get("Content-Length")
        return {
            "size": int(length) if length and str(length).isdigit() else None,
            "etag": headers.get("ETag"),
            "last_modified": headers.get("Last-Modified"),
        }

    def metadata(self, cand: Candidate) -> Metadata:
        """The wheel's METADATA: PEP 658 file when offered, else read from the zip's tail with HTTP ranges. A wheel
        its listing gives one sha256 for is a fixed file: its METADATA, read once, is kept by that sha256 and not
        asked for again (an index that serves no validators, as a mirror may, would otherwise be read again every
        plan; the file's bytes are checked against that sha256 when it is fetched)."""
        digest = cand.sha256 if cand.sha256 and not cand.listed_hashes and cand.sha256_source == "index" else None
        if digest and self.cache:
            kept = self.cache.by_digest("metadata", digest)
            if kept is not None:
                return Metadata.from_email(kept, validate=False)
        raw = self._metadata_raw(cand)
        if digest and self.cache:
            self.cache.put_digest("metadata", digest, raw)
        return Metadata.from_email(raw, validate=False)

    def _metadata_raw(self, cand: Candidate) -> bytes:
        raw = None
        if cand.metadata_url:
            try:
                raw = self._served("metadata", cand.metadata_url).body
            except (urllib.error.URLError, OSError):
                raw = None
        if raw is None:
            try:
                raw = self._metadata_from_wheel(cand)
            except zipfile.BadZipFile as exc:
                raise PlanError(f"{cand.filename} from index {cand.index!r} is not a valid wheel: {exc}") from exc
            except (urllib.error.URLError, OSError) as exc:
                raise IndexUnreachable(
                    f"reading the METADATA of {cand.url} (index {cand.index!r}) failed: {getattr(exc, 'reason', exc)}"
                ) from exc
        return raw

    def _metadata_from_wheel(self, cand: Candidate) -> bytes:
        """The METADATA member of the wheel, read by range after a HEAD; kept with the validators of that HEAD, so a
        later plan asks one conditional HEAD and reads nothing while the wheel is served unchanged."""
        key = ValidatorCache.key("wheel-metadata", cand.url)
        conditions = self.cache.conditions(key) if self.cache else {}
        try:
            with self._open(cand.url, conditions, method="HEAD") as resp:
                head, final = resp.headers, resp.geturl()
        except urllib.error.HTTPError as exc:
            if exc.code == 304 and conditions:
                return self.cache.kept(key)[1]
            raise
        raw = self._metadata_read(cand, head)
        if self.cache:
            self.cache.put(key, {k: v for k, v in head.items() if k != "Content-Length"}, final, raw)
        return raw

    def _metadata_read(self, cand: Candidate, head) -> bytes:
        try:
            with zipfile.ZipFile(_RangeFile(self, cand.url, head)) as zf:
                return _read_metadata(zf, cand)
        except _NoRanges:
            with self._open(cand.url) as resp:
                body = resp.read()
            self._count(nbytes=len(body))
            with zipfile.ZipFile(io.BytesIO(body)) as zf:
                return _read_metadata(zf, cand)

    def download(self, url: str, dest: str, sha256: str, record: HashRecord | None = None) -> bool:
        """Fetch ``url`` to ``dest`` unless a file with that sha256 is already there. True if it was fetched.
        With ``record`` (the HashRecord of dest's folder) a file already there is hashed only if it changed since its
        hash was recorded, and a fetched file's hash is recorded."""
        return self.download_verified(url, dest, (sha256,), record)[0]

    def download_verified(self, url: str, dest: str, accept: tuple, record: HashRecord | None = None) -> tuple:
        """Fetch ``url`` to ``dest``; ``(fetched, sha256)`` with the sha256 the file has. ``accept``: the hashes the
        index lists for it (several for a republished file name), the file must have one of them; empty for a link
        that lists none, whose file is then taken as served and hashed here. A file already at ``dest`` with an
        accepted hash is kept (``record`` as in ``download``)."""
        accept = tuple(h.lower() for h in accept if h)
        if os.path.exists(dest) and accept:
            there = record.sha256(os.path.basename(dest)) if record else file_sha256(dest)
            if there in accept:
                return False, there
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(dest), prefix=".part-")
        digest = hashlib.sha256()
        try:
            with os.fdopen(fd, "wb") as out, self._open(url) as resp:
                for chunk in iter(lambda: resp.read(1 << 20), b""):
                    digest.update(chunk)
                    out.write(chunk)
                    self._count(nbytes=len(chunk))
            got = digest.hexdigest()
            if accept and got not in accept:
                listed = (
                    f"the lock (from the index listing) says sha256 {accept[0]}"
                    if len(accept) == 1
                    else f"the index lists the file name {len(accept)} times (republished), with sha256 "
                    + ", ".join(accept)
                )
                raise HashMismatch(
                    f"hash mismatch for {url}: {listed}, the file served has {got}; the index lists a stale hash"
                    " or the file was replaced. Re-run the plan once the index is consistent; nothing was installed."
                )
            os.replace(tmp, dest)
            if record:
                record.note(os.path.basename(dest), got)
        except (urllib.error.URLError, OSError) as exc:
            raise IndexUnreachable(f"download of {url} failed: {getattr(exc, 'reason', exc)}") from exc
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        self.downloads.append(url)
        return True, got


def collapse_republished(cands: list) -> list:
    """One candidate per file name. A name listed again with another sha256 was republished and only its newest
    body is served: keep the newest entry, the one with the latest upload-time when every entry has one (PEP 700),
    else the last listed (static pages append), and keep every listed hash on it (``listed_hashes``, page order)."""
    by_name = {}
    for pos, cand in enumerate(cands):
        by_name.setdefault(cand.filename, []).append((pos, cand))
    kept = []
    for entries in by_name.values():
        if all(c.upload_time for _p, c in entries):
            pos, newest = max(entries, key=lambda pc: (pc[1].upload_time, pc[0]))
        else:
            pos, newest = entries[-1]
        hashes = tuple(dict.fromkeys(c.sha256 for _p, c in entries if c.sha256))
        if len(hashes) > 1:
            newest.listed_hashes = hashes
        kept.append((pos, newest))
    return [c for _p, c in sorted(kept, key=lambda pc: pc[0])]


def settle_hashes(
    fetcher: Fetcher,
    chosen: dict,
    wheelhouse: str | None,
    record: HashRecord | None,
    computed: UrlHashRecord | None = None,
) -> dict:
    """Settle the hash of the chosen wheels whose listing does not: a link without a sha256 (hashed here) and a
    republished file name (checked against every hash listed for it). A hash ``computed`` recorded for the URL as
    the index still serves it is taken as it is (one HEAD request, no download), where there is no wheelhouse (check
    mode) or the wheelhouse holds the file with that hash; a wheelhouse that lacks it gets the file as served, hashed
    anew, so a plan that fetches never locks a stale record. Otherwise the file is downloaded
    once, into the wheelhouse when there is one (the fetch then reuses it), else into a temporary folder removed
    afterwards, and the hash it has is recorded in ``computed``. Each ``sha256`` is set to the hash of the served
    file. Returns per chosen key what was done, for the report."""
    todo = {k: c for k, c in chosen.items() if not c.sha256 or c.listed_hashes}
    notes = {}
    if not todo:
        return notes
    with tempfile.TemporaryDirectory(prefix="gpufleet-hash-") as scratch:
        for key, cand in todo.items():
            accept = cand.listed_hashes or ((cand.sha256,) if cand.sha256 else ())
            stamp = fetcher.served_stamp(cand.url) if computed is not None else {}
            sha = computed.get(cand.url, stamp) if computed is not None else None
            if sha and wheelhouse and not _held(wheelhouse, cand.filename, sha, record):
                sha = None  # the wheelhouse needs the file now anyway: hash what is served, not what was recorded
            fetched = False
            if sha is None or (accept and sha not in accept):
                folder = wheelhouse or scratch
                fetched, sha = fetcher.download_verified(
                    cand.url, os.path.join(folder, cand.filename), accept, record if wheelhouse else None
                )
                if computed is not None:
                    computed.put(cand.url, stamp, sha)
            notes[key] = _hash_settled(cand, sha, fetched, recorded=not fetched and computed is not None)
            cand.sha256 = sha
            if not cand.listed_hashes:
                cand.sha256_source = "controller"
    return notes


def _held(folder: str, filename: str, sha: str, record: HashRecord | None) -> bool:
    """Whether ``folder`` holds ``filename`` with that sha256."""
    if not os.path.isfile(os.path.join(folder, filename)):
        return False
    return (record.sha256(filename) if record else file_sha256(os.path.join(folder, filename))) == sha


def _hash_settled(cand: Candidate, sha: str, fetched: bool, recorded: bool) -> dict:
    if cand.listed_hashes:
        note = {"kind": "republished", "listed": list(cand.listed_hashes), "entry": cand.listed_hashes.index(sha) + 1}
    else:
        note = {"kind": "unhashed"}
    how = "downloaded" if fetched else ("recorded" if recorded else "in the wheelhouse")
    return {**note, "filename": cand.filename, "index": cand.index, "sha256": sha, "downloaded": fetched, "how": how}


def hash_note(note: dict) -> str:
    """One line of the plan report for a settle_hashes note."""
    how = {
        "downloaded": "downloaded once on the controller and hashed",
        "recorded": "not downloaded: the controller hashed it before and the index serves it with the same size,"
        " ETag and Last-Modified (cache/url-sha256.json)",
        "in the wheelhouse": "the controller's wheelhouse already holds it, hashed",
    }[note.get("how", "downloaded")]
    if note["kind"] == "republished":
        return (
            f"{note['filename']} is republished on index {note['index']!r}: listed {len(note['listed'])} times with"
            f" distinct sha256; planned the newest entry; the file served matched entry {note['entry']} of"
            f" {len(note['listed'])}, sha256 {note['sha256']} (locked, verified by the controller: {how})"
        )
    return (
        f"{note['filename']}: index {note['index']!r} lists no sha256 for it; {how}: sha256 {note['sha256']}"
        " (locked, computed by the controller)"
    )


def directory_index(url: str) -> str:
    """A file:// project URL that is a directory means its index.html, as pip reads a local PEP 503 tree."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme == "file":
        path = urllib.request.url2pathname(parts.path)
        if os.path.isdir(path):
            return urllib.parse.urljoin(url if url.endswith("/") else url + "/", "index.html")
    return url


def _read_metadata(zf: zipfile.ZipFile, cand: Candidate) -> bytes:
    names = [n for n in zf.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")]
    if len(names) != 1:
        raise PlanError(
            f"wheel {cand.filename} from {cand.index} has {len(names)} .dist-info/METADATA files, expected 1"
        )
    return zf.read(names[0])


class _NoRanges(Exception):
    pass


class _RangeFile(io.RawIOBase):
    """A seekable read-only view of a remote file through HTTP Range requests: zipfile reads only the central
    directory and the METADATA member, a few KiB of a wheel that may weigh a GiB."""

    def __init__(self, fetcher: Fetcher, url: str, head):
        super().__init__()
        self.fetcher, self.url, self.pos = fetcher, url, 0
        if head.get("Accept-Ranges", "").lower() != "bytes" or not str(head.get("Content-Length", "")).isdigit():
            raise _NoRanges()
        self.size = int(head["Content-Length"])

    def seekable(self):
        return True

    def readable(self):
        return True

    def tell(self):
        return self.pos

    def seek(self, offset, whence=io.SEEK_SET):
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.size}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def read(self, size=-1):
        end = self.size if size is None or size < 0 else min(self.size, self.pos + size)
        if end <= self.pos:
            return b""
        with self.fetcher._open(self.url, {"Range": f"bytes={self.pos}-{end - 1}"}) as resp:
            if resp.status != 206:
                raise _NoRanges()
            data = resp.read()
        self.fetcher._count(nbytes=len(data))
        self.pos += len(data)
        return data

    def readinto(self, buffer):
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)
