# Copyright: (c) 2026, gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The privilege the run needs, judged first: which paths the user cannot write and the refusal that says so."""

from __future__ import annotations

import os

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _privilege as pv

EXISTING = {"/", "/var", "/var/lib", "/opt", "/opt/gpufleet", "/opt/gpufleet/serving", "/tmp"}
WRITABLE = {"/tmp", "/opt/gpufleet/serving"}


def exists(path):
    return path in EXISTING


def access(path, mode):
    assert mode == os.W_OK | os.X_OK
    return path in WRITABLE


def test_a_missing_path_is_judged_where_it_would_be_created():
    assert pv.nearest_existing("/var/lib/gpufleet/x", exists) == "/var/lib"
    assert pv.nearest_existing("/opt/gpufleet/serving", exists) == "/opt/gpufleet/serving"


def test_unwritable_lists_each_path_the_user_cannot_write_or_create_and_skips_empty_ones():
    paths = {"state folder": "/var/lib/gpufleet", "serving root": "/opt/gpufleet/serving", "textfile": ""}
    assert pv.unwritable(paths, access, exists) == [
        {"label": "state folder", "path": "/var/lib/gpufleet", "denied_at": "/var/lib"}
    ]


def test_refusal_names_user_become_paths_and_fix():
    denied = [{"label": "state folder (gpufleet_state_dir)", "path": "/var/lib/gpufleet", "denied_at": "/var/lib"}]
    msg = pv.refusal("node1", "alice", 1001, False, denied)
    assert msg == (
        "node1: the run connects as user alice (uid 1001) without become (ansible_become is off) and cannot write "
        "state folder (gpufleet_state_dir) /var/lib/gpufleet (cannot create it under /var/lib): permission denied. "
        "Fix: set ansible_become: true for this host (the run must write these paths as root), or give alice write "
        "access to them. Nothing was changed."
    )
    assert pv.refusal("node1", "root", 0, True, []) == ""
    assert "become" not in pv.refusal("n", "bob", 5, None, denied).split("cannot write", maxsplit=1)[0]
