# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Wheel plan resolution: pure functions over index listings, no network and no Ansible.

The controller probes the indexes (``_index.py``), turns every listed file into a ``Candidate`` and asks
``resolve_plan`` which build to take per package. Every rule of the plan is data from the stack profile:
version spec, CUDA local tag, index order, stale-source thresholds and same-version groups. Pins between
profile packages (a kernel wheel's exact torch pin) come from the wheels' own METADATA.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import re
import traceback
from dataclasses import dataclass, field
from html.parser import HTMLParser
from urllib.parse import urldefrag, urljoin

try:
    from packaging.metadata import InvalidMetadata, Metadata
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.specifiers import InvalidSpecifier, SpecifierSet
    from packaging.tags import compatible_tags, cpython_tags
    from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
    from packaging.version import Version

    HAS_PACKAGING = True
    PACKAGING_IMPORT_ERROR = None
except ImportError:  # the planner runs on the controller; callers check HAS_PACKAGING before planning
    HAS_PACKAGING = False
    PACKAGING_IMPORT_ERROR = traceback.format_exc()

LOCK_SCHEMA = 1
_DEV_DATE = re.compile(r"^(\d{4})(\d{2})(\d{2})")
_PLATFORM = re.compile(r"^(?P<arch>x86_64|aarch64)-(?:manylinux_(?P<major>\d+)_(?P<minor>\d+)|linux)$")


class PlanError(Exception):
    """A plan that cannot be made; the message names the package, what was seen and what to change."""


@dataclass
class Candidate:
    """One wheel file listed by one index."""

    project: str
    index: str
    filename: str
    url: str
    version: Version
    tags: frozenset
    sha256: str | None = None
    requires_python: str | None = None
    yanked: bool = False
    upload_time: _dt.datetime | None = None
    size: int | None = None
    metadata_url: str | None = None
    last_modified: _dt.datetime | None = None

    @property
    def date(self) -> _dt.date | None:
        """Build date: PEP 700 upload time, else devYYYYMMDD of the version, else the file's Last-Modified."""
        if self.upload_time:
            return self.upload_time.date()
        dev = dev_date(self.version)
        if dev:
            return dev
        return self.last_modified.date() if self.last_modified else None

    @property
    def date_source(self) -> str | None:
        if self.upload_time:
            return "upload-time"
        if dev_date(self.version):
            return "dev-version"
        return "last-modified" if self.last_modified else None

    def summary(self) -> dict:
        return {
            "index": self.index,
            "filename": self.filename,
            "version": str(self.version),
            "date": self.date.isoformat() if self.date else None,
            "date_source": self.date_source,
        }


@dataclass
class PackageRule:
    """A profile package: what to install and where to look, in order of preference."""

    name: str
    spec: SpecifierSet
    indexes: list
    local_tag: str | None = None
    allow_stale: bool | None = None

    @property
    def key(self) -> str:
        return canonicalize_name(self.name)


@dataclass
class Rules:
    same_version: list = field(default_factory=list)
    max_age_days: int | None = None
    stale_gap_days: int | None = None
    allow_stale: bool = False


@dataclass
class Target:
    """The hosts' interpreter and platform, e.g. Python 3.11 on x86_64-manylinux_2_36."""

    python_version: str
    platform: str = "x86_64-manylinux_2_28"

    @property
    def python_tuple(self) -> tuple:
        return tuple(int(p) for p in self.python_version.split(".")[:2])

    def marker_env(self) -> dict:
        arch = self.platform.split("-", 1)[0]
        return {
            "python_version": self.python_version,
            "python_full_version": f"{self.python_version}.0",
            "implementation_name": "cpython",
            "platform_python_implementation": "CPython",
            "platform_machine": arch,
            "platform_system": "Linux",
            "sys_platform": "linux",
            "os_name": "posix",
            "extra": "",
        }


# --- parsing index listings -----------------------------------------------------------------------------


def dev_date(version: Version) -> _dt.date | None:
    """Nightlies carry their build date as devYYYYMMDD."""
    if version.dev is None:
        return None
    match = _DEV_DATE.match(str(version.dev))
    if not match:
        return None
    try:
        return _dt.date(*(int(g) for g in match.groups()))
    except ValueError:
        return None


def parse_time(value) -> _dt.datetime | None:
    if not value:
        return None
    try:
        parsed = _dt.datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=_dt.timezone.utc)


