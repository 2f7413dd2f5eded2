# Copyright: (c) 2026, gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Lab stand-in for flashinfer-python.

Like flashinfer/jit/env.py, importing checks the companion packages: the cubin package must carry the
same version and the JIT cache a version starting with it, else RuntimeError (a mismatched trio is a
broken venv). FLASHINFER_DISABLE_VERSION_CHECK=1 bypasses the check, as upstream.
"""

from __future__ import annotations

import os

from lab_flashinfer._build_info import VERSION

__version__ = VERSION


def _check_trio() -> None:
    if os.environ.get("FLASHINFER_DISABLE_VERSION_CHECK") == "1":
        return
    try:
        import lab_flashinfer_cubin
    except ImportError:
        pass
    else:
        if lab_flashinfer_cubin.__version__ != __version__:
            raise RuntimeError(
                f"lab-flashinfer-cubin version ({lab_flashinfer_cubin.__version__}) does not match "
                f"lab-flashinfer version ({__version__}). Please install the same version of both packages. "
                "Set FLASHINFER_DISABLE_VERSION_CHECK=1 to bypass this check."
            )
    try:
        import lab_flashinfer_jit_cache
    except ImportError:
        pass
    else:
        if not lab_flashinfer_jit_cache.__version__.startswith(__version__):
            raise RuntimeError(
                f"lab-flashinfer-jit-cache version ({lab_flashinfer_jit_cache.__version__}) does not match "
                f"lab-flashinfer version ({__version__}). Please install the same version of both packages. "
                "Set FLASHINFER_DISABLE_VERSION_CHECK=1 to bypass this check."
            )


_check_trio()
