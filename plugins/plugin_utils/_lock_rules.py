# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Rules a finished wheel lock must keep before it is written: companions paired, one CUDA major. Pure functions.

uv resolves what fits the requirements; an override (the profile's ``wheels.overrides``, as the CUDA 13 stack
overrides the torch an application pins) frees every package from its pin on the overridden one, and uv then
takes whatever fits. Two kinds of lock come out of that which install cleanly and fail only when the server
starts:

- a companion built against another release of the package it extends: torchvision, torchaudio, torchcodec and
  the kernel wheels (sgl-kernel, sglang-kernel, flashinfer-jit-cache) each load C++ code built against one torch;
  on another one they fail at import or at their first operator. Pairs come from the profile
  (``wheels.rules.companions``) and from the companion's own METADATA: every ``Requires-Dist`` on torch is held
  against the locked torch (``torch>=2.14.0`` refuses torch 2.11.0 as ``torch==2.11.0`` refuses 2.9.1); an
  override only changed what uv resolved, never the wheel's METADATA, so it cannot hide such a requirement.
- packages built for different CUDA majors: a cu128 companion beside a cu130 torch, ``nvidia-*-cu12`` libraries
  beside the CUDA 13 ones. Every package built for a CUDA release must be built for the profile's
  ``cuda.version`` major, unless ``wheels.rules.cuda_exceptions`` allows it with a reason. A package whose name and
  version say nothing of CUDA (sglang-kernel 0.4.10) is judged, where its wheel is on the controller, by the CUDA
  libraries its shared objects link (``_elf``: ``libcudart.so.13`` is CUDA 13's). A wheel that carries one build per
  CUDA major and chooses at import (``_elf.runtime_builds``) passes where it has a build for the profile's major.

What the rules could not judge is listed, never passed over in silence: a compiled wheel not yet on the controller
(a plan in check mode or without the fetch does not download it; the plan that fetches reads it then), and a
compiled wheel that links torch's libraries while neither its METADATA nor the profile says which torch it pairs
with (``unjudged``).

The dependency graph (who requires whom) comes from uv's own annotations of the same resolution
(``parse_uv_graph``), so a refusal names the package and the chain that brought it in.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from ansible_collections.gpufleet.upgrade.plugins.plugin_utils._elf import HAS_ELFTOOLS, ElfReadError, wheel_links
from ansible_collections.gpufleet.upgrade.plugins.plugin_utils._wheels import HAS_PACKAGING, PlanError

if HAS_PACKAGING:  # else the action plugin reports _wheels' import error before it plans anything
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
    from packaging.version import InvalidVersion, Version

DEFAULT_WITH = "torch"
# Where a dependent in uv's "# via" annotation is not a package: the plan's own requirements or an override file.
ROOT = "the plan's requirements"
OVERRIDE = "the profile's overrides"
_LOCAL_CUDA = re.compile(r"^cu(\d{2,3})$")
_NAME_CUDA = re.compile(r"-cu(?:da)?(\d{2})x?$")  # nvidia-cublas-cu12, cupy-cuda12x
# NVIDIA's CUDA component wheels without a -cuNN suffix are the CUDA 13 generation (CUDA 12's carry -cu12). Those
# whose version is the CUDA release they belong to (nvidia-cuda-runtime 13.0.96) are read by version; the
# libraries numbered on their own (nvidia-cufft 12.0, nvidia-curand 10.4, nvidia-cusolver 12.0, nvidia-cusparse
# 12.6, nvidia-cufile 1.15) by generation only.
VERSION_IS_CUDA = frozenset(
    {
        "nvidia-cuda-runtime",
        "nvidia-cuda-nvrtc",
        "nvidia-cuda-cupti",
        "nvidia-cuda-nvcc",
        "nvidia-cuda-cccl",
        "nvidia-cuda-crt",
        "nvidia-cuda-cuobjdump",
        "nvidia-cuda-nvdisasm",
        "nvidia-cuda-sanitizer-api",
        "nvidia-cuda-opencl",
        "nvidia-cublas",
        "nvidia-nvjitlink",
        "nvidia-nvtx",
        "nvidia-nvvm",
        "nvidia-npp",
        "nvidia-nvjpeg",
        "nvidia-nvml-dev",
        "cuda-python",
        "cuda-bindings",
        "cuda-toolkit",
    }
)
UNSUFFIXED_GENERATION = 13
GENERATION_ONLY = frozenset({"nvidia-cufft", "nvidia-curand", "nvidia-cusolver", "nvidia-cusparse", "nvidia-cufile"})
# Packages whose own name and version carry no CUDA, built for the CUDA of the NVIDIA libraries they require
# (a torch from the default index has no local tag; its Requires-Dist names nvidia-cuda-runtime 13.0.x or -cu12).
BUILT_FOR_REQUIRED_CUDA = frozenset({"torch"})


class LockRefused(PlanError):
    """A lock that breaks a lock rule; the message names both packages, their versions and the fix."""


@dataclass
class Companion:
    """A package built against one release of another (wheels.rules.companions)."""

    package: str
    with_: str = DEFAULT_WITH
    versions: dict = field(default_factory=dict)  # release prefix of with_ -> release prefix of package
    reason: str = ""


# --- the profile's rules ----------------------------------------------------------------------------------


def companions_from_profile(rules: dict) -> dict:
    """wheels.rules.companions as Companion by canonical package name."""
    out = {}
    for entry in rules.get("companions") or []:
        comp = Companion(
            package=canonicalize_name(entry["package"]),
            with_=canonicalize_name(entry.get("with") or DEFAULT_WITH),
            versions={str(k): str(v) for k, v in (entry.get("versions") or {}).items()},
            reason=str(entry.get("reason") or ""),
        )
        out[comp.package] = comp
    return out


def exceptions_from_profile(rules: dict) -> dict:
    """wheels.rules.cuda_exceptions as {canonical name: reason}."""
    return {canonicalize_name(e["package"]): str(e["reason"]) for e in rules.get("cuda_exceptions") or []}


# --- the dependency graph ---------------------------------------------------------------------------------


def parse_uv_graph(text: str) -> dict:
    """{package: [dependents]} from ``uv pip compile --annotation-style line`` output (``name==1.0  # via a, b``).
    A dependent that is the plan's own requirements file or project becomes ROOT, an override file OVERRIDE."""
    graph = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#") or "# via " not in line:
            continue
        spec, _sep, via = line.partition("# via ")
        name = re.split(r"\s*(?:===|==|@|\[|;|\s)", spec.strip(), maxsplit=1)[0]
        dependents = []
        for item in via.split(", "):
            item = item.strip()
            if item.startswith(("--override", "--overrides")):
                dependents.append(OVERRIDE)
            elif item.startswith("-r ") or item.startswith("-c ") or "(" in item or item.endswith(".toml"):
                dependents.append(ROOT)
            elif item:
                dependents.append(canonicalize_name(re.split(r"[\[\s]", item, maxsplit=1)[0]))
        graph[canonicalize_name(name)] = sorted(set(dependents))
    return graph


def requirements_of(graph: dict) -> dict:
    """The reverse of parse_uv_graph: {package: [packages it requires]}."""
    out = {}
    for name, dependents in graph.items():
        for dep in dependents:
            if dep not in (ROOT, OVERRIDE):
                out.setdefault(dep, []).append(name)
    return {k: sorted(v) for k, v in out.items()}


def required_by(name: str, graph: dict, versions: dict) -> str:
    """Who brought a package into the lock, in words: its direct dependents, then one chain up to the plan's own
    requirements (``torchvision 0.24.1 <- sglang 0.5.9 <- the plan's requirements``)."""
    direct = [d for d in graph.get(name, []) if d != OVERRIDE]
    if not direct:
        return "named by the profile's overrides only" if name in graph else "uv's graph names no package requiring it"
    chain, seen, here = [], {name}, name
    while ROOT not in direct:  # a package the plan asks for itself needs no chain
        ups = [d for d in graph.get(here, []) if d not in seen and d != OVERRIDE]
        if not ups:
            break
        up = ROOT if ROOT in ups else ups[0]
        chain.append(up if up == ROOT else f"{up} {versions.get(up, '?')}")
        if up == ROOT:
            break
        seen.add(up)
        here = up
    shown = ", ".join(d if d == ROOT else f"{d} {versions.get(d, '?')}" for d in direct)
    return f"required by {shown}" + (f" (chain: {name} <- {' <- '.join(chain)})" if chain else "")


# --- CUDA -------------------------------------------------------------------------------------------------


def _major_from_digits(digits: str) -> int:
    """cu130 -> 13, cu128 -> 12, cu118 -> 11, cu92 -> 9: the last digit is the minor release."""
    return int(digits[:-1])


def own_cuda(name: str, version: str) -> tuple | None:
    """(CUDA major, how it was read) from a package's own name and version, or None when they carry no CUDA."""
    name = canonicalize_name(name)
    try:
        parsed = Version(version)
    except InvalidVersion:
        parsed = None
    if parsed is not None and parsed.local:
        for part in parsed.local.split("."):
            match = _LOCAL_CUDA.match(part)
            if match:
                return _major_from_digits(match.group(1)), f"local tag {part}"
    match = _NAME_CUDA.search(name)
    if match and (name.startswith("nvidia-") or "cuda" in name or name.startswith("cupy")):
        return int(match.group(1)), f"name suffix {match.group(0)}"
    if name in VERSION_IS_CUDA and parsed is not None:
        return parsed.release[0], f"version {version}"
    if name in GENERATION_ONLY:
        return UNSUFFIXED_GENERATION, "unsuffixed NVIDIA library"
    return None


def wheel_files(entries: list, wheelhouse: str | None) -> dict:
    """{package: path} for the lock's compiled wheels present in the controller's wheelhouse."""
    if not wheelhouse:
        return {}
    out = {}
    for entry in entries:
        path = os.path.join(wheelhouse, entry["filename"])
        if is_platform_wheel(entry["filename"]) and os.path.isfile(path):
            out[entry["name"]] = path
    return out


def _elf_wanted(entries: list, table: dict, files: dict) -> list:
    """The entries whose CUDA only their shared objects can tell: a wheel on the controller, no CUDA in the name or
    version, and not judged by what it requires (torch)."""
    return [e for e in entries if e["name"] in files and e["name"] not in set(table) | BUILT_FOR_REQUIRED_CUDA]


def unread_cuda(entries: list, table: dict, files: dict) -> list:
    """The packages of _elf_wanted left unjudged because pyelftools is not installed on the controller."""
    return [] if HAS_ELFTOOLS else [f"{e['name']} {e['version']}" for e in _elf_wanted(entries, table, files)]


def not_on_controller(entries: list, table: dict, files: dict) -> list:
    """The compiled wheels whose CUDA only their shared objects could tell, not in the controller's wheelhouse (so
    not read): ``name version`` each."""
    wanted = {e["name"] for e in _elf_wanted(entries, table, {e["name"]: "" for e in entries})}
    return [
        f"{e['name']} {e['version']}"
        for e in entries
        if e["name"] in wanted and e["name"] not in files and is_platform_wheel(e["filename"])
    ]


def linked_cuda(entries: list, table: dict, files: dict) -> dict:
    """Add to ``table`` the packages whose CUDA only their shared objects tell (the CUDA libraries their DT_NEEDED
    entries name), for the wheels in ``files``. Returns, for every wheel read, the torch library it links
    (``_elf.torch_linked``: ``libc10.so in pkg/ops.so``), or "" where it links none of torch's."""
    if not HAS_ELFTOOLS:
        return {}
    torch_links = {}
    for entry in _elf_wanted(entries, table, files):
        try:
            found = wheel_links(files[entry["name"]])
        except ElfReadError as exc:
            raise LockRefused(f"{exc}: its CUDA cannot be judged. Fix: delete the file and plan again") from exc
        torch_links[entry["name"]] = found["torch"] or ""
        if found["cuda"] is None:
            continue
        row = {"version": entry["version"], "cuda": found["cuda"], "from": f"from {found['evidence']}"}
        if found["builds"]:
            builds = found["builds"]
            row["builds"] = {str(m): members for m, members in builds["by_major"].items()}
            row["from"] = (
                f"a build per CUDA major, chosen at import by its own code ({builds['chooser']}); "
                + "; ".join(f"CUDA {m}: {', '.join(ms)}" for m, ms in builds["by_major"].items())
            )
            if builds["untagged"]:
                row["from"] += "; untagged copies: " + ", ".join(
                    f"{m} (CUDA {major})" for m, major in sorted(builds["untagged"].items())
                )
        table[entry["name"]] = row
    return torch_links


def cuda_table(entries: list, graph: dict, files: dict | None = None, torch_links: dict | None = None) -> dict:
    """{package: {"version", "cuda" (major), "from"}} for every package of the lock built for a CUDA release.
    ``files`` ({package: wheel path}, see wheel_files) lets the packages that carry no CUDA in their name or
    version be judged by their shared objects (linked_cuda); ``torch_links`` (a dict) receives linked_cuda's
    answer (per wheel read, the torch library it links or "")."""
    versions = {e["name"]: e["version"] for e in entries}
    table = {}
    for entry in entries:
        found = own_cuda(entry["name"], entry["version"])
        if found:
            table[entry["name"]] = {"version": entry["version"], "cuda": found[0], "from": found[1]}
    links = linked_cuda(entries, table, files or {})
    if torch_links is not None:
        torch_links.update(links)
    needs = requirements_of(graph)
    for entry in entries:
        if entry["name"] in table or entry["name"] not in BUILT_FOR_REQUIRED_CUDA:
            continue
        libs = {dep: table[dep]["cuda"] for dep in needs.get(entry["name"], []) if dep in table}
        if libs:
            majors = sorted(set(libs.values()))
            shown = ", ".join(f"{d} {versions[d]}" for d in sorted(libs))
            table[entry["name"]] = {
                "version": entry["version"],
                "cuda": majors[0] if len(majors) == 1 else majors,
                "from": f"the CUDA libraries it requires ({shown})",
            }
        else:
            # A CPU build (+cpu, or a plain wheel that requires no CUDA library) in a CUDA stack runs no kernel.
            table[entry["name"]] = {
                "version": entry["version"],
                "cuda": None,
                "from": "no local tag cuNNN and no CUDA library among what it requires: a build without CUDA",
            }
    return table


def judge_cuda(table: dict, cuda_version: str, exceptions: dict, graph: dict, versions: dict) -> tuple:
    """(problems, allowed): packages built for another CUDA major than the profile's, each named with who required
    it; those the profile allows (cuda_exceptions) are listed apart with the profile's reason."""
    want = int(str(cuda_version).split(".", maxsplit=1)[0])
    problems, allowed = [], []
    for name in sorted(table):
        row = table[name]
        if row["cuda"] == want:
            continue
        if row.get("builds"):
            if str(want) in row["builds"]:
                continue  # carries a build for the profile's CUDA and loads it there (report_lines shows which)
            seen = (
                f"{name} {row['version']} carries builds for CUDA {_majors_words(row['cuda'])} only ({row['from']}),"
                f" none for CUDA {want}"
            )
        elif row["cuda"] is None:
            seen = f"{name} {row['version']} is built for no CUDA ({row['from']})"
        else:
            seen = f"{name} {row['version']} is built for CUDA {_majors_words(row['cuda'])} ({row['from']})"
        if name in exceptions:
            allowed.append(f"{seen}: allowed by wheels.rules.cuda_exceptions: {exceptions[name]}")
            continue
        if ROOT in graph.get(name, []):  # a package the plan asked for itself: a profile package
            fix = f"choose a CUDA {want} build of {name} in wheels.packages (its local_tag, or an index of such builds)"
        else:
            fix = f"pin or override the package that requires it to a CUDA {want} build (an index or local tag of such)"
        problems.append(
            f"{seen}, the profile's CUDA is {cuda_version}; {required_by(name, graph, versions)}. Fix: {fix}, or allow"
            f" it with wheels.rules.cuda_exceptions: [{{package: {name}, reason: ...}}]"
        )
    return problems, allowed


def _majors_words(cuda) -> str:
    """13 -> "13"; [12, 13] -> "12 and 13"."""
    return str(cuda) if isinstance(cuda, int) else " and ".join(str(m) for m in cuda)


# --- companions -------------------------------------------------------------------------------------------


def is_platform_wheel(filename: str) -> bool:
    """Whether a wheel carries compiled code for a platform (its tags name one), as kernel wheels and torchvision
    do; a py3-none-any wheel is built against nothing."""
    try:
        _name, _version, _build, tags = parse_wheel_filename(filename)
    except InvalidWheelFilename:
        return False
    return any(tag.platform != "any" for tag in tags)


def metadata_wanted(entries: list, companions: dict, graph: dict) -> list:
    """Packages of the lock whose METADATA the pairing check reads: the profile's companions, and every compiled
    wheel that requires a package companions are built against (torch by default), such as a kernel wheel."""
    names = {e["name"] for e in entries}
    withs = {DEFAULT_WITH} | {c.with_ for c in companions.values()}
    needs = requirements_of(graph)
    out = []
    for entry in entries:
        name = entry["name"]
        if name in companions and companions[name].with_ in names:
            out.append(name)
        elif is_platform_wheel(entry["filename"]) and set(needs.get(name, [])) & withs:
            out.append(name)
    return sorted(out)


def _requirements_on(requires: list, target: str) -> list:
    """Every Requires-Dist of a package on ``target`` that bounds its version (``torch==2.11.0``, ``torch>=2.14.0``),
    as Requirement objects; a bare ``torch`` says nothing of which torch."""
    out = []
    for req in requires:
        if not isinstance(req, Requirement):
            try:
                req = Requirement(str(req))
            except InvalidRequirement:
                continue
        if canonicalize_name(req.name) == target and len(req.specifier):
            out.append(req)
    return out


def _is_pin(req) -> bool:
    return any(s.operator in ("==", "===") for s in req.specifier)


def _release(version: str) -> tuple:
    return Version(version).release


def _table_pair(comp: Companion, with_version: str) -> tuple | None:
    """(with's release prefix, package's release prefix) the profile's table gives for this release of with, the
    longest matching prefix; None when the table has no row for it."""
    have = _release(with_version)
    rows = [(k, v) for k, v in comp.versions.items() if have[: len(_release(k))] == _release(k)]
    return max(rows, key=lambda kv: len(_release(kv[0]))) if rows else None


def judge_companions(entries: list, companions: dict, requires: dict) -> tuple:
    """(pairs, problems, bounds_only). ``requires``: {package: its Requires-Dist that apply on the target} for the
    packages of metadata_wanted. Every requirement of a package's METADATA on the package it is built against is held
    against the lock (a pin or a bound: ``torch>=2.14.0`` refuses torch 2.11.0), and so is the profile's table where
    it has a row for the locked release. A pair is judged by a pin or a table row; a profile companion that neither
    pairs with the locked release is refused; any other package that only a bound admits is in ``bounds_only``
    ({package: the line saying so}), for ``unjudged_lines``."""
    versions = {e["name"]: e["version"] for e in entries}
    pairs, problems, unjudged = [], [], {}
    for name in sorted(set(requires) | (set(companions) & set(versions))):
        if name not in versions:
            continue
        comp = companions.get(name) or Companion(package=name)
        targets = (
            [comp.with_] if name in companions else sorted({DEFAULT_WITH} | {c.with_ for c in companions.values()})
        )
        for target in targets:
            if target not in versions:
                continue
            checks = _pair_checks(name, versions[name], target, versions[target], comp, requires.get(name, []))
            verdict = _pair_verdict(name, versions[name], target, versions[target], comp, checks, name in companions)
            if verdict["pair"]:
                pairs.append(verdict["pair"])
            if verdict["problem"]:
                problems.append(verdict["problem"])
            if verdict["unjudged"]:
                unjudged[name] = verdict["unjudged"]
    return pairs, problems, unjudged


def _pair_checks(name, have, target, with_have, comp, requires) -> list:
    """(source, holds, what it says, pairs: a pin or a table row, not a bound) for every statement on the pair."""
    checks = []
    for req in _requirements_on(requires, target):
        checks.append(("its METADATA", req.specifier.contains(with_have, prereleases=True), str(req), _is_pin(req)))
    if comp.versions:
        row = _table_pair(comp, with_have)
        if row:
            ok = _release(have)[: len(_release(row[1]))] == _release(row[1])
            checks.append(("the profile", ok, f"{target} {row[0]} <-> {name} {row[1]}", True))
    return checks


def _pair_verdict(name, have, target, with_have, comp, checks, in_profile) -> dict:
    """{"pair", "problem", "unjudged"} (each None or its value) for one package and the package it is built for;
    ``in_profile``: the profile names it among its companions, so the pair must be proven."""
    out = {"pair": None, "problem": None, "unjudged": None}
    release = ".".join(map(str, _release(with_have)[:2]))
    bad = [c for c in checks if not c[1]]
    if bad:
        wants = "; ".join(f"{src} {'pairs' if pin else 'requires'} {what}" for src, _ok, what, pin in bad)
        out["problem"] = (
            f"{name} {have} does not pair with {target} {with_have} ({wants})"
            + (f" [{comp.reason}]" if comp.reason else "")
            + f". Fix: choose the {name} built for {target} {with_have} (pin it in wheels.packages or"
            f" wheels.overrides, e.g. an override with the {name} release that pairs), or a {target} that"
            f" {name} {have} was built against"
        )
    elif not any(pin for *_rest, pin in checks):
        bounds = ", ".join(what for _src, _ok, what, _pin in checks)
        if in_profile:
            known = ", ".join(f"{target} {k} <-> {name} {v}" for k, v in comp.versions.items()) or "no rows"
            said = f"{name}'s METADATA only bounds it ({bounds})" if bounds else f"{name}'s METADATA"
            out["problem"] = (
                f"{name} {have} beside {target} {with_have}: neither the profile's companions rule ({known})"
                f" nor {said} says which {name} pairs with {target} {with_have}. Fix: add the {name} release"
                f" built for {target} {release} to wheels.rules.companions ({name}) versions"
            )
        elif bounds:
            out["unjudged"] = (
                f"{name} {have} beside {target} {with_have}: its METADATA admits it ({bounds}) but pins no"
                f" {target} release, and wheels.rules.companions has no row for {name}: which {target} it was"
                f" built against is not judged (add a companions row to judge it)"
            )
    if checks and (out["problem"] or any(pin for *_rest, pin in checks)):
        by = "; ".join(f"{src}: {what}" for src, _ok, what, _pin in checks)
        out["pair"] = {
            "package": name,
            "version": have,
            "with": target,
            "with_version": with_have,
            "by": by,
            "ok": out["problem"] is None,
        }
    return out


# --- the verdict ------------------------------------------------------------------------------------------


def judge_lock(entries: list, graph: dict, requires: dict, profile: dict, wheelhouse: str | None = None) -> dict:
    """Judge a finished lock against the profile's rules. Returns the report part (``cuda``: per package the CUDA
    it is built for; ``cuda_allowed``; ``cuda_unread``: compiled wheels in ``wheelhouse`` whose shared objects could
    not be read; ``cuda_not_fetched``: compiled wheels whose CUDA only their shared objects tell, not in
    ``wheelhouse``; ``companions``: the pairs checked; ``unjudged``: pairs no rule could judge); raises LockRefused
    naming every broken rule, so a bad lock is never written. ``wheelhouse``: the controller's folder of the lock's
    wheels, where there are any yet."""
    rules = profile["wheels"].get("rules") or {}
    companions = companions_from_profile(rules)
    versions = {e["name"]: e["version"] for e in entries}
    files = wheel_files(entries, wheelhouse)
    torch_links = {}
    table = cuda_table(entries, graph, files, torch_links)
    cuda_problems, allowed = judge_cuda(
        table, profile["cuda"]["version"], exceptions_from_profile(rules), graph, versions
    )
    pairs, pair_problems, bounds_only = judge_companions(entries, companions, requires)
    problems = pair_problems + cuda_problems
    if problems:
        raise LockRefused(
            f"the lock for profile {profile['name']!r} was refused, nothing was written: " + " | ".join(problems)
        )
    return {
        "cuda": table,
        "cuda_allowed": allowed,
        "cuda_unread": unread_cuda(entries, table, files),
        "cuda_not_fetched": not_on_controller(entries, table, files),
        "companions": pairs,
        "bounds_only": bounds_only,
        "torch_links": torch_links,
        "unjudged": unjudged_lines(bounds_only, torch_links, pairs, versions),
    }


def unjudged_lines(bounds_only: dict, torch_links: dict, pairs: list, versions: dict) -> list:
    """What the pairing rule could not judge: a package only a bound of its METADATA admits (``bounds_only``),
    unless its wheel was read and links none of torch's libraries (then it is built against no torch release); and
    a wheel that links torch's libraries whose pairing no pin and no profile row judged. ``torch_links``: per wheel
    read, the torch library it links or ""."""
    judged = {p["package"] for p in pairs}
    torch = versions.get(DEFAULT_WITH)
    lines = [line for name, line in sorted(bounds_only.items()) if torch_links.get(name, None) != ""]
    judged |= set(bounds_only)
    lines += [
        f"{name} {versions[name]} links torch's libraries ({where}) but neither its METADATA nor"
        f" wheels.rules.companions says which torch it was built against: its pairing with torch {torch} is not judged"
        f" (add a companions row for {name} to judge it)"
        for name, where in sorted(torch_links.items())
        if where and name not in judged and name in versions and torch
    ]
    return sorted(lines)


def judge_linked_cuda(entries: list, profile: dict, wheelhouse: str, graph: dict | None = None, judged=()) -> dict:
    """The one-CUDA-major rule for the wheels whose CUDA only their shared objects tell, once the wheelhouse holds
    the whole lock (a dependency's wheel is fetched after the lock is made, so judge_lock could not read it).
    Returns the report part as judge_lock does (``cuda`` holds those packages only; ``torch_links``: per wheel read,
    the torch library it links or ""); raises LockRefused."""
    versions = {e["name"]: e["version"] for e in entries}
    table = {}
    for entry in entries:
        found = own_cuda(entry["name"], entry["version"])
        # ``judged``: packages judge_lock already placed (their wheels read once, as the lock was made).
        if found or entry["name"] in BUILT_FOR_REQUIRED_CUDA or entry["name"] in judged:
            table[entry["name"]] = None  # judged by judge_lock from its name, version or requirements
    files = wheel_files(entries, wheelhouse)
    torch_links = linked_cuda(entries, table, files)
    linked = {name: row for name, row in table.items() if row is not None}
    rules = profile["wheels"].get("rules") or {}
    problems, allowed = judge_cuda(
        linked, profile["cuda"]["version"], exceptions_from_profile(rules), graph or {}, versions
    )
    if problems:
        raise LockRefused(
            f"the lock for profile {profile['name']!r} was refused after its wheels were fetched: "
            + " | ".join(problems)
        )
    return {
        "cuda": linked,
        "cuda_allowed": allowed,
        "cuda_unread": unread_cuda(entries, table, files),
        "cuda_not_fetched": not_on_controller(entries, table, files),
        "torch_links": torch_links,
    }


def judge_after_fetch(entries: list, profile: dict, wheelhouse: str, rules: dict) -> None:
    """judge_linked_cuda once the fetch filled the wheelhouse, its findings merged into ``rules`` (the lock's
    ``lock_rules``, as judge_lock made it): the CUDA rows, and what is still not judged replaces what was not judged
    before the fetch. Raises LockRefused."""
    linked = judge_linked_cuda(
        entries, profile, wheelhouse, rules.get("required_by"), judged=set(rules.get("cuda") or {})
    )
    versions = {e["name"]: e["version"] for e in entries}
    rules["cuda"] = {**(rules.get("cuda") or {}), **linked["cuda"]}
    rules["cuda_allowed"] = sorted(set(rules.get("cuda_allowed") or []) | set(linked["cuda_allowed"]))
    rules["cuda_unread"] = sorted(set(rules.get("cuda_unread") or []) | set(linked["cuda_unread"]))
    rules["cuda_not_fetched"] = linked["cuda_not_fetched"]
    rules["torch_links"] = {**(rules.get("torch_links") or {}), **linked["torch_links"]}
    rules["unjudged"] = unjudged_lines(
        rules.get("bounds_only") or {}, rules["torch_links"], rules.get("companions") or [], versions
    )


def _builds_line(name: str, row: dict) -> str:
    builds = row["builds"]
    return (
        f"{name} {row['version']} carries a build for each of CUDA {', '.join(sorted(builds, key=int))} and chooses one"
        f" at import ({row['from']})"
    )


def not_judged_lines(rules_report: dict) -> list:
    """What the lock rules could not judge, one line each (the plan report, and the console: action wheel_plan's
    warnings)."""
    lines = []
    if rules_report.get("cuda_not_fetched"):
        names = rules_report["cuda_not_fetched"]
        lines.append(
            f"not judged: the CUDA of {len(names)} compiled wheel(s) whose name and version do not tell it, because"
            " their wheels are not in the controller's wheelhouse and their shared objects were not read (a plan in"
            " check mode or without the fetch does not download them; the plan that fetches reads them and refuses"
            f" one built for another CUDA, or a mix of CUDA majors not chosen at import): {', '.join(names)}"
        )
    if rules_report.get("cuda_unread"):
        lines.append(
            "not judged: the CUDA of "
            + ", ".join(rules_report["cuda_unread"])
            + " (their shared objects were not read: pyelftools is not installed on the controller; pip install"
            " pyelftools)"
        )
    lines.extend(f"not judged: {line}" for line in rules_report.get("unjudged") or [])
    return lines


def report_lines(rules_report: dict) -> list:
    """Lines of the plan report: the CUDA each CUDA-built package is built for, the companion pairs, and what could
    not be judged."""
    lines = []
    table = rules_report.get("cuda") or {}
    if table:
        lines.append(
            "CUDA builds: "
            + ", ".join(
                f"{n} {r['version']} (CUDA {_majors_words(r['cuda'])}, {r['from']})" for n, r in sorted(table.items())
            )
        )
    lines.extend(
        f"CUDA builds chosen at import: {_builds_line(n, r)}" for n, r in sorted(table.items()) if r.get("builds")
    )
    lines.extend(f"CUDA exception: {line}" for line in rules_report.get("cuda_allowed") or [])
    for pair in rules_report.get("companions") or []:
        lines.append(
            f"companion {pair['package']} {pair['version']} pairs with {pair['with']} {pair['with_version']}"
            f" ({pair['by']})"
        )
    return lines + not_judged_lines(rules_report)
