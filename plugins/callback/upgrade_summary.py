# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
name: upgrade_summary
type: aggregate
short_description: Per-host summary of a gpufleet upgrade or rollback run
version_added: 0.1.0
description:
  - Collects the C(gpufleet_upgrade_report) fact that C(playbooks/upgrade.yml) and C(playbooks/rollback.yml) publish for
    every host and prints, after the play recap, one block per host with the outcome ("upgraded",
    "rolled back, <reason>", "failed preflight, <reason>") and what each phase did, then the totals per outcome
    kind (the report's C(outcome_kind); a report without one counts as unknown).
  - Also prints hosts that became unreachable before they could report.
  - Enable it with C(callbacks_enabled = gpufleet.upgrade.upgrade_summary) in ansible.cfg.
requirements:
  - enable in configuration
options:
  summary_file:
    description: Also write the summary as JSON to this file.
    type: path
    env:
      - name: GPUFLEET_SUMMARY_FILE
    ini:
      - section: gpufleet
        key: summary_file
"""

import json  # noqa: E402

from ansible.plugins.callback import CallbackBase  # noqa: E402

from ansible_collections.gpufleet.upgrade.plugins.plugin_utils._outcome import REPORT_ORDER, report_kind  # noqa: E402


def render(reports, unreachable=()):
    """Text block of the summary: one line per host, then its phases in run order."""
    if not reports and not unreachable:
        return ""
    lines = ["", "GPUFLEET SUMMARY " + "*" * 63]
    for host in sorted(reports):
        report = reports[host]
        lines.append(f"{host}: {report.get('outcome', 'unknown')}")
        phases = report.get("phases") or {}
        for name in sorted(
            phases, key=lambda n: (REPORT_ORDER.index(n) if n in REPORT_ORDER else len(REPORT_ORDER), n)
        ):
            lines.append(f"    {name:<13} {phases[name]}")
    for host in sorted(set(unreachable) - set(reports)):
        lines.append(f"{host}: unreachable: no report")
    counts = {}
    for report in reports.values():
        # The report's kind, set by the same code that wrote its text (plugins/plugin_utils/_outcome.py).
        key = report_kind(report).label
        counts[key] = counts.get(key, 0) + 1
    lines.append("totals: " + ", ".join(f"{key} {value}" for key, value in sorted(counts.items())))
    return "\n".join(lines)


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "gpufleet.upgrade.upgrade_summary"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, display=None, options=None):
        super().__init__(display=display, options=options)
        self.reports = {}
        self.unreachable = set()

    def v2_runner_on_ok(self, result):
        report = (result._result.get("ansible_facts") or {}).get("gpufleet_upgrade_report")
        if isinstance(report, dict):
            self.reports[result._host.get_name()] = report

    def v2_runner_on_unreachable(self, result):
        self.unreachable.add(result._host.get_name())

    def v2_playbook_on_stats(self, stats):
        text = render(self.reports, self.unreachable)
        if text:
            self._display.display(text)
        path = self.get_option("summary_file")
        if path:
            with open(path, "w", encoding="utf-8") as handle:
                json.dump({"hosts": self.reports, "unreachable": sorted(self.unreachable)}, handle, indent=2)