def make_candidate(index: str, filename: str, url: str, **extra) -> Candidate | None:
    """A Candidate for a wheel file name, or None for anything that is not a wheel (sdists are never planned)."""
    try:
        name, version, _build, tags = parse_wheel_filename(filename)
    except InvalidWheelFilename:
        return None
    return Candidate(
        project=canonicalize_name(name),
        index=index,
        filename=filename,
        url=url,
        version=version,
        tags=frozenset(tags),
        **extra,
    )


def parse_project_json(doc: dict, page_url: str, index: str) -> list:
    """PEP 691 project page (with PEP 700 upload-time and size where the index gives them)."""
    out = []
    for entry in doc.get("files", []):
        hashes = entry.get("hashes") or {}
        metadata = entry.get("core-metadata", entry.get("dist-info-metadata"))
        cand = make_candidate(
            index,
            entry["filename"],
            urljoin(page_url, entry["url"]),
            sha256=hashes.get("sha256"),
            requires_python=entry.get("requires-python") or None,
            yanked=bool(entry.get("yanked")),
            upload_time=parse_time(entry.get("upload-time")),
            size=entry.get("size"),
            metadata_url=(urljoin(page_url, entry["url"]) + ".metadata") if metadata else None,
        )
        if cand:
            out.append(cand)
    return out


class _AnchorParser(HTMLParser):
    def __init__(self):
        super().__init__()
        self.anchors = []
        self._current = None

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            self._current = (dict(attrs), [])

    def handle_data(self, data):
        if self._current is not None:
            self._current[1].append(data)

    def handle_endtag(self, tag):
        if tag == "a" and self._current is not None:
            self.anchors.append((self._current[0], "".join(self._current[1]).strip()))
            self._current = None


def parse_project_html(html: str, page_url: str, index: str) -> list:
    """PEP 503 project page: anchors with #sha256= fragments and data-* attributes (PEP 592, 658, 714)."""
    parser = _AnchorParser()
    parser.feed(html)
    out = []
    for attrs, text in parser.anchors:
        href = attrs.get("href")
        if not href:
            continue
        url, fragment = urldefrag(urljoin(page_url, href))
        filename = url.rsplit("/", 1)[-1] or text
        sha256 = fragment.split("=", 1)[1] if fragment.startswith("sha256=") else None
        metadata = attrs.get("data-core-metadata", attrs.get("data-dist-info-metadata"))
        cand = make_candidate(
            index,
            _unquote(filename),
            url,
            sha256=sha256,
            requires_python=attrs.get("data-requires-python") or None,
            yanked="data-yanked" in attrs,
            metadata_url=url + ".metadata" if metadata is not None else None,
        )
        if cand:
            out.append(cand)
    return out


def _unquote(name: str) -> str:
    from urllib.parse import unquote

    return unquote(name)


# --- compatibility --------------------------------------------------------------------------------------


def platform_tags(platform: str) -> list:
    """Platform tags a host accepts, most specific first: manylinux_2_N down to 2_17, the legacy aliases, linux."""
    match = _PLATFORM.match(platform)
    if not match:
        raise PlanError(
            f"platform {platform!r} is not understood; give it as ARCH-manylinux_2_MINOR (e.g. x86_64-manylinux_2_36,"
            " the glibc of the hosts) or ARCH-linux"
        )
    arch = match.group("arch")
    tags = []
    if match.group("major"):
        major, minor = int(match.group("major")), int(match.group("minor"))
        for glibc_minor in range(minor, 4, -1):
            tags.append(f"manylinux_{major}_{glibc_minor}_{arch}")
            legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}.get(glibc_minor)
            if legacy and major == 2:
                tags.append(f"{legacy}_{arch}")
    tags.append(f"linux_{arch}")
    return tags


