# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Make a wheel lock from a profile: probe, resolve (``_wheels``), add dependencies with uv, fetch the wheelhouse.

Dependencies are resolved by ``uv pip compile`` (a real resolver with backtracking, the tool the hosts install
with) over the profile's own indexes, with every profile package given as the exact file the plan chose. uv
writes a PEP 751 lock (pylock.toml) with file URLs and hashes; the plan keeps, per dependency, the one wheel
that fits the hosts.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import traceback
import zipfile
from urllib.parse import urldefrag, urlsplit

import tomllib

try:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    HAS_PACKAGING = True
    PACKAGING_IMPORT_ERROR = None
except ImportError:  # the action plugin checks HAS_PACKAGING and fails with a clear message
    HAS_PACKAGING = False
    PACKAGING_IMPORT_ERROR = traceback.format_exc()

from ansible_collections.gpufleet.upgrade.plugins.plugin_utils._index import (
    Fetcher,
    HashRecord,
    IndexDown,
    UrlHashRecord,
    ValidatorCache,
    hash_note,
    settle_hashes,
)
from ansible_collections.gpufleet.upgrade.plugins.plugin_utils._lock_rules import (
    companions_from_profile,
    judge_after_fetch,
    judge_lock,
    metadata_wanted,
    parse_uv_graph,
)
from ansible_collections.gpufleet.upgrade.plugins.plugin_utils._lock_rules import report_lines as lock_rule_lines
from ansible_collections.gpufleet.upgrade.plugins.plugin_utils._wheels import (
    LOCK_SCHEMA,
    PlanError,
    Target,
    dating_needed,
    declared_requirements,
    lock_hash,
    make_candidate,
    override_records,
    pick_file,
    resolve_plan,
    rules_from_profile,
)


def probe(fetcher: Fetcher, wheels: dict, rules_by_pkg: list, target: Target) -> list:
    """Listings of every profile package on every index it names, and on no other. Builds the listing does not date
    are dated by the file's Last-Modified (HEAD requests, concurrently), only those whose date the plan reads
    (``_wheels.dating_needed``): a PEP 503 listing of a thousand files costs a handful of requests, not a thousand.
    An index that refuses a package (HTTP 403 or 404 for its project page, or unreachable) is passed over for the
    next one the profile names for it (``index_refusals`` says so); a package every named index refuses fails the
    plan, naming them and the fix."""
    urls = {i["name"]: i["url"] for i in wheels["indexes"]}
    cands = []
    for rule in rules_by_pkg:
        listed = []
        for index in rule.indexes:
            try:
                listed.extend(fetcher.listing(index, urls[index], rule.name))
            except IndexDown:
                continue
        refusals = refusals_of(fetcher, rule.name, rule.indexes, urls)
        if len(refusals) == len(rule.indexes):
            raise PlanError(only_refusals_message(rule.name, refusals, "wheels.packages", rule.indexes))
        cands.extend(listed)
    fetcher.date_undated(dating_needed(rules_by_pkg, cands, target))
    return cands


def refusals_of(fetcher: Fetcher, name: str, indexes: list, urls: dict) -> list:
    """The indexes of ``indexes`` that refused package ``name`` in this plan: HTTP 403/404 for its project page, or
    not reachable at all; each as {package, index, url, status}, in the profile's order."""
    key = canonicalize_name(name)
    out = []
    for index in indexes:
        status = fetcher.not_carried.get((index, key))
        if status is None and index in fetcher.down:
            status = f"unreachable: {fetcher.down[index]}"
        if status:
            out.append({"package": name, "index": index, "url": urls[index], "status": status})
    return out


def _refused_words(refusal: dict) -> str:
    status, where = refusal["status"], f"index {refusal['index']!r} ({refusal['url']})"
    if status.startswith("unreachable: "):
        return f"{where} could not be reached for {refusal['package']} ({status[len('unreachable: ') :]})"
    return f"{where} answered {status} for the project page of {refusal['package']}"


