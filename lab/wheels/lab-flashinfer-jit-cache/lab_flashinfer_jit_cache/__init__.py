# Copyright: (c) 2026, gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Lab stand-in companion package of lab-flashinfer-python."""

from __future__ import annotations

from lab_flashinfer_jit_cache._build_info import INFO, VERSION

__version__ = VERSION
cuda = INFO.get("cuda")