def supported_tags(target: Target) -> list:
    """All wheel tags the target interpreter installs, in packaging's order of preference."""
    platforms = platform_tags(target.platform)
    major_minor = target.python_tuple
    return list(cpython_tags(major_minor, platforms=platforms)) + list(
        compatible_tags(major_minor, interpreter=f"cp{major_minor[0]}{major_minor[1]}", platforms=platforms)
    )


def tag_rank(cand: Candidate, supported: list) -> int | None:
    """Position of the candidate's best tag among the supported ones (lower is better), None if incompatible."""
    ranks = [supported.index(t) for t in cand.tags if t in supported]
    return min(ranks) if ranks else None


def reject_reason(cand: Candidate, rule: PackageRule, supported: list, target: Target) -> str | None:
    """Why a candidate cannot be installed for this package on this target, or None when it can."""
    if cand.yanked:
        return "yanked by the index"
    # An empty spec admits nightlies (devYYYYMMDD); a spec admits pre-releases only if it names one itself.
    if not rule.spec.contains(cand.version, prereleases=admits_prereleases(rule.spec)):
        return f"version {cand.version} does not satisfy {rule.spec or 'any'}"
    if rule.local_tag and (cand.version.local or "") != rule.local_tag:
        return f"local tag {cand.version.local or '(none)'!r} is not the required {rule.local_tag!r}"
    if cand.requires_python:
        try:
            if not SpecifierSet(cand.requires_python).contains(f"{target.python_version}.0", prereleases=True):
                return f"requires Python {cand.requires_python}, hosts have {target.python_version}"
        except InvalidSpecifier:
            pass
    if tag_rank(cand, supported) is None:
        shown = ", ".join(sorted(str(t) for t in cand.tags))
        return f"wheel tags {shown} do not fit Python {target.python_version} on {target.platform}"
    return None


# --- stale sources --------------------------------------------------------------------------------------


def judge_sources(rule: PackageRule, by_index: dict, rules: Rules, today: _dt.date) -> dict:
    """Per index: newest build date of this package (for this target) and whether the source is stale.

    A source is stale when its newest build is older than ``max_age_days``, or more than ``stale_gap_days``
    behind the newest build another source of the same package offers.
    """
    newest = {}
    for index in rule.indexes:
        dates = [c.date for c in by_index.get(index, []) if c.date]
        newest[index] = max(dates) if dates else None
    out = {}
    for index in rule.indexes:
        date = newest[index]
        info = {"newest": date.isoformat() if date else None, "count": len(by_index.get(index, [])), "stale": False}
        if date is not None:
            reasons = []
            if rules.max_age_days and (today - date).days > rules.max_age_days:
                reasons.append(
                    f"newest build {date} is {(today - date).days} days old (max_age_days {rules.max_age_days})"
                )
            others = [(d, i) for i, d in newest.items() if i != index and d is not None]
            if others and rules.stale_gap_days:
                best, best_index = max(others)
                gap = (best - date).days
                if gap > rules.stale_gap_days:
                    reasons.append(
                        f"newest build {date} is {gap} days behind index {best_index!r} ({best};"
                        f" stale_gap_days {rules.stale_gap_days})"
                    )
            if reasons:
                info.update(stale=True, reason="; ".join(reasons))
        out[index] = info
    return out


# --- resolution -----------------------------------------------------------------------------------------


@dataclass
class _State:
    """Working state of one package during resolution."""

    rule: PackageRule
    eligible: list
    rejected: list  # (candidate, reason)
    sources: dict


def sort_key(cand: Candidate, rule: PackageRule, supported: list):
    """Newest version first; on a tie the earlier index of the package's list, then the best tag."""
    return (
        cand.version,
        -rule.indexes.index(cand.index),
        -(tag_rank(cand, supported) or 0),
        cand.date or _dt.date.min,
    )