def only_refusals_message(name: str, refusals: list, where: str, indexes: list) -> str:
    """A package whose every named index refused: which, how, that no other index is asked, and the fix."""
    return (
        f"package {name}: every index the profile names for it refused it: "
        + "; ".join(_refused_words(r) for r in refusals)
        + f". A package is taken only from the indexes the profile names for it ({where} {name}:"
        f" {', '.join(indexes)}), never from another one. Fix: if {refusals[0]['index']!r} should serve {name} (a"
        " site mirror answering 403 refuses every package), check its URL and access, or map it to a mirror that"
        f" serves it with gpufleet_index_urls; else name an index that carries {name} for it in the profile"
    )


def refusal_line(refusal: dict) -> str:
    """One console line for an index that refused a package another named index served."""
    served = refusal.get("planned_from")
    return (
        f"index refused: {_refused_words(refusal)}"
        + (f"; planned from index {served!r}, another index the profile names for it" if served else "")
        + f". Fix: if {refusal['index']!r} should serve {refusal['package']}, check its URL and access"
        f" (gpufleet_index_urls); if it does not carry {refusal['package']}, remove it from the package's indexes"
        " in the profile"
    )


def index_refusals(fetcher: Fetcher, rules_by_pkg: list, wheels: dict, chosen: dict) -> list:
    """Every refusal of a profile package by an index the profile names for it, with the index it was planned
    from, and every index that could not be reached (left out of the dependencies' resolution)."""
    urls = {i["name"]: i["url"] for i in wheels["indexes"]}
    out = []
    for rule in rules_by_pkg:
        for refusal in refusals_of(fetcher, rule.name, rule.indexes, urls):
            pick = chosen.get(rule.key)
            out.append({**refusal, "planned_from": pick.index if pick else None})
    return out


def reachable_wheels(fetcher: Fetcher, wheels: dict) -> dict:
    """The profile's ``wheels`` without the indexes that could not be reached, for uv: an index that does not
    answer would fail uv's whole resolution (after its retries). A dependency the profile names for such an index
    (``dependency_indexes``) fails the plan: it is taken from that index or not at all."""
    if not fetcher.down:
        return wheels
    urls = {i["name"]: i["url"] for i in wheels["indexes"]}
    pinned = wheels.get("dependency_indexes") or {}
    for name, index in pinned.items():
        if index in fetcher.down:
            refusal = {
                "package": name,
                "index": index,
                "url": urls[index],
                "status": f"unreachable: {fetcher.down[index]}",
            }
            raise PlanError(only_refusals_message(name, [refusal], "wheels.dependency_indexes", [index]))
    kept = [i for i in wheels["indexes"] if i["name"] not in fetcher.down]
    if not kept:
        raise PlanError(
            "no index of the profile can be reached: " + "; ".join(f"{i}: {r}" for i, r in fetcher.down.items())
        )
    return {**wheels, "indexes": kept}


def check_dependency_indexes(fetcher: Fetcher, wheels: dict) -> None:
    """Each dependency the profile names one index for (``dependency_indexes``) must be served by it: uv would
    fail without saying which index refused, or (an unreachable index left out) take it from another one."""
    urls = {i["name"]: i["url"] for i in wheels["indexes"]}
    for name, index in (wheels.get("dependency_indexes") or {}).items():
        try:
            fetcher.listing(index, urls[index], name)
        except IndexDown:
            pass
        refusals = refusals_of(fetcher, name, [index], urls)
        if refusals:
            raise PlanError(only_refusals_message(name, refusals, "wheels.dependency_indexes", [index]))


