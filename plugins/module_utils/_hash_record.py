# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""sha256 of files, and a record of them that spares reading a large file again while it is unchanged."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile

from ansible_collections.gpufleet.upgrade.plugins.module_utils._toolkit import stat_signature


def file_sha256(path: str, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(chunk), b""):
            digest.update(block)
    return digest.hexdigest()


class _Record:
    """A JSON table in ``<folder>/<NAME>``, read once (an unreadable file is an empty table), written atomically."""

    NAME = ""

    def __init__(self, folder: str):
        self.folder = folder
        self.path = os.path.join(folder, self.NAME)
        self._changed = False
        try:
            with open(self.path, encoding="utf-8") as handle:
                table = json.load(handle)
            self._table = {str(k): v for k, v in table.items() if self._valid(v)}
        except (OSError, ValueError, AttributeError):
            self._table = {}

    @staticmethod
    def _valid(entry) -> bool:
        return True

    def _kept(self) -> dict:
        return self._table

    def save(self) -> None:
        """Write the record if it changed (atomically)."""
        if not self._changed:
            return
        table = self._kept()
        os.makedirs(self.folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=".record-")
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(table, handle, sort_keys=True, indent=1)
        os.replace(tmp, self.path)
        self._changed = False


class HashRecord(_Record):
    """The sha256 of a folder's files as they were when hashed, kept in ``<folder>/.gpufleet-sha256.json`` by file
    name with the file's stat signature (``_toolkit.stat_signature``: size, mtime, ctime and inode, as the install
    marker of a toolkit keeps it): a file whose signature did not move is not read again, so a plan or an audit does
    not hash the controller's multi-GB wheelhouse or redist cache on every run. Size and mtime alone are no key: a
    copy keeps them (``cp -p``, ``rsync -a``, ``touch -r``), so other bytes put in place with them would pass as the
    file hashed. The ctime is set by the kernel on every write, rename or ``utime`` and no call sets it back, and a
    file put in place is another inode: a file replaced or put back is hashed anew. The hosts keep the same record of
    their wheelhouse (``_venv_host.py``) and check every file against the lock's (or the manifest's) sha256 as it
    streams to them; uv checks wheels again when it installs."""

    NAME = ".gpufleet-sha256.json"

    @staticmethod
    def _valid(entry) -> bool:
        # Records of the old shape ([size, mtime_ns, sha256]) are dropped: each such file is hashed once more.
        return isinstance(entry, list) and len(entry) == 5 and isinstance(entry[4], str)

    def _stamp(self, name: str) -> list:
        return stat_signature(os.path.join(self.folder, name))

    def recorded(self, name: str) -> str | None:
        """The recorded sha256 of a file whose signature did not move since it was hashed; None otherwise (a file
        not recorded, changed, or gone). Reads no file."""
        entry = self._table.get(name)
        try:
            return entry[4] if entry and entry[:4] == self._stamp(name) else None
        except OSError:
            return None

    def sha256(self, name: str) -> str:
        """The file's sha256: recorded if the file is unchanged since, else hashed now (and recorded)."""
        known = self.recorded(name)
        if known is not None:
            return known
        stamp = self._stamp(name)
        digest = file_sha256(os.path.join(self.folder, name))
        # A file written while it was read has another signature now: recorded under the one it had before, it is
        # hashed again next time instead of trusted with a hash of bytes it no longer holds.
        self._table[name] = [*stamp, digest]
        self._changed = True
        return digest

    def note(self, name: str, digest: str) -> None:
        """Record the sha256 of a file just written and checked (a download verified while it streamed)."""
        self._table[name] = [*self._stamp(name), digest]
        self._changed = True

    def _kept(self) -> dict:
        # Files that are gone are dropped.
        return {n: e for n, e in self._table.items() if os.path.exists(os.path.join(self.folder, n))}


class UrlHashRecord(_Record):
    """The sha256 the controller computed for files an index lists without one, kept in ``<folder>/url-sha256.json``
    by URL with what the index served the file with (size, ETag, Last-Modified): a later plan, check mode included,
    takes the recorded hash instead of downloading the file again while the index serves the file with the same
    size, ETag and Last-Modified (at least one of them given). A file served otherwise is downloaded and hashed anew.
    The download into the wheelhouse checks the file against the locked hash in any case."""

    NAME = "url-sha256.json"
    STAMP_KEYS = ("size", "etag", "last_modified")

    @staticmethod
    def _valid(entry) -> bool:
        return isinstance(entry, dict) and bool(entry.get("sha256"))

    @classmethod
    def usable(cls, stamp: dict) -> bool:
        return any(stamp.get(k) for k in cls.STAMP_KEYS)

    def get(self, url: str, stamp: dict) -> str | None:
        """The recorded sha256 of ``url`` when the index serves it as it did then, else None."""
        entry = self._table.get(url)
        if not entry or not self.usable(stamp):
            return None
        if any(str(entry.get(k) or "") != str(stamp.get(k) or "") for k in self.STAMP_KEYS):
            return None
        return entry["sha256"]

    def put(self, url: str, stamp: dict, digest: str) -> None:
        """Record the sha256 computed for ``url`` as served with ``stamp`` (not kept when the index gave no stamp)."""
        if not self.usable(stamp):
            return
        self._table[url] = {**{k: stamp.get(k) for k in self.STAMP_KEYS}, "sha256": digest}
        self._changed = True


class MetadataRecord(_Record):
    """The Name and Version a wheel's METADATA gives, kept in ``<folder>/.gpufleet-metadata.json`` by the wheel's
    sha256: the same bytes always say the same, so a wheel is opened once, not on every audit (a zip's central
    directory of 13,000 members takes tens of milliseconds to read). The sha256 comes from ``HashRecord``."""

    NAME = ".gpufleet-metadata.json"

    @staticmethod
    def _valid(entry) -> bool:
        return isinstance(entry, list) and len(entry) == 2

    def get(self, sha256: str) -> list | None:
        return self._table.get(sha256)

    def put(self, sha256: str, name_version: list) -> None:
        self._table[sha256] = list(name_version)
        self._changed = True