def screen(rule: PackageRule, candidates: list, rules: Rules, target: Target, supported: list, today) -> _State:
    """Split one package's candidates into eligible (best first) and rejected, each rejection with its reason."""
    by_index = {}
    for cand in candidates:
        if cand.project == rule.key and cand.index in rule.indexes:
            by_index.setdefault(cand.index, []).append(cand)
    # Staleness compares builds for this target and CUDA tag only: an index's cu128 builds say nothing of cu130.
    fitting = {
        i: [c for c in cands if reject_reason(c, _any_version(rule), supported, target) is None]
        for i, cands in by_index.items()
    }
    sources = judge_sources(rule, fitting, rules, today)
    allow_stale = rules.allow_stale if rule.allow_stale is None else rule.allow_stale
    eligible, rejected = [], []
    for index in rule.indexes:
        for cand in by_index.get(index, []):
            reason = reject_reason(cand, rule, supported, target)
            if reason is None and sources[index]["stale"] and not allow_stale:
                reason = f"stale source {index!r}: {sources[index]['reason']}"
            if reason:
                rejected.append((cand, reason))
            else:
                eligible.append(cand)
    eligible.sort(key=lambda c: sort_key(c, rule, supported), reverse=True)
    return _State(rule=rule, eligible=eligible, rejected=rejected, sources=sources)


def admits_prereleases(spec: SpecifierSet) -> bool:
    """PEP 440: pre-releases (nightlies) only when the spec names one itself; an empty spec admits all."""
    if not str(spec):
        return True
    return any(Version(s.version.replace(".*", "")).is_prerelease for s in spec if s.operator != "===")


def _any_version(rule: PackageRule) -> PackageRule:
    return PackageRule(name=rule.name, spec=SpecifierSet(), indexes=rule.indexes, local_tag=rule.local_tag)


def metadata_problem(cand: Candidate, metadata: Metadata) -> str | None:
    """A wheel whose METADATA disagrees with its file name (e.g. a +cu130 wheel whose METADATA lacks +cu130)."""
    try:
        name, version = metadata.name, metadata.version
        metadata.requires_dist  # noqa: B018 - parsed lazily: a broken Requires-Dist shows here, not mid-plan
    except (InvalidMetadata, ValueError) as exc:
        return f"METADATA is unreadable: {exc}"
    if canonicalize_name(name) != cand.project:
        return f"METADATA names {name!r}, the file name says {cand.project!r}"
    if version != cand.version:
        return f"METADATA version {version} disagrees with the file name's {cand.version}"
    return None


def profile_pins(metadata: Metadata, keys: set, target: Target) -> list:
    """Requirements on other profile packages that apply on the target (markers evaluated, extras off)."""
    out = []
    for req in metadata.requires_dist or []:
        if not isinstance(req, Requirement):
            try:
                req = Requirement(str(req))
            except InvalidRequirement:
                continue
        if canonicalize_name(req.name) not in keys:
            continue
        if req.marker is not None and not req.marker.evaluate(target.marker_env()):
            continue
        out.append(req)
    return out


