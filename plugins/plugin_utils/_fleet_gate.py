# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fleet gate: a batch's post-upgrade benchmark against the fleet's pre-upgrade figures, per serving group.

Each host's own gate (module spec_decode_bench, gate ``regression``) compares the host with itself, within a limit
wide enough for one host's noise. A batch whose hosts each stay within that limit can still be slower than the fleet
was: hosts whose own figures were low, or a regression every host of the batch shares. The fleet gate pools runs:
the fleet's distribution is every run of the pre-upgrade benchmarks (``postcheck_baseline``) of a serving group's
hosts, the batch's is every run of its hosts' post-check benchmarks, both at the lowest concurrency the two share.
The batch fails when its median is below the fleet's median by more than the profile's limit
(``postcheck.bench.fleet_max_regression_pct``) and by more than the fleet's own noise: ``NOISE_K`` times the
median absolute deviation scaled to a standard deviation (1.4826 x MAD), so one run off, or a fleet whose hosts
differ this much anyway, does not stop a rollout. Pure logic: the playbook passes the figures in.
"""

from __future__ import annotations

import statistics

MAD_TO_SD = 1.4826
NOISE_K = 3.0
MIN_RUNS = 2


def _bench(data):
    """The spec_decode_bench result in a fact (the module's return, or its ``bench``), or None."""
    if isinstance(data, dict) and isinstance(data.get("bench"), dict):
        data = data["bench"]
    return data if isinstance(data, dict) and isinstance(data.get("levels"), list) else None


def runs_by_concurrency(data):
    """``{concurrency: [output tok/s of each run]}`` of a benchmark result ({} when there is none)."""
    bench = _bench(data)
    out = {}
    for level in (bench or {}).get("levels", []):
        runs = [r.get("output_tok_s") for r in level.get("runs") or []]
        runs = [float(r) for r in runs if isinstance(r, (int, float))]
        if not runs and isinstance((level.get("output_tok_s") or {}).get("mean"), (int, float)):
            runs = [float(level["output_tok_s"]["mean"])]
        if runs and level.get("concurrency") is not None:
            out[int(level["concurrency"])] = runs
    return out


def mad(values):
    med = statistics.median(values)
    return statistics.median(abs(v - med) for v in values)


def _pool(entries, concurrency):
    return [v for e in entries for v in e["runs"].get(concurrency, [])]


def judge_group(group, fleet, batch, limit_pct):
    """One serving group's verdict: ``{group, passed, skipped, message, figures...}``.

    fleet: ``[{host, runs}]`` pre-upgrade; batch: ``[{host, runs}]`` post-upgrade of this batch's hosts.
    """
    out = {"group": group, "hosts": [e["host"] for e in batch], "limit_pct": limit_pct}
    shared = set().union(*(e["runs"] for e in fleet)) if fleet else set()
    shared &= set().union(*(e["runs"] for e in batch)) if batch else set()
    if not shared:
        return dict(out, passed=True, skipped=True, message="no concurrency measured both before the rollout and now")
    conc = min(shared)
    before, after = _pool(fleet, conc), _pool(batch, conc)
    if len(before) < MIN_RUNS or len(after) < MIN_RUNS:
        return dict(
            out,
            passed=True,
            skipped=True,
            message=f"too few runs to judge ({len(before)} before, {len(after)} now; at least {MIN_RUNS} each)",
        )
    fleet_median, batch_median = statistics.median(before), statistics.median(after)
    noise = NOISE_K * MAD_TO_SD * mad(before)
    drop_pct = (fleet_median - batch_median) / fleet_median * 100.0 if fleet_median > 0 else 0.0
    floor_pct = noise / fleet_median * 100.0 if fleet_median > 0 else 0.0
    passed = not (drop_pct > limit_pct and drop_pct > floor_pct)
    out.update(
        passed=passed,
        skipped=False,
        concurrency=conc,
        fleet_median=round(fleet_median, 2),
        fleet_mad=round(mad(before), 2),
        fleet_runs=len(before),
        fleet_hosts=len(fleet),
        batch_median=round(batch_median, 2),
        batch_runs=len(after),
        change_pct=round(-drop_pct, 2),
        noise_floor_pct=round(floor_pct, 2),
    )
    out["message"] = (
        f"serving group {group or '(none)'}: the batch's median output {batch_median:.1f} tok/s at concurrency {conc} "
        f"({len(after)} run(s) of {len(batch)} host(s): {', '.join(out['hosts'])}) is {-drop_pct:+.1f}% against the "
        f"fleet's pre-upgrade median {fleet_median:.1f} tok/s ({len(before)} run(s) of {len(fleet)} host(s), MAD "
        f"{out['fleet_mad']:.1f} tok/s, noise floor {floor_pct:.1f}%); the limit is -{limit_pct:g}%"
    )
    return out


def _runs(entry):
    """A host's ``{concurrency: runs}``, its keys ints again after a trip through Ansible's facts."""
    return {int(c): list(r) for c, r in (entry or {}).items()}


def judge(batch_number, batch, groups, fleet_runs, batch_runs, limit_pct):
    """The batch's verdict over its serving groups.

    batch: the batch's hosts; groups: ``{host: group}``; fleet_runs: ``{host: {concurrency: runs}}`` of the
    pre-upgrade benchmarks of the hosts measured so far (``runs_by_concurrency``); batch_runs: the same of the batch's
    post-check benchmarks (a host without one, e.g. rolled back before its post-check, is left out: the failed-host
    budget answers for it). ``limit_pct`` None: not judged.
    """
    verdict = {"batch": batch_number, "hosts": list(batch), "limit_pct": limit_pct, "groups": []}
    if limit_pct is None or str(limit_pct).strip() == "":
        return dict(verdict, passed=True, skipped=True, message="fleet gate off (no fleet_max_regression_pct)")
    limit = float(limit_pct)
    by_group = {}
    for host, entry in fleet_runs.items():
        runs = _runs(entry)
        if runs:
            by_group.setdefault(str(groups.get(host) or ""), {"fleet": [], "batch": []})["fleet"].append(
                {"host": host, "runs": runs}
            )
    for host in batch:
        runs = _runs(batch_runs.get(host))
        if runs:
            by_group.setdefault(str(groups.get(host) or ""), {"fleet": [], "batch": []})["batch"].append(
                {"host": host, "runs": runs}
            )
    for group in sorted(g for g, e in by_group.items() if e["batch"]):
        verdict["groups"].append(judge_group(group, by_group[group]["fleet"], by_group[group]["batch"], limit))
    failed = [g for g in verdict["groups"] if not g["passed"]]
    verdict["passed"] = not failed
    verdict["skipped"] = all(g["skipped"] for g in verdict["groups"])
    verdict["message"] = (
        f"fleet gate stopped the rollout after batch {batch_number} ({', '.join(batch)}): "
        + "; ".join(g["message"] for g in failed)
        + "; fix: find why the batch is slower than the fleet was (the hosts' post-check reports) and roll it back"
        " (playbooks/rollback.yml) or accept it by raising postcheck.bench.fleet_max_regression_pct, then run the"
        " upgrade again for the hosts left"
        if failed
        else "; ".join(f"batch {batch_number}: {g['message']}" for g in verdict["groups"]) or "nothing to judge"
    )
    return verdict
