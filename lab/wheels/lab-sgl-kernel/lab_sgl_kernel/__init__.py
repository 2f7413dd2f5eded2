# Copyright: (c) 2026, gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Lab stand-in for sgl-kernel.

The real kernel wheels are compiled against one torch release; importing them under another fails
(undefined symbols). This stand-in raises ImportError the same way when lab_torch is not the pinned release.
"""

from __future__ import annotations

import lab_torch

from lab_sgl_kernel._build_info import INFO, VERSION

__version__ = VERSION
cuda = INFO.get("cuda")

_torch_release = lab_torch.__version__.split("+", 1)[0]
if _torch_release != INFO["torch"]:
    raise ImportError(
        f"lab_sgl_kernel {VERSION} was built against lab-torch {INFO['torch']}, found {lab_torch.__version__}"
    )
