# Copyright: (c) 2026, gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Test helpers over the lab: run a playbook with ansible-runner and read its per-host, per-task results.

``tests/integration/conftest.py`` exposes these as fixtures; they can also be imported directly
(``from lab.harness import run_playbook``).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from lab.common import REPO

ANSIBLE_CFG = REPO / "ansible.cfg"
RESULT_EVENTS = {
    "runner_on_ok": "ok",
    "runner_on_failed": "failed",
    "runner_on_skipped": "skipped",
    "runner_on_unreachable": "unreachable",
}


@dataclass
class TaskResult:
    host: str
    task: str
    action: str
    status: str  # ok | failed | skipped | unreachable
    changed: bool
    failed: bool
    msg: str
    res: dict
    role: str = ""
    ignore_errors: bool = False


@dataclass
class PlaybookResult:
    rc: int
    status: str
    stats: dict[str, dict[str, int]]
    results: dict[str, list[TaskResult]]
    stdout: str = ""
    artifacts: str = ""
    events: list[dict] = field(default_factory=list, repr=False)

    def task(self, name: str, host: str | None = None) -> TaskResult:
        """The result of the task called ``name`` (exact, else the only one whose name contains it)."""
        found = self.tasks(name, host)
        if not found:
            seen = sorted({r.task for rs in self.results.values() for r in rs})
            raise KeyError(f"no result for task {name!r} (host {host}); tasks seen: {seen}")
        exact = [r for r in found if r.task == name or r.task.endswith(f" : {name}")]
        return (exact or found)[0]

    def tasks(self, name: str, host: str | None = None) -> list[TaskResult]:
        hosts = [host] if host else list(self.results)
        out = []
        for h in hosts:
            out += [r for r in self.results.get(h, []) if r.task == name or name in r.task]
        return out

    def audit_reports(self) -> dict[str, dict]:
        """audit.yml's report of each host, as the summary callback wrote it (``<host>.json`` in the audit's folder)."""
        run = self.task("Note the audit's run for the report").res["ansible_facts"]["gpufleet_audit_run"]
        folder = Path(run["dir"])
        return {p.stem: json.loads(p.read_text()) for p in sorted(folder.glob("*.json")) if p.name != "report.json"}

    def changed_tasks(self, host: str | None = None) -> list[TaskResult]:
        hosts = [host] if host else list(self.results)
        return [r for h in hosts for r in self.results.get(h, []) if r.changed]

    def __str__(self) -> str:  # shown by pytest when an assertion on the result fails
        return f"PlaybookResult(rc={self.rc}, status={self.status}, stats={self.stats})\n{self.stdout[-6000:]}"


def _stats(runner) -> dict[str, dict[str, int]]:
    raw = runner.stats or {}
    keys = {
        "ok": "ok",
        "changed": "changed",
        "failures": "failed",
        "rescued": "rescued",
        "skipped": "skipped",
        "dark": "unreachable",
        "ignored": "ignored",
    }
    hosts = {h for k in keys if raw.get(k) for h in raw[k]}
    return {h: {name: int(raw.get(k, {}).get(h, 0)) for k, name in keys.items()} for h in sorted(hosts)}


def _results(events: list[dict]) -> dict[str, list[TaskResult]]:
    out: dict[str, list[TaskResult]] = {}
    for ev in events:
        status = RESULT_EVENTS.get(ev.get("event", ""))
        if not status:
            continue
        data = ev.get("event_data", {})
        res = data.get("res") or {}
        out.setdefault(data.get("host", "?"), []).append(
            TaskResult(
                host=data.get("host", "?"),
                task=data.get("task", ""),
                action=data.get("task_action", ""),
                status=status,
                changed=bool(res.get("changed", False)),
                failed=status in ("failed", "unreachable"),
                msg=str(res.get("msg", "")),
                res=res,
                role=data.get("role", ""),
                ignore_errors=bool(data.get("ignore_errors")),
            )
        )
    return out


def run_playbook(
    playbook: str | os.PathLike,
    inventory: str | os.PathLike,
    extravars: dict | None = None,
    check: bool = False,
    diff: bool = False,
    tags: str | list[str] | None = None,
    limit: str | None = None,
    verbosity: int = 0,
    envvars: dict[str, str] | None = None,
    keep_artifacts: bool = False,
    timeout: int | None = None,
) -> PlaybookResult:
    """Run a playbook through ansible-runner with the repo's ansible.cfg; never raises on playbook failure."""
    import ansible_runner

    playbook = Path(playbook)
    if not playbook.is_absolute():
        playbook = REPO / playbook
    cmdline = " ".join(f for f, on in (("--check", check), ("--diff", diff)) if on)
    env = {
        "ANSIBLE_CONFIG": str(ANSIBLE_CFG),
        "PATH": f"{REPO / '.venv' / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
        "ANSIBLE_NOCOLOR": "1",
        **(envvars or {}),
    }
    tmp = tempfile.mkdtemp(prefix="gpufleet-runner-")
    try:
        runner = ansible_runner.run(
            private_data_dir=tmp,
            project_dir=str(REPO),
            playbook=str(playbook),
            inventory=str(Path(inventory).resolve()),
            extravars=extravars or {},
            cmdline=cmdline or None,
            tags=",".join(tags) if isinstance(tags, list) else tags,
            limit=limit,
            envvars=env,
            verbosity=verbosity,
            quiet=True,
            timeout=timeout,
        )
        events = list(runner.events)
        stdout = runner.stdout.read() if runner.stdout else ""
        return PlaybookResult(
            rc=runner.rc,
            status=runner.status,
            stats=_stats(runner),
            results=_results(events),
            stdout=stdout,
            artifacts=tmp if keep_artifacts else "",
            events=events,
        )
    finally:
        if not keep_artifacts:
            shutil.rmtree(tmp, ignore_errors=True)
