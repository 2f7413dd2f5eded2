# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The version the code knows at run time is the one galaxy.yml builds (module_utils/_version.py)."""

from __future__ import annotations

from pathlib import Path

import yaml

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _version

ROOT = Path(__file__).resolve().parents[4]


def test_the_runtime_version_is_galaxy_yml_s():
    galaxy = yaml.safe_load((ROOT / "galaxy.yml").read_text(encoding="utf-8"))
    assert (galaxy["namespace"], galaxy["name"]) == tuple(_version.COLLECTION.split("."))
    assert _version.COLLECTION_VERSION == galaxy["version"], (
        f"plugins/module_utils/_version.py says {_version.COLLECTION_VERSION}, galaxy.yml {galaxy['version']}: "
        "bump both together"
    )
