# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Lab stand-in for an SGLang server.

It answers SGLang's HTTP API (``/health``, ``/get_server_info``, ``/generate``, ``/v1/completions``,
``/v1/chat/completions``) with token timing and speculative acceptance that are computed, not
measured, so a benchmark against it has known expected values.
"""

from __future__ import annotations

from lab_sglang.stack import own_version

__version__ = own_version()
