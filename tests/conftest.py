"""Make the checkout importable as ansible_collections.gpufleet.upgrade for every test."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _collections_root() -> Path:
    root = REPO / ".venv" / "collections"
    link = root / "ansible_collections" / "gpufleet" / "upgrade"
    if link.resolve() == REPO:
        return root
    # A checkout without `make setup`: link the collection into a temporary tree instead.
    root = Path(tempfile.mkdtemp(prefix="gpufleet-collections-"))
    link = root / "ansible_collections" / "gpufleet" / "upgrade"
    link.parent.mkdir(parents=True)
    link.symlink_to(REPO)
    return root


COLLECTIONS_ROOT = _collections_root()
if str(COLLECTIONS_ROOT) not in sys.path:
    sys.path.insert(0, str(COLLECTIONS_ROOT))