def find_uv(uv_path: str | None = None) -> str:
    for candidate in (uv_path, os.path.join(os.path.dirname(sys.executable), "uv"), shutil.which("uv")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise PlanError("uv is not installed on the controller; install it next to ansible-core (pip install uv)")


def uv_platform(platform: str) -> str:
    arch, _sep, rest = platform.partition("-")
    return f"{arch}-unknown-linux-gnu" if rest == "linux" else platform


def uv_compile(uv: str, requirements: list, wheels: dict, target: Target, **options) -> list:
    """Resolve ``requirements`` with uv over the profile's indexes; returns pylock packages (name, version, files).

    ``overrides`` (requirement strings: the profile's wheels.overrides, a chosen profile package as ``name @ url``)
    go to uv as ``--overrides``: they replace what any package's METADATA pins on those packages, dependencies of
    dependencies included. Where the indexes are searched is ``uv_args``'s business. ``options``: ``overrides``,
    ``cache_dir`` (uv's cache, ``PlanCache``), ``timeout`` (seconds, default 600)."""
    with tempfile.TemporaryDirectory(prefix="gpufleet-plan-") as tmp:
        out = os.path.join(tmp, "pylock.toml")
        args = ["--format", "pylock.toml", "-o", out]
        _run_uv(uv, requirements, wheels, target, tmp, args, **options)
        with open(out, "rb") as handle:
            return tomllib.load(handle).get("packages", [])


def uv_graph(uv: str, requirements: list, wheels: dict, target: Target, **options) -> dict:
    """The dependency graph of the same resolution as ``uv_compile`` ({package: [packages that require it]}), read
    from uv's own "# via" annotations: a pylock records no dependencies. Run right after ``uv_compile``, uv answers
    it offline from the pages and metadata it has just cached (seconds, where asking the indexes again costs as long
    as the resolution did); online only when that cache is gone."""
    with tempfile.TemporaryDirectory(prefix="gpufleet-plan-") as tmp:
        out = os.path.join(tmp, "requirements.txt")
        args = ["--annotation-style", "line", "-o", out]
        try:
            _run_uv(uv, requirements, wheels, target, tmp, ["--offline", *args], **options)
        except PlanError:
            _run_uv(uv, requirements, wheels, target, tmp, args, **options)
        with open(out) as handle:
            return parse_uv_graph(handle.read())


def uv_args(wheels: dict, target: Target) -> list:
    """Where uv looks: the profile's default index (``is_default``, else its last) and every other one, by best
    version across all of them (``--index-strategy unsafe-best-match``): uv's default takes a package from the first
    index that lists it, so an index that mirrors a dependency in old versions only (a CUDA index's torchao) would
    hide every newer one. All of them are the profile's own indexes, which the profile trusts. Profile packages are
    not looked up at all: each is given as the exact file the plan chose from the indexes the profile names for it."""
    indexes = wheels["indexes"]
    default = next((i for i in indexes if i.get("is_default")), indexes[-1])
    args = ["pip", "compile", "--no-config", "--no-build", "--quiet", "--index-strategy", "unsafe-best-match"]
    args += ["--default-index", default["url"]]
    for index in indexes:
        if index is not default:
            args += ["--index", index["url"]]
    return [*args, "--python-version", target.python_version, "--python-platform", uv_platform(target.platform)]


def plan_project(requirements: list, wheels: dict) -> str:
    """The pyproject.toml uv resolves: the requirements as the project's dependencies, and each of the profile's
    ``dependency_indexes`` as a dependency taken from that one index only (an explicit index with a
    ``tool.uv.sources`` entry; uv honours sources for a project's direct dependencies, so each is one)."""
    pinned = wheels.get("dependency_indexes") or {}
    urls = {i["name"]: i["url"] for i in wheels["indexes"]}
    deps = list(requirements) + [name for name in pinned if canonicalize_name(name) not in _names(requirements)]
    lines = ["[project]", 'name = "gpufleet-plan"', 'version = "0"', f"dependencies = {json.dumps(deps)}"]
    if pinned:
        lines.append("[tool.uv.sources]")
        lines += [
            f"{json.dumps(name)} = {{ index = {json.dumps('gpufleet-' + index)} }}" for name, index in pinned.items()
        ]
        for index in sorted(set(pinned.values())):
            lines += [
                "[[tool.uv.index]]",
                f"name = {json.dumps('gpufleet-' + index)}",
                f"url = {json.dumps(urls[index])}",
            ]
            lines.append("explicit = true")
    return "\n".join(lines) + "\n"


def _names(requirements: list) -> set:
    return {canonicalize_name(Requirement(r).name) for r in requirements}


def _run_uv(uv, requirements, wheels, target, tmp, output_args, overrides=(), cache_dir=None, timeout=600):
    # Nothing of uv's or pip's settings from the environment: index settings would bypass the profile, and the
    # cache is the plan's own (``plan_cache``).
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UV_", "PIP_"))}
    project = os.path.join(tmp, "pyproject.toml")
    with open(project, "w") as handle:
        handle.write(plan_project(requirements, wheels))
    args = [uv, *uv_args(wheels, target)]
    if cache_dir:
        args += ["--cache-dir", cache_dir]
    if overrides:
        overrides_txt = os.path.join(tmp, "overrides.txt")
        with open(overrides_txt, "w") as handle:
            handle.write("\n".join(overrides) + "\n")
        args += ["--overrides", overrides_txt]
    proc = subprocess.run(
        [*args, *output_args, project], capture_output=True, text=True, env=env, timeout=timeout, check=False
    )
    if proc.returncode != 0:
        raise PlanError(
            "uv could not resolve the dependencies of the chosen wheels over the profile's indexes"
            f" ({', '.join(i['name'] for i in wheels['indexes'])}): {proc.stderr.strip()}."
            f" {uv_fix(proc.stderr, wheels)}"
        )


def uv_fix(stderr: str, wheels: dict) -> str:
    """The fix line of a failed uv resolution: an index uv could not read, by name, else the package's pins."""
    named = [i for i in wheels["indexes"] if i["url"].rstrip("/") in stderr]
    if named:
        shown = ", ".join(f"{i['name']!r} ({i['url']})" for i in named)
        return (
            f"Fix: uv could not read index {shown}: check its URL and access, or map it to a mirror that answers with"
            " gpufleet_index_urls"
        )
    return (
        "Fix: the package uv names above is missing from these indexes or pinned in ways that contradict each"
        " other: name an index that carries it (wheels.dependency_indexes), pin a version in the profile, or"
        " replace the pin with wheels.overrides (with the reason)"
    )


def lock_entries(pylock: list, chosen: dict, target: Target, role: str) -> list:
    """One entry per package: the chosen file for profile packages, the best-fitting wheel for dependencies."""
    by_name = {c.filename: c for c in chosen.values()}
    entries = []
    for pkg in pylock:
        name = canonicalize_name(pkg["name"])
        if "archive" in pkg:
            archive = pkg["archive"]
            url = urldefrag(archive.get("url") or archive["path"])[0]
            files = [{"url": url, "sha256": archive["hashes"].get("sha256")}]
        else:
            files = [{"url": w["url"], "sha256": (w.get("hashes") or {}).get("sha256")} for w in pkg.get("wheels", [])]
        wheel = pick_file(files, target)
        if wheel is None or not wheel.get("sha256"):
            raise PlanError(
                f"dependency {name}=={pkg.get('version')} has no wheel with a sha256 for Python {target.python_version}"
                f" on {target.platform} in the profile's indexes (the plan installs wheels only, hashes required);"
                " add an index that carries one or pin another version in the profile"
            )
        cand = by_name.get(wheel["filename"])
        entries.append(
            {
                "name": name,
                "version": str(pkg["version"]),
                "filename": wheel["filename"],
                "url": cand.url if cand else wheel["url"],
                "sha256": cand.sha256 if cand and cand.sha256 else wheel["sha256"],
                "index": cand.index if cand else None,
                "size": cand.size if cand else None,
                "role": role if cand is None else "profile",
                "sha256_source": cand.sha256_source if cand else "index",
            }
        )
    return sorted(entries, key=lambda e: e["name"])


def make_lock(
    profile: dict,
    target: Target,
    fetcher: Fetcher,
    uv: str,
    tools=("uv",),
    today=None,
    wheelhouse=None,
    cache_dir=None,
    reuse_wheelhouse=None,
) -> dict:
    """Probe, resolve, lock. With ``wheelhouse`` the chosen wheels are fetched there first and uv resolves their
    dependencies from those files, so no wheel is downloaded twice (once by uv, once for the hosts). ``cache_dir``
    (the controller's ``cache`` folder) keeps uv's cache (``PlanCache``, pruned after the plan) and the hashes the
    controller computed (``UrlHashRecord``); without it both are the plan's own and gone after it.
    ``reuse_wheelhouse`` (check mode: the wheelhouse, which it does not write) gives uv the chosen wheels it already
    holds with their sha256, so uv reads them there instead of downloading them."""
    if cache_dir and fetcher.cache is None:
        # Index pages and METADATA, kept with their validators: a re-plan asks only whether they changed.
        fetcher.cache = ValidatorCache(cache_dir)
    with PlanCache(uv, cache_dir) as cache:
        computed = UrlHashRecord(cache_dir) if cache_dir else None
        where = {"fetch": wheelhouse, "reuse": reuse_wheelhouse, "uv_cache": cache.path}
        try:
            lock = _lock(profile, target, fetcher, uv, tools, today, where, computed)
        finally:
            if fetcher.cache is not None:
                fetcher.cache.save()
        if computed is not None:
            computed.save()
    lock["uv_cache"] = cache.summary()
    lock["index_requests"] = {
        "requests": fetcher.requests,
        "conditional": fetcher.conditional,
        "not_modified": fetcher.revalidated,
        "metadata_by_sha256": fetcher.metadata_by_sha256,
    }
    return lock


def _lock(profile, target, fetcher, uv, tools, today, where, computed):
    wheelhouse, uv_cache = where["fetch"], where["uv_cache"]
    wheels = profile["wheels"]
    rules_by_pkg, rules = rules_from_profile(wheels)
    cands = probe(fetcher, wheels, rules_by_pkg, target)
    metadata_of = _metadata_memo(fetcher)
    chosen, report = resolve_plan(rules_by_pkg, cands, rules, target, metadata_of, today=today)
    refusals = index_refusals(fetcher, rules_by_pkg, wheels, chosen)
    check_dependency_indexes(fetcher, wheels)
    wheels = reachable_wheels(fetcher, wheels)
    record = HashRecord(wheelhouse) if wheelhouse else None
    # A link without a sha256 or a republished file name: the lock takes the hash of the file the index serves.
    note_listings(report, rules_by_pkg, fetcher, settle_hashes(fetcher, chosen, wheelhouse, record, computed))
    pins = {}
    held = HashRecord(where["reuse"]) if where["reuse"] and not wheelhouse else None
    for key, cand in chosen.items():
        if wheelhouse:
            path = os.path.join(wheelhouse, cand.filename)
            fetcher.download(cand.url, path, cand.sha256, record)
            pins[key] = f"{cand.project} @ {pathlib.Path(path).resolve().as_uri()}"
        elif (
            held
            and os.path.isfile(os.path.join(held.folder, cand.filename))
            and held.sha256(cand.filename) == cand.sha256
        ):
            pins[key] = f"{cand.project} @ {pathlib.Path(held.folder, cand.filename).resolve().as_uri()}"
        else:
            # With its sha256 (settled above) uv reads the wheel's METADATA by range and is done: without it, uv
            # downloads the whole wheel (GBs for a CUDA stack) in every check-mode plan to hash it for the pylock.
            pins[key] = f"{cand.project} @ {urldefrag(cand.url)[0]}#sha256={cand.sha256}"
    if record:
        record.save()
    # uv applies an override to the direct requirements too: an overridden profile package is overridden with the
    # very file the plan chose (a version override would send uv back to the indexes for it), any other package
    # with the profile's requirement.
    overrides = [pins.get(key, str(o.requirement)) for key, o in rules.overrides.items()]
    pins = list(pins.values())
    uv_kw = {"overrides": overrides, "cache_dir": uv_cache}
    packages = lock_entries(uv_compile(uv, pins, wheels, target, **uv_kw), chosen, target, "dependency")
    graph = uv_graph(uv, pins, wheels, target, **uv_kw)
    # The chosen wheels are in the wheelhouse by now: a compiled one whose name and version carry no CUDA is
    # judged by the CUDA libraries its shared objects link.
    rules_report = finish_lock(profile, packages, graph, target, metadata_of, wheelhouse=wheelhouse or where["reuse"])
    # Who required what: the post-fetch judgement (judge_fetched) names it for a wheel read only then.
    rules_report["required_by"] = graph
    tool_entries = (
        lock_entries(uv_compile(uv, list(tools), wheels, target, cache_dir=uv_cache), {}, target, "tool")
        if tools
        else []
    )
    mark_uv_hashes(packages + tool_entries, fetcher, wheels)
    digest = lock_hash(packages, target)
    return {
        "schema": LOCK_SCHEMA,
        "profile": profile["name"],
        "python": target.python_version,
        "platform": target.platform,
        "hash": digest,
        "hash12": digest[:12],
        "venv_name": f"{profile['name']}-{digest[:12]}",
        "generated_at": _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
        "packages": packages,
        "tools": tool_entries,
        "overrides": override_records(rules, report),
        "index_refusals": refusals,
        "report": report,
        "lock_rules": rules_report,
    }


class PlanCache:
    """uv's cache for a plan: ``<cache_dir>/uv`` on the controller, where the operator sees it, or a temporary
    folder removed after the plan when there is no ``cache_dir``. After the plan the wheels uv downloaded and
    unpacked go (its ``archive-v*`` folders and the links to them: a real stack's torch and CUDA libraries, GBs per
    plan, kept by uv for installs the controller never makes); the index pages and the METADATA uv read of every
    wheel stay, so a later plan revalidates the pages and reads no METADATA again. (``uv cache prune --ci`` would
    drop that METADATA too: a re-plan read every dependency's METADATA again, by range.) ``summary`` says how many
    bytes the cache holds after the plan."""

    def __init__(self, uv: str, cache_dir: str | None):
        self.uv = uv
        self.temporary = not cache_dir
        self.path = tempfile.mkdtemp(prefix="gpufleet-uv-cache-") if self.temporary else os.path.join(cache_dir, "uv")
        self.pruned = None

    def __enter__(self):
        os.makedirs(self.path, exist_ok=True)
        return self

    def __exit__(self, *exc):
        if self.temporary:
            shutil.rmtree(self.path, ignore_errors=True)
            return False
        try:
            drop_unpacked_wheels(self.path)
            self.pruned = "pruned"
        except OSError as err:
            self.pruned = f"removing the unpacked wheels failed: {err}"
        return False

    def summary(self) -> dict:
        if self.temporary:
            return {"path": None, "bytes": 0, "pruned": "temporary, removed after the plan"}
        return {"path": self.path, "bytes": folder_bytes(self.path), "pruned": self.pruned}


def drop_unpacked_wheels(path: str) -> None:
    """Remove from uv's cache at ``path`` the wheels it unpacked (``archive-v*``) and every entry that points into
    them (links, ``.rev`` revisions of local wheels, ``.http`` records of downloaded wheels, which uv would follow to
    an archive that is gone instead of reading the wheel again); what uv keeps of the indexes stays: the pages
    (``simple-v*``) and the METADATA it read of each wheel (``.msgpack``)."""
    for name in os.listdir(path):
        if name.startswith("archive-v"):
            shutil.rmtree(os.path.join(path, name))
    for root, dirs, files in os.walk(path):
        wheels = os.path.relpath(root, path).split(os.sep)[0].startswith("wheels-v")
        for name in dirs + files:
            entry = os.path.join(root, name)
            if os.path.islink(entry) or (wheels and name.endswith((".rev", ".http"))):
                os.unlink(entry)


def folder_bytes(path: str) -> int:
    """Bytes of the files under ``path`` (links not followed)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def mark_uv_hashes(entries: list, fetcher: Fetcher, wheels: dict) -> None:
    """Mark the dependencies whose sha256 uv computed (``sha256_source: uv``): uv downloads and hashes a file its
    index lists without one. Only hosts that listed such a file during the probe (``Fetcher.unhashed_hosts``) are
    asked, one listing per dependency they serve; a dependency from any other host has the hash its index gave."""
    if not fetcher.unhashed_hosts:
        return
    hosts = {urlsplit(i["url"]).netloc: [] for i in wheels["indexes"]}
    for index in wheels["indexes"]:
        hosts[urlsplit(index["url"]).netloc].append(index)
    for entry in entries:
        netloc = urlsplit(entry["url"]).netloc
        if entry["sha256_source"] != "index" or netloc not in fetcher.unhashed_hosts:
            continue
        for index in hosts.get(netloc, []):
            listing = fetcher.listing(index["name"], index["url"], entry["name"])
            listed = [c for c in listing if c.filename == entry["filename"]]
            if listed:
                if not listed[0].sha256:
                    entry["sha256_source"] = "uv"
                break


def note_listings(report: dict, rules_by_pkg: list, fetcher: Fetcher, hashes: dict) -> None:
    """Into the plan report: per package the hash settled by download (``_index.settle_hashes``) and the indexes
    that do not carry it (``Fetcher.not_carried``: an HTTP 403 or 404 for its listing)."""
    for rule in rules_by_pkg:
        rep = report[rule.name]
        if rule.key in hashes:
            rep["hash"] = hashes[rule.key]
        for index in rule.indexes:
            if (index, rule.key) in fetcher.not_carried:
                rep["sources"][index] = dict(rep["sources"][index], not_carried=fetcher.not_carried[(index, rule.key)])


def _metadata_memo(fetcher: Fetcher):
    """fetcher.metadata read once per file: the plan and the lock rules both read a chosen wheel's METADATA."""
    seen = {}

    def metadata_of(cand):
        if cand.filename not in seen:
            seen[cand.filename] = fetcher.metadata(cand)
        return seen[cand.filename]

    return metadata_of


def finish_lock(profile: dict, packages: list, graph: dict, target: Target, metadata_of, wheelhouse=None) -> dict:
    """The lock rules (``_lock_rules.judge_lock``: companions paired, one CUDA major) over the resolved packages,
    before anything is written: raises LockRefused naming the pair or the package and who required it. METADATA is
    read only for the packages the pairing needs (the profile's companions, compiled wheels that require torch)."""
    companions = companions_from_profile(profile["wheels"].get("rules") or {})
    by_name = {e["name"]: e for e in packages}
    requires = {}
    for name in metadata_wanted(packages, companions, graph):
        entry = by_name[name]
        # With the locked sha256 its METADATA is read once and kept by it (_index.Fetcher.metadata).
        cand = make_candidate(entry.get("index") or "lock", entry["filename"], entry["url"], sha256=entry["sha256"])
        requires[name] = declared_requirements(metadata_of(cand), target)
    return judge_lock(packages, graph, requires, profile, wheelhouse=wheelhouse)


def fetch_wheelhouse(fetcher: Fetcher, lock: dict, wheelhouse: str, profile: dict | None = None) -> dict:
    """Every locked wheel once into the controller's wheelhouse, sha256 verified; hosts install from copies. A wheel
    already there is hashed only if it changed since its hash was recorded (``_index.HashRecord``). With
    ``profile``, the wheels fetched only now (dependencies uv chose) are judged by the one-CUDA-major rule from
    their shared objects (``judge_fetched``): raises LockRefused before the caller writes the lock."""
    fetched, reused, nbytes = [], [], 0
    record = HashRecord(wheelhouse)
    try:
        for entry in lock["packages"] + lock["tools"]:
            dest = os.path.join(wheelhouse, entry["filename"])
            if fetcher.download(entry["url"], dest, entry["sha256"], record):
                fetched.append(entry["filename"])
            else:
                reused.append(entry["filename"])
            entry["size"] = os.path.getsize(dest)
            nbytes += entry["size"]
    finally:
        record.save()
    note_installed_sizes(lock, wheelhouse)
    if profile is not None:
        judge_fetched(lock, profile, wheelhouse)
    return {"path": wheelhouse, "fetched": fetched, "reused": reused, "bytes": nbytes}


def judge_fetched(lock: dict, profile: dict, wheelhouse: str) -> None:
    """The one-CUDA-major rule over every compiled wheel of the lock, read from the wheelhouse that holds them all
    now (``_lock_rules.judge_after_fetch``); the rows join the lock's ``lock_rules`` report. Raises LockRefused."""
    judge_after_fetch(lock["packages"], profile, wheelhouse, lock.setdefault("lock_rules", {}))


def installed_size(path: str) -> int | None:
    """What a wheel takes once installed: the sum of its zip members' uncompressed sizes (read from the zip's
    central directory, not unpacked); None when the file is not a readable zip."""
    try:
        with zipfile.ZipFile(path) as archive:
            return sum(info.file_size for info in archive.infolist())
    except (OSError, zipfile.BadZipFile):
        return None


def note_installed_sizes(lock: dict, wheelhouse: str, names=None) -> None:
    """Give each lock entry whose wheel the controller's wheelhouse holds (``names``: those checked, default every
    file there) its ``installed_size``; an entry whose wheel is not at hand has none (preflight then sizes the new
    venv from the current one)."""
    for entry in lock["packages"] + lock["tools"]:
        path = os.path.join(wheelhouse, entry["filename"])
        if (names is None or entry["filename"] in names) and os.path.isfile(path):
            size = installed_size(path)
            if size is not None:
                entry["installed_size"] = size
                continue
        entry.pop("installed_size", None)


def verify_wheelhouse(lock: dict, wheelhouse: str) -> list:
    """Files of the lock missing from the wheelhouse or with another sha256 (check mode: an audit reads the
    wheelhouse this way; files unchanged since their hash was recorded are not read)."""
    bad = []
    record = HashRecord(wheelhouse)
    for entry in lock["packages"] + lock["tools"]:
        path = os.path.join(wheelhouse, entry["filename"])
        if not os.path.exists(path) or record.sha256(entry["filename"]) != entry["sha256"]:
            bad.append(entry["filename"])
    if os.path.isdir(wheelhouse):
        record.save()
    good = {e["filename"] for e in lock["packages"] + lock["tools"]} - set(bad)
    note_installed_sizes(lock, wheelhouse, good)
    return bad


def report_lines(lock: dict) -> list:
    """The human report: per profile package what was chosen and why, stale sources, candidates seen."""
    lines = [
        f"wheel plan for profile {lock['profile']} (Python {lock['python']}, {lock['platform']}): {lock['venv_name']}"
    ]
    lines += [refusal_line(r) for r in lock.get("index_refusals") or []]
    for override in lock.get("overrides", []):
        replaced = ", ".join(f"{r['pin']} (by {r['by']})" for r in override["replaced"]) or "no pin of a chosen wheel"
        lines.append(f"override {override['requirement']}: {override['reason']}; replaces {replaced}")
    for name, rep in lock["report"].items():
        lines.append(f"{name}: {rep['why']}")
        for index, src in rep["sources"].items():
            if src.get("not_carried"):
                lines.append(f"  source {index}: not carried by this index ({src['not_carried']} for the project)")
                continue
            if src["stale"]:
                state = f"STALE ({src['reason']})"
            elif src["undatable"]:
                state = f"UNDATABLE, {'refused' if src.get('undatable_policy') == 'refuse' else 'allowed'}"
            else:
                state = "ok"
            lines.append(
                f"  source {index}: {src['count']} file(s), newest build {src['newest'] or 'undated'}"
                f" (release {src.get('newest_release') or '-'}): {state}"
            )
        if rep.get("hash"):
            lines.append(f"  {hash_note(rep['hash'])}")
        for cand in rep["candidates"]:
            again = f", republished: {cand['republished']} hashes listed" if cand.get("republished") else ""
            lines.append(
                f"    {cand['index']}: {cand['filename']} ({cand['date'] or 'undated'}{again}): {cand['status']}"
            )
    lines += lock_rule_lines(lock.get("lock_rules") or {})
    deps = [e for e in lock["packages"] if e["role"] == "dependency"]
    if deps:
        lines.append("dependencies (resolved by uv): " + ", ".join(f"{e['name']}=={e['version']}" for e in deps))
    lines += hash_source_lines(lock["packages"] + (lock.get("tools") or []))
    cache = lock.get("uv_cache")
    if cache:
        where = cache["path"] or "a temporary folder"
        lines.append(f"uv cache {where}: {cache['bytes']} bytes after the plan ({cache['pruned']})")
    return lines


SHA256_SOURCES = {"controller": "computed by the controller", "uv": "computed by uv"}


def hash_source_lines(entries: list) -> list:
    """Which locked hashes no index served (the index listed the file without a sha256): computed by the controller
    (a profile package, ``_index.settle_hashes``) or by uv (a dependency uv downloaded to hash it)."""
    lines = []
    for source, words in SHA256_SOURCES.items():
        names = [f"{e['filename']} ({e['sha256'][:12]})" for e in entries if e.get("sha256_source") == source]
        if names:
            lines.append(f"sha256 {words}, not served by the index: {', '.join(names)}")
    return lines