def resolve_plan(rules_by_pkg: list, candidates: list, rules: Rules, target: Target, metadata_of, today=None):
    """Choose one wheel per profile package.

    ``metadata_of(candidate)`` returns the wheel's ``packaging.metadata.Metadata`` (the caller fetches it via
    PEP 658 or a range read). Returns ``(chosen, report)``; raises PlanError with every candidate seen and why
    each was rejected when a package cannot be planned.
    """
    today = today or _dt.datetime.now(_dt.timezone.utc).date()
    supported = supported_tags(target)
    states = {r.key: screen(r, candidates, rules, target, supported, today) for r in rules_by_pkg}
    keys = set(states)
    order = [r.key for r in rules_by_pkg]  # profile order keeps reports and error messages reproducible
    constraints = {k: {} for k in order}  # package -> {filename of the wheel that pins it: Requirement}
    banned = {}  # filename -> reason
    meta_cache = {}

    def pool(key):
        return [
            c
            for c in states[key].eligible
            if c.filename not in banned and all(c.version in req.specifier for req in constraints[key].values())
        ]

    for _round in range(10 * len(keys) + 10):
        pools = {k: pool(k) for k in order}
        for key in order:
            if not pools[key]:
                raise PlanError(no_build_message(states[key], banned, constraints[key]))
        for group in rules.same_version:
            _apply_group(group, pools, states, constraints, banned)
        chosen = {key: pools[key][0] for key in order}
        changed = False
        for cand in chosen.values():
            if cand.filename not in meta_cache:
                meta_cache[cand.filename] = metadata_of(cand)
            problem = metadata_problem(cand, meta_cache[cand.filename])
            if problem:
                _ban(cand, problem, banned, constraints)
                changed = True
                break
        if changed:
            continue
        for key, cand in chosen.items():
            for req in profile_pins(meta_cache[cand.filename], keys - {key}, target):
                other = canonicalize_name(req.name)
                if chosen[other].version in req.specifier:
                    continue
                if any(c.version in req.specifier for c in pool(other)) and cand.filename not in constraints[other]:
                    constraints[other][cand.filename] = req
                else:
                    seen = ", ".join(sorted({str(c.version) for c in states[other].eligible})) or "none"
                    _ban(
                        cand,
                        f"requires {req}, but no eligible {other} build satisfies it (eligible: {seen})",
                        banned,
                        constraints,
                    )
                changed = True
                break
            if changed:
                break
        if not changed:
            return chosen, plan_report(states, chosen, banned, constraints)
    raise PlanError(
        "the wheel plan did not settle; the profile's pins contradict each other: "
        + "; ".join(f"{f}: {r}" for f, r in banned.items())
    )


def _ban(cand, reason, banned, constraints):
    banned[cand.filename] = reason
    for pins in constraints.values():
        pins.pop(cand.filename, None)


def _apply_group(group, pools, states, constraints, banned):
    """Members of a same-version group (e.g. the flashinfer trio) get the newest public version all of them have."""
    members = [canonicalize_name(n) for n in group if canonicalize_name(n) in pools]
    if len(members) < 2:
        return
    versions = {m: {c.version.public for c in pools[m]} for m in members}
    common = set.intersection(*versions.values())
    if not common:
        shown = "; ".join(
            f"{m}: {', '.join(sorted(v, key=Version, reverse=True)) or 'none'}" for m, v in versions.items()
        )
        raise PlanError(
            f"no version common to the same-version group [{', '.join(group)}] (they must match, as the package"
            f" itself checks at import); eligible versions per member: {shown}. Pin one version for the whole group"
            " in the profile or add an index that carries it."
        )
    best = max(common, key=Version)
    for m in members:
        pools[m] = [c for c in pools[m] if c.version.public == best]


def no_build_message(state: _State, banned: dict, pins: dict) -> str:
    rule = state.rule
    lines = [
        f"no build of {rule.name} satisfies spec {str(rule.spec) or 'any'}"
        + (f", local tag {rule.local_tag}" if rule.local_tag else "")
        + f" in indexes {', '.join(rule.indexes)}"
    ]
    seen = list(state.rejected) + [(c, banned.get(c.filename)) for c in state.eligible]
    if not seen:
        lines.append("no wheel of this package was listed by any of its indexes")
    for cand, reason in seen:
        if reason is None:
            reason = "; ".join(f"excluded by {src}'s requirement {req}" for src, req in pins.items()) or "not chosen"
        lines.append(f"{cand.index}: {cand.filename} ({cand.date or 'undated'}): {reason}")
    stale = [f"{i} ({s['reason']})" for i, s in state.sources.items() if s["stale"]]
    if stale:
        lines.append(
            "stale sources: " + "; ".join(stale) + ". Set allow_stale on the package only if that build is wanted."
        )
    return " | ".join(lines)


