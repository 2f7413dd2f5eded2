# Copyright: (c) 2026, gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the collection uses is what it declares.

- Every collection a role, playbook or action plugin names by FQCN (modules, roles, filters, tests, lookups) is in
  ``galaxy.yml`` ``dependencies`` (``ansible.builtin`` and the collection itself come with it), and every declared
  collection is used: installed from its tarball with only its declared dependencies, the collection must run.
- Every ``gpufleet.upgrade.*`` name used resolves to a module, action, role or documented filter of the checkout.
- Every third-party package the controller-side plugins import, and every program they run (``shutil.which``), is in
  ``requirements.txt`` (or comes with ansible-core), and ansible-core's range there matches ``meta/runtime.yml``.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]
SELF = "gpufleet.upgrade"
IMPLICIT = {"ansible.builtin", SELF}
NAME = r"[a-z_][a-z0-9_]*"
FQCN = re.compile(rf"^{NAME}\.{NAME}\.{NAME}$")
# A filter (`| ns.coll.f`), a test (`is ns.coll.t`) or a lookup (`lookup('ns.coll.l'`, `query(`, `q(`) in Jinja.
JINJA_USE = re.compile(
    rf"(?:\|\s*|\bis\s+(?:not\s+)?|\b(?:lookup|query|q)\(\s*['\"])({NAME}\.{NAME}\.{NAME})\b(?!\s*[:=])"
)
ROLE_KEYS = {"ansible.builtin.include_role", "ansible.builtin.import_role", "include_role", "import_role"}
# Controller-side code: runs in ansible-playbook's Python, so its imports must be installed there.
CONTROLLER_CODE = ("plugins/action", "plugins/callback", "plugins/filter", "plugins/plugin_utils", "plugins/lookup")


def _yaml_files():
    for top in ("roles", "playbooks"):
        yield from sorted((REPO / top).rglob("*.yml"))
        yield from sorted((REPO / top).rglob("*.yaml"))


def _walk(node, where, found):
    if isinstance(node, dict):
        for key, value in node.items():
            if isinstance(key, str) and FQCN.match(key):
                found.append((key, "module", where))
                if key in ROLE_KEYS and isinstance(value, dict) and isinstance(value.get("name"), str):
                    found.append((value["name"], "role", where))
            if key == "roles" and isinstance(value, list):
                for role in value:
                    name = role if isinstance(role, str) else (role or {}).get("role") or (role or {}).get("name")
                    if isinstance(name, str):
                        found.append((name, "role", where))
            _walk(value, where, found)
    elif isinstance(node, list):
        for item in node:
            _walk(item, where, found)
    elif isinstance(node, str):
        found.extend((name, "jinja", where) for name in JINJA_USE.findall(node))


def used_names() -> list[tuple[str, str, str]]:
    """(fqcn, kind, file) for every FQCN that roles/, playbooks/ and the action plugins use."""
    found: list[tuple[str, str, str]] = []
    for path in _yaml_files():
        rel = str(path.relative_to(REPO))
        for doc in yaml.safe_load_all(path.read_text()):
            _walk(doc, rel, found)
    for path in sorted((REPO / "roles").glob("*/templates/*")):
        rel = str(path.relative_to(REPO))
        found.extend((name, "jinja", rel) for name in JINJA_USE.findall(path.read_text()))
    # Action plugins run modules by name (``_execute_module(module_name=...)``): any FQCN string literal.
    for path in sorted((REPO / "plugins/action").glob("*.py")):
        rel = str(path.relative_to(REPO))
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and FQCN.match(node.value):
                found.append((node.value, "module", rel))
    return found


def collection_of(fqcn: str) -> str:
    return ".".join(fqcn.split(".")[:2])


def declared() -> dict[str, str]:
    return yaml.safe_load((REPO / "galaxy.yml").read_text()).get("dependencies") or {}


def test_the_walk_finds_each_kind_of_use():
    # The scanner itself: a change that stops it seeing a kind of use would pass every collection as declared.
    found: list = []
    _walk(
        [
            {"name": "t", "community.general.alternatives": {"name": "x"}},
            {"ansible.builtin.include_role": {"name": "other.coll.role"}},
            {"roles": ["ns.c.r1", {"role": "ns.c.r2"}]},
            {"ansible.builtin.set_fact": {"a": "{{ x | ns.f.flt }} {{ y is ns.t.tst }} {{ lookup('ns.l.lk', 'a') }}"}},
            {"ansible.builtin.debug": {"msg": "{{ gpufleet_stack.cuda.root }} {{ a.b.c }}"}},
        ],
        "f.yml",
        found,
    )
    assert {(use[0], use[1]) for use in found} == {
        ("community.general.alternatives", "module"),
        ("ansible.builtin.include_role", "module"),
        ("other.coll.role", "role"),
        ("ns.c.r1", "role"),
        ("ns.c.r2", "role"),
        ("ansible.builtin.set_fact", "module"),
        ("ansible.builtin.debug", "module"),
        ("ns.f.flt", "jinja"),
        ("ns.t.tst", "jinja"),
        ("ns.l.lk", "jinja"),
    }


