# Copyright: (c) 2026, gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The lab: podman hosts with systemd and sshd, loopback mirrors and lab-built wheels.

Not shipped in the collection; ``python -m lab --help`` from the repository root.
"""

from __future__ import annotations
