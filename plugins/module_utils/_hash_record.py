# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""sha256 of files, and a record of them that spares reading a large file again while it is unchanged."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile


def file_sha256(path: str, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(chunk), b""):
            digest.update(block)
    return digest.hexdigest()


class HashRecord:
    """The sha256 of a folder's files as they were when hashed, kept in ``<folder>/.gpufleet-sha256.json`` by file
    name with size and mtime (the hosts keep the same record of their wheelhouse, roles/venv_rebuild/files/
    venv_host.py): a file that kept its size and mtime is not read again, so a plan or an audit does not hash the
    controller's multi-GB wheelhouse or redist cache on every run. A changed file is hashed anew. The hosts check
    every file against the lock's (or the manifest's) sha256 as it streams to them; uv checks wheels again when it
    installs."""

    NAME = ".gpufleet-sha256.json"

    def __init__(self, folder: str):
        self.folder = folder
        self.path = os.path.join(folder, self.NAME)
        self._changed = False
        try:
            with open(self.path, encoding="utf-8") as handle:
                table = json.load(handle)
            self._table = {str(k): list(v) for k, v in table.items() if isinstance(v, list) and len(v) == 3}
        except (OSError, ValueError, AttributeError):
            self._table = {}

    def _stamp(self, name: str) -> list:
        st = os.stat(os.path.join(self.folder, name))
        return [st.st_size, st.st_mtime_ns]

    def sha256(self, name: str) -> str:
        """The file's sha256: recorded if the file is unchanged since, else hashed now (and recorded)."""
        stamp = self._stamp(name)
        entry = self._table.get(name)
        if entry and entry[:2] == stamp:
            return entry[2]
        digest = file_sha256(os.path.join(self.folder, name))
        self._table[name] = [*stamp, digest]
        self._changed = True
        return digest

    def note(self, name: str, digest: str) -> None:
        """Record the sha256 of a file just written and checked (a download verified while it streamed)."""
        self._table[name] = [*self._stamp(name), digest]
        self._changed = True

    def save(self) -> None:
        """Write the record if it changed (atomically; files that are gone are dropped)."""
        if not self._changed:
            return
        table = {n: e for n, e in self._table.items() if os.path.exists(os.path.join(self.folder, n))}
        os.makedirs(self.folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=".sha256-")
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(table, handle, sort_keys=True)
        os.replace(tmp, self.path)
        self._changed = False
