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
    build: tuple = ()  # PEP 427 build tag, (number, suffix) or (): a rebuild of one version sorts by it
    listed_hashes: tuple = ()  # a republished file name: every sha256 its listing gave, page order (_index)
    sha256_source: str = "index"  # "controller" when the listing gave none and the controller hashed the file

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
            **({"republished": len(self.listed_hashes)} if self.listed_hashes else {}),
        }


@dataclass
class PackageRule:
    """A profile package: what to install and where to look, in order of preference."""

    name: str
    spec: SpecifierSet
    indexes: list
    local_tag: str | None = None
    allow_stale: bool | None = None
    undatable: str | None = None  # refuse | allow; None: the rules' setting, else refuse when local_tag is set

    @property
    def key(self) -> str:
        return canonicalize_name(self.name)


@dataclass
class Override:
    """A requirement that replaces every pin other packages' METADATA declare on its package (uv --override)."""

    requirement: Requirement
    reason: str

    @property
    def key(self) -> str:
        return canonicalize_name(self.requirement.name)

    def applies(self, target) -> bool:
        return self.requirement.marker is None or self.requirement.marker.evaluate(target.marker_env())


@dataclass
class Rules:
    same_version: list = field(default_factory=list)
    max_age_days: int | None = None
    stale_gap_days: int | None = None
    allow_stale: bool = False
    stale_version_gap: int | None = None  # a source this many releases behind another one's newest is stale
    undatable: str | None = None  # refuse | allow for a source no rule can date; None: refuse for local-tag packages
    overrides: dict = field(default_factory=dict)  # canonical name -> Override

    def undatable_for(self, rule) -> str:
        return rule.undatable or self.undatable or ("refuse" if rule.local_tag else "allow")


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
        name, version, build, tags = parse_wheel_filename(filename)
    except InvalidWheelFilename:
        return None
    if extra.get("sha256"):
        extra["sha256"] = str(extra["sha256"]).lower()  # hex digits: indexes may write them in upper case
    return Candidate(
        project=canonicalize_name(name),
        index=index,
        filename=filename,
        url=url,
        version=version,
        tags=frozenset(tags),
        build=tuple(build),
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


def _release_text(release) -> str:
    return ".".join(str(part) for part in release)


def judge_sources(rule: PackageRule, by_index: dict, rules: Rules, today: _dt.date) -> dict:
    """Per index: newest build date and release of this package (for this target) and the source's verdict.

    ``by_index`` holds the builds that fit the target and the CUDA tag, any version. A source is stale when its
    newest build is older than ``max_age_days``, more than ``stale_gap_days`` behind the newest build another
    source of the package offers, or (dated or not) ``stale_version_gap`` or more releases behind another source's
    newest release. A source with builds none of which can be dated (no upload time, no devYYYYMMDD, no
    Last-Modified) that no version gap condemns is "undatable": refused or allowed by ``Rules.undatable_for``.
    """
    newest, newest_release = {}, {}
    for index in rule.indexes:
        cands = by_index.get(index, [])
        dates = [c.date for c in cands if c.date]
        newest[index] = max(dates) if dates else None
        newest_release[index] = max((c.version.release for c in cands), default=None)
    releases = {c.version.release for i in rule.indexes for c in by_index.get(i, [])}
    out = {}
    for index in rule.indexes:
        cands = by_index.get(index, [])
        date, release = newest[index], newest_release[index]
        info = {
            "newest": date.isoformat() if date else None,
            "newest_release": _release_text(release) if release else None,
            "count": len(cands),
            "stale": False,
            "undatable": bool(cands) and date is None,
        }
        reasons = []
        if date is not None:
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
        if release is not None and rules.stale_version_gap:
            ahead = [r for r in releases if r > release]
            if len(ahead) >= rules.stale_version_gap:
                best_index = max((r, i) for i, r in newest_release.items() if r is not None)[1]
                reasons.append(
                    f"newest release {_release_text(release)} is {len(ahead)} releases behind index"
                    f" {best_index!r} ({_release_text(max(ahead))}; stale_version_gap {rules.stale_version_gap})"
                )
        if reasons:
            info.update(stale=True, reason="; ".join(reasons))
        elif info["undatable"]:
            mode = rules.undatable_for(rule)
            info.update(
                undatable_policy=mode,
                reason=(
                    f"none of its {len(cands)} fitting build(s) has an upload time, a devYYYYMMDD version or a"
                    " Last-Modified date, and no other source is ahead of it by stale_version_gap"
                    + (
                        f" (undatable: {mode}); to accept it set undatable: allow on package {rule.name} or in"
                        " wheels.rules, or add stale_version_gap and a second source to judge it against"
                        if mode == "refuse"
                        else f" (undatable: {mode})"
                    )
                ),
            )
        out[index] = info
    return out


def refused(source: dict, allow_stale: bool) -> bool:
    """Whether the plan refuses a source judged by judge_sources."""
    if source["stale"]:
        return not allow_stale
    return source["undatable"] and source.get("undatable_policy") == "refuse"


def dating_needed(rules_by_pkg: list, candidates: list, target: Target) -> list:
    """Undated candidates whose date matters, so HEAD requests go only to them: per package and index, the builds
    that pass the spec and tag filters, and the builds of the newest release that fits (a source's newest build
    date, by which staleness is judged)."""
    supported = supported_tags(target)
    need = {}
    for rule in rules_by_pkg:
        anyver = _any_version(rule)
        for index in rule.indexes:
            fitting = [
                c
                for c in candidates
                if c.project == rule.key and c.index == index and reject_reason(c, anyver, supported, target) is None
            ]
            top = max((c.version.release for c in fitting), default=None)
            for c in fitting:
                if c.date is None and (c.version.release == top or reject_reason(c, rule, supported, target) is None):
                    need[id(c)] = c
    return list(need.values())


# --- resolution -----------------------------------------------------------------------------------------


@dataclass
class _State:
    """Working state of one package during resolution."""

    rule: PackageRule
    eligible: list
    rejected: list  # (candidate, reason)
    sources: dict
    allow_stale: bool = False
    fitting: list = field(default_factory=list)  # builds for the hosts' platform, Python and CUDA tag, any version
    target: Target | None = None


def sort_key(cand: Candidate, rule: PackageRule, supported: list):
    """Newest version first, then the highest build number (PEP 427: a rebuild of the same version); on a tie
    the earlier index of the package's list, then the best tag."""
    return (
        cand.version,
        cand.build,
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
        source = sources[index]
        for cand in by_index.get(index, []):
            reason = reject_reason(cand, rule, supported, target)
            if reason is None and refused(source, allow_stale):
                kind = "stale" if source["stale"] else "undatable"
                reason = f"{kind} source {index!r}: {source['reason']}"
            if reason:
                rejected.append((cand, reason))
            else:
                eligible.append(cand)
    eligible.sort(key=lambda c: sort_key(c, rule, supported), reverse=True)
    return _State(
        rule=rule,
        eligible=eligible,
        rejected=rejected,
        sources=sources,
        allow_stale=allow_stale,
        fitting=[c for cands in fitting.values() for c in cands],
        target=target,
    )


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


def declared_requirements(metadata: Metadata, target: Target) -> list:
    """The wheel's Requires-Dist that apply on the target (markers evaluated, extras off)."""
    out = []
    for req in metadata.requires_dist or []:
        if not isinstance(req, Requirement):
            try:
                req = Requirement(str(req))
            except InvalidRequirement:
                continue
        if req.marker is not None and not req.marker.evaluate(target.marker_env()):
            continue
        out.append(req)
    return out


def profile_pins(metadata: Metadata, keys: set, target: Target) -> list:
    """Requirements on other profile packages (``keys``, canonical names) that apply on the target."""
    return [req for req in declared_requirements(metadata, target) if canonicalize_name(req.name) in keys]


OVERRIDE_SOURCE = "the profile's override"


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
    # Overrides (uv --override): the pins other wheels declare on an overridden package are replaced by the
    # override's requirement, which the package's build must satisfy.
    overrides = {k: o for k, o in rules.overrides.items() if o.applies(target)}
    pinnable = keys - set(overrides)
    constraints = {k: {} for k in order}  # package -> {filename of the wheel that pins it: Requirement}
    for key in order:
        if key in overrides:
            constraints[key][OVERRIDE_SOURCE] = overrides[key].requirement
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
            for req in profile_pins(meta_cache[cand.filename], pinnable - {key}, target):
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
            replaced = {
                key: [
                    str(req)
                    for req in declared_requirements(meta_cache[cand.filename], target)
                    if canonicalize_name(req.name) in overrides and str(req.specifier)  # a bare name pins nothing
                ]
                for key, cand in chosen.items()
            }
            return chosen, plan_report(states, chosen, banned, constraints, replaced)
    raise PlanError(
        "the wheel plan did not settle; the profile's pins contradict each other: "
        + "; ".join(f"{f}: {r}" for f, r in banned.items())
        + ". Fix: pin the packages named to versions whose requirements agree (wheels.packages spec), or replace"
        " a pin with wheels.overrides (with the reason)"
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


NO_BUILD_LISTED = 8  # candidates named one by one in a no-build error; the rest are counted by reason
_REASON_KINDS = (
    ("yanked", "yanked"),
    ("version ", "version outside the spec"),
    ("local tag", "another local tag"),
    ("requires Python", "another Python"),
    ("wheel tags", "tags that do not fit the target"),
    ("stale source", "from a stale source"),
    ("undatable source", "from an undatable source"),
    ("requires ", "pins no eligible build satisfies"),
    ("excluded by", "excluded by pins"),
)


_CLOSENESS = {
    kind: rank
    for rank, kind in enumerate(
        ("yanked", "version outside the spec", "another local tag", "another Python", "tags that do not fit the target")
    )
}


def reason_kind(reason: str) -> str:
    for prefix, kind in _REASON_KINDS:
        if reason.startswith(prefix):
            return kind
    return reason[:80]


def no_build_message(state: _State, banned: dict, pins: dict) -> str:
    """Why no build of a package can be planned, bounded in length however long the listings are: the
    NO_BUILD_LISTED most telling candidates (builds for the hosts first, then those the spec admits first, newest
    first), then the others counted by reason, and the fix. A version no index has for the hosts gets the nearest
    versions that it has (``nearest_versions``)."""
    rule = state.rule
    lines = [
        f"no build of {rule.name} satisfies spec {str(rule.spec) or 'any'}"
        + (f", local tag {rule.local_tag}" if rule.local_tag else "")
        + f" in indexes {', '.join(rule.indexes)}"
    ]
    seen = list(state.rejected) + [(c, banned.get(c.filename)) for c in state.eligible]
    if not seen:
        lines.append("no wheel of this package was listed by any of its indexes")
    excluded = "; ".join(f"excluded by {src}'s requirement {req}" for src, req in pins.items()) or "not chosen"
    seen = [(cand, reason or excluded) for cand, reason in seen]
    # Builds the hosts can install first (a list of another platform's wheels says nothing to act on), then the
    # closest misses: a build refused by a later filter passed the earlier ones (reject_reason's order).
    fits = {id(c) for c in state.fitting}
    seen.sort(
        key=lambda cr: (
            id(cr[0]) in fits,
            _CLOSENESS.get(reason_kind(cr[1]), len(_CLOSENESS)),
            cr[0].version,
            cr[0].build,
        )
    )
    seen.reverse()
    for cand, reason in seen[:NO_BUILD_LISTED]:
        lines.append(f"{cand.index}: {cand.filename} ({cand.date or 'undated'}): {reason}")
    rest = seen[NO_BUILD_LISTED:]
    if rest:
        counts = {}
        for _cand, reason in rest:
            counts[reason_kind(reason)] = counts.get(reason_kind(reason), 0) + 1
        shown = ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
        lines.append(f"{len(rest)} more candidate(s): {shown}")
    refused_sources = [f"{i} ({s['reason']})" for i, s in state.sources.items() if refused(s, state.allow_stale)]
    if refused_sources:
        lines.append(
            "refused sources: "
            + "; ".join(refused_sources)
            + ". Set allow_stale (stale) or undatable: allow on the package only if such a build is wanted."
        )
    lines.append(no_build_fix(state, bool(seen), pins, bool(refused_sources)))
    return " | ".join(lines)


NEAREST_BELOW, NEAREST_ABOVE = 3, 2  # versions shown on each side of the one asked for


def _hosts_words(state: _State) -> str:
    target = state.target
    where = f"Python {target.python_version} on {target.platform}" if target else "the hosts"
    return where + (f", local tag {state.rule.local_tag}" if state.rule.local_tag else "")


def spec_anchor(spec: SpecifierSet) -> Version | None:
    """The version a spec names (``==2.99.0`` -> 2.99.0; the first bound of a range), None for an empty spec."""
    for item in sorted(spec, key=str):
        try:
            return Version(item.version.replace(".*", ""))
        except ValueError:
            continue
    return None


def nearest_versions(state: _State) -> list:
    """Public versions the package's indexes have a build of for the hosts (platform, Python, CUDA tag), nearest
    to the version the spec names: up to NEAREST_BELOW below it (newest first), then up to NEAREST_ABOVE above."""
    versions = sorted({Version(c.version.public) for c in state.fitting})
    anchor = spec_anchor(state.rule.spec)
    if anchor is None:
        return [str(v) for v in reversed(versions[-NEAREST_BELOW:])]
    below = [v for v in versions if v <= anchor][-NEAREST_BELOW:]
    above = [v for v in versions if v > anchor][:NEAREST_ABOVE]
    return [str(v) for v in reversed(below)] + [str(v) for v in above]


def no_build_fix(state: _State, listed: bool, pins: dict, sources_refused: bool) -> str:
    """The fix line of a no-build refusal, by what stood in the way."""
    rule = state.rule
    where = f"wheels.packages {rule.name}"
    if not listed:
        return f"fix: name an index that carries {rule.name} in its indexes ({where})"
    if state.eligible:
        return (
            f"fix: pin {rule.name} ({where} spec) to a version the requirements above admit, or, where the pinning"
            f" wheel runs with another {rule.name}, replace its pin with wheels.overrides (with the reason)"
        )
    in_spec = [c for c in state.fitting if rule.spec.contains(c.version, prereleases=admits_prereleases(rule.spec))]
    if in_spec and sources_refused:
        return f"fix: see the refused sources above; or pin a version another source of {rule.name} has ({where} spec)"
    nearest = nearest_versions(state)
    if nearest:
        return (
            f"nearest versions with a build for {_hosts_words(state)}: {', '.join(nearest)}; fix: set {where} spec"
            f" to one of them, e.g. =={nearest[0]}"
        )
    return (
        f"fix: no index of {rule.name} has a build for {_hosts_words(state)} at any version: name an index that"
        " has one, or change the profile's python.version or the package's local_tag"
    )


def plan_report(states, chosen, banned, constraints, replaced=None) -> dict:
    """What was chosen and why, with every candidate seen per index, and the pins that overrides replaced."""
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
            "undatable_sources": sorted(i for i, s in state.sources.items() if s["undatable"]),
            "overridden_pins": list((replaced or {}).get(key, [])),
            "candidates": cands,
        }
    return report


def _why(state, pick, pins) -> str:
    parts = [f"newest build satisfying {str(state.rule.spec) or 'any'}"]
    if state.rule.local_tag:
        parts.append(f"local tag {state.rule.local_tag}")
    for src, req in pins.items():
        parts.append(f"pinned by {src} ({req})")
    for kind, flag in (("stale", "allow_stale"), ("undatable", "undatable: allow")):
        judged = [i for i, s in state.sources.items() if s[kind]]
        refused_here = [i for i in judged if refused(state.sources[i], state.allow_stale)]
        allowed = [i for i in judged if i not in refused_here]
        if refused_here:
            parts.append(f"{kind} source(s) refused: " + ", ".join(refused_here))
        if pick.index in allowed:
            parts.append(f"{kind} source {pick.index} allowed ({flag})")
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
                f"wheels.packages {pkg['name']}: spec {pkg['spec']!r} is not a version specifier: {exc}; fix: write it"
                " as PEP 440 gives it, e.g. '==2.11.0' or '>=2.11,<2.12'"
            ) from exc
        pkgs.append(
            PackageRule(
                name=pkg["name"],
                spec=spec,
                indexes=list(pkg["indexes"]),
                local_tag=pkg.get("local_tag"),
                allow_stale=pkg.get("allow_stale"),
                undatable=pkg.get("undatable"),
            )
        )
    raw = wheels.get("rules") or {}
    rules = Rules(
        same_version=[list(g) for g in raw.get("same_version", [])],
        max_age_days=raw.get("max_age_days"),
        stale_gap_days=raw.get("stale_gap_days"),
        allow_stale=bool(raw.get("allow_stale", False)),
        stale_version_gap=raw.get("stale_version_gap"),
        undatable=raw.get("undatable"),
        overrides=overrides_from_profile(wheels.get("overrides") or []),
    )
    return pkgs, rules


def overrides_from_profile(entries: list) -> dict:
    """wheels.overrides ([{requirement, reason}]) as Override per canonical name; one override per package."""
    out = {}
    for pos, entry in enumerate(entries):
        text = entry.get("requirement")
        try:
            req = Requirement(str(text))
        except InvalidRequirement as exc:
            raise PlanError(
                f"wheels.overrides[{pos}]: requirement {text!r} is not a PEP 508 requirement ({exc}); write it as"
                " uv's --override takes it, e.g. 'torch>=2.11,<2.12' or 'flashinfer-python==0.6.4'"
            ) from exc
        if req.url or req.extras:
            raise PlanError(
                f"wheels.overrides[{pos}]: requirement {text!r} has a URL or extras; an override replaces version pins"
                " only: give a name and a version specifier"
            )
        override = Override(requirement=req, reason=str(entry.get("reason") or "").strip())
        if not override.reason:
            raise PlanError(
                f"wheels.overrides[{pos}] ({text}): no reason given; say why the upstream pins are replaced"
                " (the reason is printed in the plan report and kept in the lock)"
            )
        if override.key in out:
            raise PlanError(
                f"wheels.overrides[{pos}]: a second override for {override.key} ({text!r} after"
                f" {str(out[override.key].requirement)!r}); keep one requirement per package"
            )
        out[override.key] = override
    return out


def override_records(rules: Rules, report: dict) -> list:
    """The lock's list of overrides: requirement, reason and the pins of the chosen wheels it replaced."""
    records = []
    for key, override in rules.overrides.items():
        replaced = [
            {"by": rep["chosen"]["filename"], "pin": pin}
            for rep in report.values()
            for pin in rep.get("overridden_pins", [])
            if canonicalize_name(Requirement(pin).name) == key
        ]
        records.append({"requirement": str(override.requirement), "reason": override.reason, "replaced": replaced})
    return records


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
