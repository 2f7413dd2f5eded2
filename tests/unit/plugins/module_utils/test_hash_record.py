# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The record of a folder's sha256 (controller: HashRecord; hosts: _venv_host's wheelhouse record) trusts a file only
while nothing was written to it: a copy that keeps size and mtime (cp -p, touch -r) is hashed anew."""

from __future__ import annotations

import hashlib
import json
import os
import shutil

import pytest

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _hash_record as hr
from ansible_collections.gpufleet.upgrade.plugins.module_utils import _venv_host as vh

GOOD = b"the wheel plan.yml locked " * 40
EVIL = b"other bytes, the same size" * 40


def sha(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


@pytest.fixture
def counted(monkeypatch):
    """The files HashRecord reads to hash them."""
    read = []
    real = hr.file_sha256
    monkeypatch.setattr(hr, "file_sha256", lambda path, *a: read.append(os.path.basename(path)) or real(path, *a))
    return read


def put_in_place(source, dest):
    """What cp -p does: other bytes at the same path, with the size and the mtime the file had."""
    stat = os.stat(dest)
    shutil.copy2(source, dest)
    os.utime(dest, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert os.stat(dest).st_size == stat.st_size and os.stat(dest).st_mtime_ns == stat.st_mtime_ns


def test_a_same_size_copy_with_the_mtime_put_back_is_hashed_anew(tmp_path, counted):
    assert len(GOOD) == len(EVIL)
    (tmp_path / "w.whl").write_bytes(GOOD)
    (tmp_path / "evil").write_bytes(EVIL)
    record = hr.HashRecord(str(tmp_path))
    assert record.sha256("w.whl") == sha(GOOD)
    record.save()
    put_in_place(tmp_path / "evil", tmp_path / "w.whl")
    assert hr.HashRecord(str(tmp_path)).sha256("w.whl") == sha(EVIL)
    assert counted == ["w.whl", "w.whl"]


def test_the_right_file_put_back_after_a_tampered_one_was_hashed_is_taken(tmp_path):
    (tmp_path / "w.whl").write_bytes(EVIL)
    (tmp_path / "kept").write_bytes(GOOD)
    record = hr.HashRecord(str(tmp_path))
    assert record.sha256("w.whl") == sha(EVIL)
    record.save()
    put_in_place(tmp_path / "kept", tmp_path / "w.whl")  # the fix the refusal gives: put the file back
    assert hr.HashRecord(str(tmp_path)).sha256("w.whl") == sha(GOOD)


def test_an_unchanged_file_is_not_read_again_and_recorded_reads_nothing(tmp_path, counted):
    (tmp_path / "w.whl").write_bytes(GOOD)
    record = hr.HashRecord(str(tmp_path))
    assert record.recorded("w.whl") is None and record.recorded("absent.whl") is None
    record.sha256("w.whl")
    record.save()
    again = hr.HashRecord(str(tmp_path))
    assert again.recorded("w.whl") == sha(GOOD) == again.sha256("w.whl")
    assert counted == ["w.whl"]


def test_a_record_of_the_old_shape_counts_as_none(tmp_path, counted):
    (tmp_path / "w.whl").write_bytes(EVIL)
    st = os.stat(tmp_path / "w.whl")
    # [size, mtime_ns, sha256] as records were written before: trusted, it would give the locked hash for other bytes.
    (tmp_path / hr.HashRecord.NAME).write_text(json.dumps({"w.whl": [st.st_size, st.st_mtime_ns, sha(GOOD)]}))
    assert hr.HashRecord(str(tmp_path)).sha256("w.whl") == sha(EVIL)
    assert counted == ["w.whl"]


def test_the_hosts_wheelhouse_record_forgets_a_file_put_in_place_with_its_size_and_mtime(tmp_path):
    (tmp_path / "w.whl").write_bytes(GOOD)
    (tmp_path / "evil").write_bytes(EVIL)
    vh.record_hashes(str(tmp_path), {"w.whl": sha(GOOD)})
    assert vh.recorded_hashes(str(tmp_path)) == {"w.whl": sha(GOOD)}
    put_in_place(tmp_path / "evil", tmp_path / "w.whl")
    assert vh.recorded_hashes(str(tmp_path)) == {}
    # A host's record of the old shape is no record either.
    st = os.stat(tmp_path / "w.whl")
    (tmp_path / vh.HASHES).write_text(json.dumps({"w.whl": [st.st_size, st.st_mtime_ns, sha(GOOD)]}))
    assert vh.recorded_hashes(str(tmp_path)) == {}
