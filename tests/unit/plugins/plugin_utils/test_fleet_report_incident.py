# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A failed host's incident bundle (playbooks/tasks/incident.yml notes it as phase 'incident bundle') is named in
report.json and linked, relative to the run's folder, from report.html."""

from __future__ import annotations

from html.parser import HTMLParser

from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _fleet_report as fr
from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _outcome

PHASES = {"postcheck": "failed: Xid 79", "rollback": "rolled back to backup b1", "incident bundle": "bundles/n2.tar.gz"}


class Links(HTMLParser):
    def __init__(self):
        super().__init__()
        self.hrefs = []

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            self.hrefs.append(dict(attrs)["href"])


def doc():
    failed = _outcome.outcome("rolled_back", "postcheck: Xid 79")
    report = _outcome.host_report(failed, "n2", "r1", "cu130", "b1", PHASES)
    ok = _outcome.host_report(_outcome.outcome("upgraded", ""), "n1", "r1", "cu130")
    return fr.fleet([fr.host_record("n2", report), fr.host_record("n1", ok)], generated=0)


def test_report_json_names_the_bundle_and_html_links_it():
    d = doc()
    (n2,) = [r for r in d["hosts"] if r["host"] == "n2"]
    assert {"name": "incident bundle", "note": "bundles/n2.tar.gz"}.items() <= next(
        p for p in n2["phases"] if p["name"] == "incident bundle"
    ).items()
    page = Links()
    page.feed(fr.to_html(d))
    assert page.hrefs == ["bundles/n2.tar.gz"]  # n1 did not fail: no bundle, no link
