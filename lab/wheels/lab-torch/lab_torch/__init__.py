# Copyright: (c) 2026, gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Lab stand-in for torch: only the build facts the upgrade checks (version, CUDA, arch list)."""

from __future__ import annotations

from lab_torch import version
from lab_torch._build_info import INFO, VERSION

__version__ = VERSION


class cuda:
    @staticmethod
    def is_available() -> bool:
        return False

    @staticmethod
    def get_arch_list() -> list[str]:
        return list(INFO.get("arch_list", []))


__all__ = ["__version__", "cuda", "version"]
