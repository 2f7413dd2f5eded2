# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The collection's own version, as the code that runs on hosts and on the controller knows it.

A module reaching a host carries its module_utils but not galaxy.yml, and an installed collection need not keep
MANIFEST.json beside the code that imports this: the version is a constant here, and
tests/unit/plugins/module_utils/test_version.py fails when it is not galaxy.yml's. The state file records it, so a
run that another version started is never resumed or rolled back without a word (module_utils/_state.py).
"""

from __future__ import annotations

COLLECTION = "gpufleet.upgrade"
COLLECTION_VERSION = "0.2.0"
