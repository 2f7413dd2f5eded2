# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
name: merged_report
short_description: One fleet report from the reports of a sliced run (AWX job slicing, several --limit runs)
version_added: 0.2.0
description:
  - Reads the C(report.json) of each slice's run (C(<controller_dir>/runs/<run id>/report.json), written by the
    callback C(gpufleet.upgrade.upgrade_summary)) and returns the fleet's report merged from them, with its
    renderings C(report.json), C(report.md), C(report.html) and C(junit.xml) for the caller to write
    (C(playbooks/merge_reports.yml) does).
  - A host in two slices is an error naming the host and both runs; so are slices of another kind (an audit beside
    an upgrade) or another profile.
  - The merged run id is C(merged-) and a hash of the slices' run ids, and the report is dated by its newest slice, so
    the same slices give the same files.
  - Reads local files only; changes nothing.
options:
  _terms:
    description: The slices' runs, each a run id, a run folder or the path of a C(report.json).
    type: list
    elements: str
    required: true
  controller_dir:
    description: The controller folder (C(gpufleet_controller_dir)) under whose C(runs/) a run id is found.
    type: path
    required: false
author:
  - gpufleet maintainers (@gpufleet)
"""

EXAMPLES = r"""
- name: Merge two slices' reports
  ansible.builtin.set_fact:
    merged: "{{ lookup('gpufleet.upgrade.merged_report', '20261207T031500Z-12345', '20261207T031501Z-67890',
                       controller_dir=gpufleet_controller_dir) }}"
"""

RETURN = r"""
_raw:
  description: One dict, the merged report.
  type: list
  elements: dict
  contains:
    run_id:
      description: The merged report's run id, C(merged-<hash12>).
      type: str
    report:
      description: The merged report.json document; C(slices) lists each slice's run id, report path, hosts and totals.
      type: dict
    files:
      description: File name -> content of C(report.json), C(report.md), C(report.html), C(junit.xml).
      type: dict
"""

from ansible.errors import AnsibleLookupError  # noqa: E402
from ansible.plugins.lookup import LookupBase  # noqa: E402

from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _fleet_report, _merge_reports  # noqa: E402


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        # lookup('...', gpufleet_merge_runs) passes the list as one term.
        refs = [str(t) for term in terms for t in (term if isinstance(term, (list, tuple)) else [term])]
        try:
            doc = _merge_reports.merge_runs(refs, kwargs.get("controller_dir"))
        except _merge_reports.MergeError as exc:
            raise AnsibleLookupError(f"gpufleet.upgrade.merged_report: {exc}") from exc
        return [{"run_id": doc["run_id"], "report": doc, "files": _fleet_report.render(doc)}]