def test_every_collection_used_is_declared():
    deps = declared()
    missing: dict[str, list[str]] = {}
    for name, kind, where in used_names():
        coll = collection_of(name)
        if coll not in IMPLICIT and coll not in deps:
            missing.setdefault(coll, []).append(f"{name} ({kind}) in {where}")
    assert not missing, (
        "collections used but not declared in galaxy.yml dependencies (installed from the tarball, these tasks fail "
        "with 'couldn't resolve module/action'): "
        + "; ".join(f"{coll}: {', '.join(uses)}" for coll, uses in sorted(missing.items()))
        + ". Declare each in galaxy.yml dependencies, or use an ansible.builtin equivalent."
    )


def test_every_declared_collection_is_used():
    used = {collection_of(use[0]) for use in used_names()}
    unused = sorted(set(declared()) - used)
    assert not unused, f"galaxy.yml declares {unused} but no role, playbook or action plugin uses them: drop them"


def _jinja_names() -> set[str]:
    """Filters (documented by <name>.yml, or named in a FilterModule), tests and lookups of the checkout."""
    names = {p.stem for p in (REPO / "plugins/filter").glob("*.yml")}
    names |= {p.stem for top in ("lookup", "test") for p in (REPO / "plugins" / top).glob("*.py")}
    for path in (REPO / "plugins/filter").glob("*.py"):
        names |= set(re.findall(r'^\s+"([a-z_]+)":\s', path.read_text(), re.M))
    return names


def test_every_name_of_this_collection_resolves():
    modules = {p.stem for p in (REPO / "plugins/modules").glob("*.py")} | {
        p.stem for p in (REPO / "plugins/action").glob("*.py")
    }
    roles = {p.name for p in (REPO / "roles").iterdir() if (p / "tasks").is_dir()}
    known = {"module": modules, "role": roles, "jinja": _jinja_names()}
    unknown = [
        f"{name} ({kind}) in {where}"
        for name, kind, where in used_names()
        # A templated name ("gpufleet.upgrade.{{ step }}") is checked where its values are listed, not here.
        if collection_of(name) == SELF and "{{" not in name and name.split(".")[2] not in known[kind]
    ]
    assert not unknown, f"names of {SELF} that resolve to nothing in the checkout: {unknown}"


def _requirements() -> dict[str, Requirement]:
    lines = (REPO / "requirements.txt").read_text().splitlines()
    reqs = [Requirement(line.split("#", 1)[0].strip()) for line in lines if line.split("#", 1)[0].strip()]
    return {canonicalize_name(r.name): r for r in reqs}


def _controller_imports() -> dict[str, str]:
    """Top-level third-party modules imported by controller-side plugins -> the first file importing each."""
    out: dict[str, str] = {}
    for top in CONTROLLER_CODE:
        for path in sorted((REPO / top).glob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    mods = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    mods = [node.module]
                else:
                    continue
                for mod in mods:
                    root = mod.split(".")[0]
                    if root in sys.stdlib_module_names or root in ("ansible", "ansible_collections", "__future__"):
                        continue
                    out.setdefault(root, str(path.relative_to(REPO)))
    return out


def _controller_programs() -> dict[str, str]:
    """Programs the controller-side plugins look up with shutil.which("...") -> the first file doing so."""
    out: dict[str, str] = {}
    for top in CONTROLLER_CODE:
        for path in sorted((REPO / top).glob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "which"
                    and node.args
                    and isinstance(node.args[0], ast.Constant)
                ):
                    out.setdefault(node.args[0].value, str(path.relative_to(REPO)))
    return out


def test_controller_imports_and_programs_are_in_requirements_txt():
    reqs = _requirements()
    assert "ansible-core" in reqs, "requirements.txt must name ansible-core (the controller's engine)"
    with_core = {canonicalize_name(Requirement(r).name) for r in importlib.metadata.requires("ansible-core") or []}
    dists = importlib.metadata.packages_distributions()
    missing = []
    for module, where in sorted(_controller_imports().items()):
        names = {canonicalize_name(d) for d in dists.get(module, [module])}
        # ansible-core's own dependencies (PyYAML, jinja2) come with it; packaging is named anyway: the wheel plan
        # needs packaging.metadata, newer than ansible-core asks for.
        if not names & (set(reqs) | with_core):
            missing.append(f"{module} (imported by {where})")
        if module == "packaging" and "packaging" not in reqs:
            missing.append(f"packaging (imported by {where}; ansible-core's unpinned dependency may lack .metadata)")
    for program, where in sorted(_controller_programs().items()):
        if canonicalize_name(program) not in reqs:
            missing.append(f"program {program} (run by {where})")
    assert not missing, f"controller requirements missing from requirements.txt: {missing}"


@pytest.mark.parametrize("version", ["2.19.0", "2.20.0", "2.21.0"])
def test_tested_ansible_core_versions_are_allowed(version):
    requires = SpecifierSet(yaml.safe_load((REPO / "meta/runtime.yml").read_text())["requires_ansible"])
    assert version in requires, f"meta/runtime.yml requires_ansible {requires} excludes tested ansible-core {version}"
    assert version in _requirements()["ansible-core"].specifier, f"requirements.txt excludes ansible-core {version}"