def plan_report(states, chosen, banned, constraints) -> dict:
    """What was chosen and why, with every candidate seen per index."""
    report = {}
    for key, state in states.items():
        pick = chosen[key]
        cands = []
        for cand in state.eligible:
            status = (
                "chosen"
                if cand is pick
                else ("rejected: " + banned[cand.filename] if cand.filename in banned else "eligible, not chosen")
            )
            cands.append(dict(cand.summary(), status=status))
        cands.extend(dict(c.summary(), status="rejected: " + r) for c, r in state.rejected)
        report[state.rule.name] = {
            "chosen": pick.summary(),
            "why": _why(state, pick, constraints[key]),
            "sources": state.sources,
            "stale_sources": sorted(i for i, s in state.sources.items() if s["stale"]),
            "candidates": cands,
        }
    return report


def _why(state, pick, pins) -> str:
    parts = [f"newest build satisfying {str(state.rule.spec) or 'any'}"]
    if state.rule.local_tag:
        parts.append(f"local tag {state.rule.local_tag}")
    for src, req in pins.items():
        parts.append(f"pinned by {src} ({req})")
    stale = [i for i, s in state.sources.items() if s["stale"]]
    if stale:
        parts.append("stale source(s) refused: " + ", ".join(stale))
    return f"{pick.filename} from {pick.index}: " + "; ".join(parts)


# --- lock -----------------------------------------------------------------------------------------------


def rules_from_profile(wheels: dict) -> tuple:
    """PackageRule list and Rules from a validated profile's ``wheels`` section."""
    pkgs = []
    for pkg in wheels["packages"]:
        try:
            spec = SpecifierSet(pkg["spec"])
        except InvalidSpecifier as exc:
            raise PlanError(
                f"wheels.packages {pkg['name']}: spec {pkg['spec']!r} is not a version specifier: {exc}"
            ) from exc
        pkgs.append(
            PackageRule(
                name=pkg["name"],
                spec=spec,
                indexes=list(pkg["indexes"]),
                local_tag=pkg.get("local_tag"),
                allow_stale=pkg.get("allow_stale"),
            )
        )
    raw = wheels.get("rules") or {}
    rules = Rules(
        same_version=[list(g) for g in raw.get("same_version", [])],
        max_age_days=raw.get("max_age_days"),
        stale_gap_days=raw.get("stale_gap_days"),
        allow_stale=bool(raw.get("allow_stale", False)),
    )
    return pkgs, rules


def pick_file(wheels: list, target: Target) -> dict | None:
    """Best-fitting wheel of a resolved dependency (``wheels``: dicts with url and sha256)."""
    supported = supported_tags(target)
    best = None
    for wheel in wheels:
        filename = wheel["url"].rsplit("/", 1)[-1]
        cand = make_candidate("", _unquote(filename), wheel["url"])
        if cand is None:
            continue
        rank = tag_rank(cand, supported)
        if rank is not None and (best is None or rank < best[0]):
            best = (rank, dict(wheel, filename=cand.filename))
    return best[1] if best else None


def lock_hash(entries: list, target: Target) -> str:
    """Hash of what a host installs: Python version and every (file name, sha256). Dates and reports stay out,
    so an unchanged set keeps its venv name."""
    payload = {
        "python": target.python_version,
        "wheels": sorted((e["filename"], e["sha256"]) for e in entries),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def requirements_text(entries: list) -> str:
    """A requirements file uv installs with --require-hashes from the hosts' wheelhouse."""
    lines = [
        f"{e['name']}=={e['version']} --hash=sha256:{e['sha256']}" for e in sorted(entries, key=lambda e: e["name"])
    ]
    return "\n".join(lines) + "\n"


def lock_diff(installed: dict, entries: list) -> tuple:
    """(before, after) text of ``name==version`` lines: what the current venv has vs. what the lock installs."""
    before = "".join(
        f"{canonicalize_name(n)}=={v}\n" for n, v in sorted(installed.items(), key=lambda i: canonicalize_name(i[0]))
    )
    after = "".join(
        f"{canonicalize_name(e['name'])}=={e['version']}\n"
        for e in sorted(entries, key=lambda e: canonicalize_name(e["name"]))
    )
    return before, after
