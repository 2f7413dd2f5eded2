# Copyright: (c) 2026, gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Mirrors torch.version: `cuda` is the CUDA release the build targets."""

from __future__ import annotations

from lab_torch._build_info import INFO, VERSION

__version__ = VERSION
cuda = INFO.get("cuda")
