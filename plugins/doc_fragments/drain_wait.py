# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations


class ModuleDocFragment:
    # The bounded wait of the drain modules (drain_haproxy, drain_slurm); the argument spec is
    # plugins/module_utils/_drain.py WAIT_ARGS.
    DOCUMENTATION = r"""
options:
  wait:
    description:
      - Wait after the change, until the host is idle (a drain) or back in service (where the provider can tell).
      - Without the wait the module returns once the load balancer or scheduler took the command.
    type: bool
    default: true
  timeout_s:
    description:
      - Seconds to wait at most. A wait that runs out fails with the host, what was still running and the fix.
    type: float
    default: 600
  interval_s:
    description: Seconds between two looks at the host's state.
    type: float
    default: 1.0
"""
