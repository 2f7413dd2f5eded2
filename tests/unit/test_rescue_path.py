# Copyright: (c) 2026, gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The way back needs nothing optional: the rollback and the upgrade's failure handling use ansible.builtin and this
collection only, so a collection installed from its tarball alone can always roll a host back (a declared dependency
may still be missing or broken on a controller; the rescue path must not care)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
ALLOWED = ("ansible.builtin.", "gpufleet.upgrade.")
# The files the automatic rollback and rollback.yml run: the rollback role, the failure handling, the serving
# role's restart and undrain paths, the backup role's description of the host (read by the rollback's check).
RESCUE = (
    "playbooks/rollback.yml",
    "playbooks/tasks/host_failed.yml",
    "playbooks/tasks/host_report.yml",
    "roles/rollback/tasks/*.yml",
    "roles/serving/tasks/restart*.yml",
    "roles/serving/tasks/undrain*.yml",
    "roles/serving/tasks/wait.yml",
    "roles/backup/tasks/snapshot.yml",
)
NAME = r"[a-z_][a-z0-9_]*"
FQCN = re.compile(rf"^{NAME}\.{NAME}\.{NAME}$")
# A filter (`| ns.coll.f`), a test (`is ns.coll.t`) or a lookup (`lookup('ns.coll.l'`) in Jinja.
JINJA_USE = re.compile(rf"(?:\|\s*|\bis\s+(?:not\s+)?|\blookup\(\s*['\"])({NAME}\.{NAME}\.{NAME})\b")
ROLE_KEYS = ("ansible.builtin.include_role", "ansible.builtin.import_role")


def _files():
    return sorted({p for pattern in RESCUE for p in REPO.glob(pattern)})


def _names(node):
    """Every FQCN a task file names: modules (task keys), roles, and filters, tests and lookups in Jinja."""
    if isinstance(node, dict):
        for key, value in node.items():
            if isinstance(key, str) and FQCN.match(key):
                yield key
            if key in ROLE_KEYS and isinstance(value, dict) and FQCN.match(str(value.get("name", ""))):
                yield value["name"]
            yield from _names(value)
    elif isinstance(node, list):
        for value in node:
            yield from _names(value)
    elif isinstance(node, str):
        yield from JINJA_USE.findall(node)


def test_the_rescue_path_files_exist():
    assert len(_files()) >= 10, _files()


@pytest.mark.parametrize("path", _files(), ids=lambda p: str(p.relative_to(REPO)))
def test_the_rescue_path_uses_only_ansible_builtin_and_this_collection(path):
    used = sorted({name for name in _names(yaml.safe_load(path.read_text())) if not name.startswith(ALLOWED)})
    assert used == [], f"{path.relative_to(REPO)} needs {used}: the way back must not depend on another collection"
