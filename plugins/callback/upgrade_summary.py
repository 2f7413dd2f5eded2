# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
name: upgrade_summary
type: aggregate
short_description: Progress, per-host summary and fleet report of a gpufleet upgrade, audit or rollback run
version_added: 0.1.0
description:
  - Collects the C(gpufleet_upgrade_report) fact that C(playbooks/upgrade.yml) and C(playbooks/rollback.yml) publish for
    every host and prints, after the play recap, one block per host with the outcome ("upgraded",
    "rolled back, <reason>", "failed preflight, <reason>") and what each phase did, then the totals per outcome
    kind (the report's C(outcome_kind); a report without one counts as unknown).
  - Also prints hosts that became unreachable before they could report.
  - While the run goes, prints each batch as it starts (batch k of n and its hosts) and each host as it reports, with
    the batch's hosts done and failed.
  - Writes each host's report, as soon as the host publishes it, to C(<host>.json) in the run's folder (fact
    C(gpufleet_run_dir)), the controller's record of the run, kept without a task per host.
  - At the end writes the fleet report into the run's folder - C(report.json),
    C(report.md), C(report.html), C(junit.xml) (C(plugins/plugin_utils/_fleet_report.py)) - and prints its path.
    Phase durations and downtime come from what it saw during the run, so the report exists only where this
    callback is enabled. For C(playbooks/audit.yml) the callback builds each host's audit report itself, from the
    audit's run (fact C(gpufleet_audit_run), published once) and the host model's verdict (C(assess_result)), so
    the audit has no task per host for its report.
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

import itertools  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402

from ansible.plugins.callback import CallbackBase  # noqa: E402

from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _batches, _fleet_report  # noqa: E402
from ansible_collections.gpufleet.upgrade.plugins.plugin_utils._outcome import REPORT_ORDER, report_kind  # noqa: E402

# The facts the fleet report is built from (docs/design.md lists each): the host's report of an upgrade or rollback;
# for an audit, the run audit.yml publishes once ({run_id, dir}) and each host's verdict of the host model.
REPORT_FACT = "gpufleet_upgrade_report"
AUDIT_RUN_FACT = "gpufleet_audit_run"
VERDICT_FACT = "assess_result"
ROLE_FACTS = ("preflight_report", "assess_result", "postcheck_baseline", "postcheck_result")
RUN_DIR_FACT = "gpufleet_run_dir"
# The phase the upgrade is in (playbooks/tasks/phase.yml publishes it): {name, completed}; its changes time the phases.
PHASE_FACT = "gpufleet_phase"
SYSTEMD_ACTIONS = ("ansible.builtin.systemd_service", "ansible.builtin.systemd", "systemd_service", "systemd")
# The register of role serving's /health wait (roles/serving/tasks/wait.yml): the task that answers ends the downtime.
# A private name read from outside its role, the one docs/design.md allows ("Facts roles publish"): the callback knows
# the task by it as the task runs, and no fact is published there, since the wait's result is of use to no task.
HEALTH_WAIT_REGISTER = "__serving_health"


def render_audit(published):
    """Text block of an audit: one line per host, its verdict ("in sync with <profile>" or its drift items)."""
    audits = {h: r for h, r in published.items() if isinstance(r, dict) and "in_sync" in r and "drift" in r}
    if not audits:
        return ""
    lines = ["", "GPUFLEET AUDIT " + "*" * 65]
    for host in sorted(audits):
        report = audits[host]
        drift = "drift: " + "; ".join(report["drift"])
        verdict = f"in sync with {report.get('profile')}" if report["in_sync"] else drift
        lines.append(f"{host}: {verdict}")
    drifted = sum(1 for r in audits.values() if not r["in_sync"])
    lines.append(f"{len(audits)} host(s) audited, {drifted} drifted")
    return "\n".join(lines)


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


def batch_sizes(serial, count):
    """Sizes of the batches Ansible cuts ``count`` hosts into for a play's ``serial`` (its own algorithm)."""
    return _batches.sizes(serial, count)


def _role_of(task):
    role = getattr(task, "_role", None)
    return role.get_name().split(".")[-1] if role is not None else ""


def serving_event(task, result):
    """'down' when role serving stopped or restarted the unit, 'up' when its /health wait answered, else None."""
    if _role_of(task) != "serving":
        return None
    # The state asked for: systemd_service returns state 'started' after a restart, which was downtime all the same.
    asked = (task.args or {}).get("state") or result.get("state")
    if task.action in SYSTEMD_ACTIONS and result.get("changed") and asked in ("stopped", "restarted"):
        return "down"
    if getattr(task, "register", None) == HEALTH_WAIT_REGISTER:
        return "up"
    return None


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "gpufleet.upgrade.upgrade_summary"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, display=None, options=None, clock=time.time):
        super().__init__(display=display, options=options)
        self.clock = clock
        self.reports = {}  # host -> gpufleet_upgrade_report (the summary)
        self.published = {}  # host -> the report of either kind (the fleet report)
        self.facts = {}  # host -> {role fact: value}
        self.timelines = {}  # host -> [(t, event, name)]
        self.run_dirs = {}  # host -> its run's folder on the controller
        self.audit_run = None  # audit.yml's run ({run_id, dir}), once published
        self.profiles = {}  # host -> the name of the stack profile loaded for it (role stack)
        self.unreachable = set()
        self.started = {}  # (host, task uuid) -> when the task started on the host
        self.batch = None  # {"play", "k", "n", "hosts"} of the serial play's batch in flight
        self.report_paths = []

    def _event(self, host, what, name=""):
        self.timelines.setdefault(host, []).append((self.clock(), what, name))

    # --- progress per batch -----------------------------------------------------------------------------------

    def v2_playbook_on_play_start(self, play):
        if not play.serial:
            self.batch = None
            return
        inventory = play.get_variable_manager()._inventory
        batch = [h.get_name() for h in inventory.get_hosts(play.hosts)]
        everyone = [h.get_name() for h in inventory.get_hosts(play.hosts, ignore_restrictions=True)]
        sizes = batch_sizes(play.serial, len(everyone))
        # Which batch this is, from where its first host stands among the play's hosts (in batch order).
        first = everyone.index(batch[0]) if batch and batch[0] in everyone else 0
        k = 1 + sum(1 for end in itertools.accumulate(sizes) if end <= first)
        n = len(sizes)
        # The hosts of the batches after this one: "0 to go" alone read as the run's end with batch 2 still to come.
        later = sum(sizes[k:])
        self.batch = {"play": play._uuid, "k": k, "n": n, "hosts": batch, "later": later}
        self._display.display(f"gpufleet: batch {k} of {n}: {', '.join(batch)} ({len(batch)} host(s))")

    def _progress(self, host, report):
        line = f"gpufleet: {host}: {report.get('outcome', 'unknown')}"
        if self.batch and host in self.batch["hosts"]:
            kinds = [report_kind(self.reports[h]) for h in self.batch["hosts"] if h in self.reports]
            done = sum(1 for kind in kinds if kind.ok)
            failed = sum(1 for kind in kinds if kind.counts_as_failure)
            later, left = self.batch["later"], self.batch["n"] - self.batch["k"]
            then = f"; {later} host(s) in {left} batch(es) to come" if later else ""
            line += (
                f" (batch {self.batch['k']} of {self.batch['n']}: {done} done, {failed} failed,"
                f" {len(self.batch['hosts']) - len(kinds)} to go in this batch{then})"
            )
        self._display.display(line)

    # --- what the hosts publish and when ----------------------------------------------------------------------

    def v2_runner_on_start(self, host, task):
        self.started[(host.get_name(), task._uuid)] = self.clock()

    def v2_runner_on_ok(self, result):
        host = result._host.get_name()
        facts = result._result.get("ansible_facts") or {}
        phase = facts.get(PHASE_FACT)
        if isinstance(phase, dict) and phase.get("name"):
            self._event(host, "phase_end" if phase.get("completed") else "phase_start", str(phase["name"]))
        for name in ROLE_FACTS:
            if name in facts:
                self.facts.setdefault(host, {})[name] = facts[name]
        if facts.get(RUN_DIR_FACT):
            self.run_dirs[host] = str(facts[RUN_DIR_FACT])
        since = self.started.pop((host, result._task._uuid), None)
        serving = serving_event(result._task, result._result)
        if serving:
            # The unit went down when the task that stopped it started; it was back when the wait answered.
            when = since if serving == "down" and since is not None else self.clock()
            self.timelines.setdefault(host, []).append((when, serving, result._task.get_name()))
        if isinstance(facts.get("gpufleet_stack"), dict):
            self.profiles[host] = facts["gpufleet_stack"].get("name")
        if isinstance(facts.get(AUDIT_RUN_FACT), dict):
            self.audit_run = facts[AUDIT_RUN_FACT]
        if self.audit_run and VERDICT_FACT in facts:
            self.run_dirs[host] = str(self.audit_run.get("dir") or "")
            self._publish(host, self._audit_report(host, facts[VERDICT_FACT]))
        report = facts.get(REPORT_FACT)
        if isinstance(report, dict):
            self._publish(host, report)
            self.reports[host] = report
            self._progress(host, report)

    def _audit_report(self, host, verdict):
        try:
            return _fleet_report.audit_report(host, verdict, self.audit_run, self.profiles.get(host))
        except _fleet_report.ReportError as exc:
            self._display.warning(f"gpufleet: {exc}")
            return None

    def _publish(self, host, report):
        if report is None:
            return
        self.published[host] = report
        self._event(host, "report")
        self._keep_host_report(host, report)

    def _keep_host_report(self, host, report):
        """The host's report in the run's folder as soon as it is published (the controller's record, not a task)."""
        folder = self.run_dirs.get(host)
        if not folder:
            return
        try:
            _fleet_report.write_host(folder, host, report)
        except OSError as exc:
            self._display.warning(f"gpufleet: {host}'s report could not be written to {folder}: {exc}")

    def v2_runner_on_failed(self, result, ignore_errors=False):
        if not ignore_errors:
            self._event(result._host.get_name(), "failed", result._task.get_name())

    def v2_runner_on_unreachable(self, result):
        self.unreachable.add(result._host.get_name())
        self._event(result._host.get_name(), "failed", result._task.get_name())

    # --- the end ----------------------------------------------------------------------------------------------

    def write_reports(self):
        """The fleet report of each run folder the hosts named; returns the paths written."""
        folders = {}
        for host, folder in self.run_dirs.items():
            folders.setdefault(folder, []).append(host)
        # A host that never reported (unreachable) belongs to the run all the same.
        if len(folders) == 1:
            only = next(iter(folders))
            folders[only] = sorted(set(folders[only]) | (self.unreachable - set(self.published)))
        written = []
        for folder, hosts in folders.items():
            try:
                records = [
                    _fleet_report.host_record(h, self.published.get(h), self.facts.get(h), self.timelines.get(h))
                    for h in sorted(hosts)
                ]
                written += _fleet_report.write(folder, _fleet_report.fleet(records))
            except (OSError, _fleet_report.ReportError) as exc:
                self._display.warning(f"gpufleet: the fleet report could not be written to {folder}: {exc}")
        return written

    def v2_playbook_on_stats(self, stats):
        for text in (render(self.reports, self.unreachable), render_audit(self.published)):
            if text:
                self._display.display(text)
        path = self.get_option("summary_file")
        if path:
            with open(path, "w", encoding="utf-8") as handle:
                json.dump({"hosts": self.reports, "unreachable": sorted(self.unreachable)}, handle, indent=2)
        self.report_paths = self.write_reports()
        for html in (p for p in self.report_paths if p.endswith("report.html")):
            folder = html.rsplit("/", 1)[0]
            self._display.display(f"gpufleet report: {html} (also report.json, report.md, junit.xml in {folder})")
