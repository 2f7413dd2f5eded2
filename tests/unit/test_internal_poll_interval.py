# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The strategy loop's poll interval: the collection's ansible.cfg and the operator guide's both set it, so a host's
wait (a drain, the model load, the /health wait) costs the controller nothing measurable (bench/idle_cost.py)."""

from __future__ import annotations

import configparser
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_collections_ansible_cfg_polls_every_50_ms():
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "ansible.cfg")
    assert cfg.getfloat("defaults", "internal_poll_interval") == 0.05


def test_the_operator_guides_ansible_cfg_sets_the_same():
    guide = (REPO / "docs" / "operator-guide.md").read_text()
    block = re.search(r"cat > ansible.cfg <<'EOF'\n(.*?)\nEOF", guide, re.S).group(1)
    cfg = configparser.ConfigParser()
    cfg.read_string(block)
    assert cfg.getfloat("defaults", "internal_poll_interval") == 0.05
