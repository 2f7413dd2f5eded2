# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters over the fleet report (plugins/plugin_utils/_fleet_report.py); each is documented in <name>.yml."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _fleet_report


def fleet_textfile(report, postcheck_result=None, now=None):
    host = report.get("host", "?") if isinstance(report, dict) else "?"
    try:
        record = _fleet_report.host_record(host, report, {"postcheck_result": postcheck_result or {}})
    except _fleet_report.ReportError as exc:
        raise AnsibleFilterError(f"gpufleet.upgrade.fleet_textfile: {exc}") from exc
    return _fleet_report.textfile(record, now)


class FilterModule:
    def filters(self):
        return {"fleet_textfile": fleet_textfile}
