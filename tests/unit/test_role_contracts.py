# Copyright: (c) 2026, gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Roles read each other's results only as docs/design.md says ("Facts roles publish").

The table in docs/design.md is the one list of the facts that cross a role or play boundary: each with its writer and
its readers. This test parses that table and reads the roles' YAML (values only: comments, task names and keys are
not reads) and templates:
- a role reads no private name of another role (``__<other role>_*``) nor of the playbooks (``__gpufleet_*``), and the
  playbooks read no role's private name;
- a role reads a published fact only where the table lists it (or every role) as a reader;
- a role's defaults read no fact another role publishes, save the shared ones every role reads (role ``stack``'s):
  the playbook passes what a role needs from another role's result through a variable the role declares;
- a non-private fact that a role sets and another role reads is in the table;
- every fact in the table has a writer in the tree, and a fact set in ``roles/<r>/`` names role ``<r>`` as its writer;
- an entry point named in ``tasks_from`` (and a step of the phase table) is declared in the role's argument spec.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from ansible_collections.gpufleet.upgrade.plugins.module_utils._state import PHASE_TABLE, Phase

REPO = Path(__file__).resolve().parents[2]
# Mapping keys whose values are prose, not reads: task names and argument spec descriptions.
PROSE_KEYS = {"name", "description", "short_description", "author"}
IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
JINJA = re.compile(r"{{.*?}}|{%.*?%}", re.S)


def roles_of(repo: Path) -> list[str]:
    return sorted(p.name for p in (repo / "roles").iterdir() if (p / "meta" / "argument_specs.yml").is_file())


# --------------------------------------------------------------------------- the table


def facts_table(text: str, roles: list[str]) -> dict[str, dict]:
    """The "Facts roles publish" table of docs/design.md: fact -> {writers, readers, every_role}."""
    section = text.split("\n## Facts roles publish", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")][2:]  # past the header and its rule
    table = {}
    for row in rows:
        cells = [cell.strip() for cell in row.strip().strip("|").split(" | ")]
        assert len(cells) == 4, f"docs/design.md: a row of 'Facts roles publish' has {len(cells)} cells: {row}"
        fact_cell, set_by, read_by = cells[0], cells[1], cells[3]
        entry = {
            "writers": roles_named(set_by, roles),
            "readers": roles_named(without_parentheses(read_by), roles),
            "every_role": "every role" in read_by,
        }
        for fact in re.findall(rf"`({IDENT})`", fact_cell):
            table[fact] = entry
    return table


def without_parentheses(text: str) -> str:
    """The text without its parenthesised asides (what a reader does with the fact, not who reads it)."""
    while True:
        shorter = re.sub(r"\([^()]*\)", "", text)
        if shorter == text:
            return text
        text = shorter


def roles_named(text: str, roles: list[str]) -> set[str]:
    """Roles the text names as ``role `x``` or ``roles `x`, `y` and `z```."""
    found = set()
    for listed in re.findall(rf"\broles? ((?:`{IDENT}`(?:\s*,\s*|\s+and\s+)?)+)", text):
        found |= set(re.findall(rf"`({IDENT})`", listed)) & set(roles)
    return found


# --------------------------------------------------------------------------- what the files read and set


def strings(node):
    """Every string value of a YAML document (keys and prose left out)."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key not in PROSE_KEYS:
                yield from strings(value)
    elif isinstance(node, list):
        for value in node:
            yield from strings(value)
    elif isinstance(node, str):
        yield node


def spec_defaults(spec: dict):
    """The default values of an argument spec's options."""
    for entry in (spec.get("argument_specs") or {}).values():
        for option in (entry.get("options") or {}).values():
            if "default" in option:
                yield from strings(option["default"])


def read_texts(path: Path) -> list[str]:
    """What a role or playbook file may read names in: YAML values, a template's Jinja, a spec's defaults."""
    text = path.read_text()
    if path.suffix == ".j2":
        return JINJA.findall(re.sub(r"{#.*?#}", "", text, flags=re.S))
    document = yaml.safe_load(text)
    if path.name == "argument_specs.yml":
        return list(spec_defaults(document or {}))
    return list(strings(document))


def role_files(repo: Path, role: str) -> list[Path]:
    base = repo / "roles" / role
    files = [p for p in base.glob("*/*.yml") if p.parent.name in ("defaults", "vars", "tasks", "handlers")]
    return [*sorted(files), base / "meta" / "argument_specs.yml", *sorted(base.glob("templates/**/*.j2"))]


def playbook_files(repo: Path) -> list[Path]:
    return sorted((repo / "playbooks").rglob("*.yml"))


def reads(texts: list[str], name: str) -> bool:
    """Whether the texts read variable ``name``: not as an attribute (``x.name``) nor as a quoted dict key, but
    as a subscript (``hostvars[h]['name']``)."""
    pattern = re.compile(rf"(?<![\w.'\"]){name}(?!\w)|\[['\"]{name}['\"]\]")
    return any(pattern.search(text) for text in texts)


def private_names(texts: list[str]) -> set[str]:
    return {name for text in texts for name in re.findall(r"(?<!\w)__[a-z][a-z0-9_]*", text)}


def owner_of_private(name: str, roles: list[str]) -> str:
    """Whose private name it is: a role (``__venv_rebuild_locks``), "gpufleet" (the playbooks'), or "" (no one's:
    a local name such as a Jinja loop variable)."""
    owners = [owner for owner in [*roles, "gpufleet"] if name.startswith(f"__{owner}_")]
    return max(owners, key=len) if owners else ""


def set_names(node):
    """Names a task list sets: set_fact keys and registers."""
    if isinstance(node, dict):
        for module in ("ansible.builtin.set_fact", "set_fact"):
            if isinstance(node.get(module), dict):
                yield from (key for key in node[module] if key != "cacheable")
        if isinstance(node.get("register"), str):
            yield node["register"]
        for value in node.values():
            yield from set_names(value)
    elif isinstance(node, list):
        for value in node:
            yield from set_names(value)


def published_by_roles(repo: Path) -> dict[str, set[str]]:
    """Non-private names each role sets (set_fact keys, registers): name -> the roles that set it."""
    found: dict[str, set[str]] = {}
    for role in roles_of(repo):
        for path in role_files(repo, role):
            if path.parent.name in ("tasks", "handlers"):
                for name in set_names(yaml.safe_load(path.read_text())):
                    if not name.startswith("__"):
                        found.setdefault(name, set()).add(role)
    return found


def includes(node):
    """(role, tasks_from) of every include_role/import_role with tasks_from."""
    if isinstance(node, dict):
        for module in ("ansible.builtin.include_role", "ansible.builtin.import_role", "include_role", "import_role"):
            args = node.get(module)
            if isinstance(args, dict) and "tasks_from" in args:
                yield str(args["name"]), str(args["tasks_from"])
        for value in node.values():
            yield from includes(value)
    elif isinstance(node, list):
        for value in node:
            yield from includes(value)


# --------------------------------------------------------------------------- the checks


def design_table(repo: Path) -> dict[str, dict]:
    return facts_table((repo / "docs" / "design.md").read_text(), roles_of(repo))


def fact_breaches(role: str, path: Path, texts: list[str], table: dict, published: dict) -> list[str]:
    """Facts of other roles one file of ``role`` reads that the table does not let it read."""
    breaches = []
    for fact, entry in sorted(table.items()):
        if role in entry["writers"] or not reads(texts, fact):
            continue
        if path.parent.name == "defaults" and not entry["every_role"]:
            breaches.append(f"{path}: its default reads fact {fact} of another role (the playbook passes it instead)")
        elif role not in entry["readers"] and not entry["every_role"]:
            breaches.append(f"{path}: reads fact {fact}, whose row in docs/design.md lists no reader {role}")
    for fact, writers in sorted(published.items()):
        if fact not in table and role not in writers and reads(texts, fact):
            breaches.append(f"{path}: reads {fact} of role {', '.join(sorted(writers))}, not in docs/design.md")
    return breaches


def contract_breaches(repo: Path = REPO) -> list[str]:
    """Reads in roles/ (and private reads in playbooks/) that the table does not allow."""
    roles, table, published = roles_of(repo), design_table(repo), published_by_roles(repo)
    breaches = []
    for role in roles:
        for path in role_files(repo, role):
            texts = read_texts(path)
            where = path.relative_to(repo)
            for name in sorted(private_names(texts)):
                owner = owner_of_private(name, roles)
                if owner not in ("", role):
                    breaches.append(f"{where}: reads {name}, private to {owner} (read a published fact instead)")
            breaches += fact_breaches(role, where, texts, table, published)
    for path in playbook_files(repo):
        for name in sorted(private_names(read_texts(path))):
            if owner_of_private(name, roles) not in ("", "gpufleet"):
                breaches.append(f"{path.relative_to(repo)}: reads {name}, private to {owner_of_private(name, roles)}")
    return breaches


def writer_breaches(repo: Path = REPO) -> list[str]:
    """Facts of the table that nothing sets, or that a role the table does not name as their writer sets."""
    table, published = design_table(repo), published_by_roles(repo)
    playbook_sets = {name for path in playbook_files(repo) for name in set_names(yaml.safe_load(path.read_text()))}
    plugins = "\n".join(p.read_text() for p in (repo / "plugins").rglob("*.py"))
    breaches = []
    for fact, entry in sorted(table.items()):
        if fact not in published and fact not in playbook_sets and not re.search(rf"['\"]{fact}['\"]", plugins):
            breaches.append(f"docs/design.md lists {fact}, which nothing in roles/, playbooks/ or plugins/ sets")
        for role in sorted(published.get(fact, set()) - entry["writers"]):
            breaches.append(f"roles/{role} sets {fact}, whose row in docs/design.md names another writer")
    return breaches


def entry_point_breaches(repo: Path = REPO, phase_table=PHASE_TABLE) -> list[str]:
    """include_role/import_role tasks_from and the phase table's steps that name no declared entry point."""
    roles = roles_of(repo)
    declared = {
        role: set(yaml.safe_load((repo / "roles" / role / "meta/argument_specs.yml").read_text())["argument_specs"])
        for role in roles
    }
    breaches = []
    for path in [p for role in roles for p in role_files(repo, role) if p.suffix == ".yml"] + playbook_files(repo):
        for name, entry in includes(yaml.safe_load(path.read_text())):
            role = name.removeprefix("gpufleet.upgrade.")
            if role in declared and "{{" not in entry and entry.removesuffix(".yml") not in declared[role]:
                breaches.append(f"{path.relative_to(repo)}: runs {entry} of role {role}, no entry point it declares")
    for phase in phase_table:
        for step in phase.steps:
            role, entry = [*step.split(":"), "main"][:2]
            if entry not in declared.get(role, ()):
                breaches.append(f"_state.PHASE_TABLE: phase {phase.name} runs {step}, no entry point of role {role}")
    return breaches


# --------------------------------------------------------------------------- the tree as it is


def test_roles_read_other_roles_results_only_as_the_table_says():
    breaches = contract_breaches()
    assert breaches == [], "\n".join(breaches)


def test_every_fact_of_the_table_has_its_writer():
    breaches = writer_breaches()
    assert breaches == [], "\n".join(breaches)


def test_entry_points_run_from_outside_a_role_are_declared():
    breaches = entry_point_breaches()
    assert breaches == [], "\n".join(breaches)


def test_the_table_parses_into_writers_and_readers():
    table = design_table(REPO)
    assert table["assess_result"]["writers"] == {"assess"}
    assert table["gpufleet_stack"]["every_role"]
    assert "rollback" in table["backup_description"]["readers"]
    assert len(table) > 20


# --------------------------------------------------------------------------- the checks on a made-up tree

ROW = "| `{fact}` | role `{writer}` (`x.yml`) | what it holds | {readers} |"


def make_tree(tmp_path: Path, rows: list[str], files: dict[str, str], specs: dict[str, list[str]]) -> Path:
    """A tree of roles (each with its argument spec's entry points), docs/design.md with ``rows``, and ``files``."""
    head = ["# Design", "## Facts roles publish", "", "| fact | set by | what | read by |", "|---|---|---|---|"]
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "design.md").write_text("\n".join([*head, *rows, "", "## Lab", ""]))
    (tmp_path / "playbooks").mkdir()
    (tmp_path / "plugins").mkdir()
    for role, entry_points in specs.items():
        (tmp_path / "roles" / role / "meta").mkdir(parents=True)
        spec = {"argument_specs": {entry: {"options": {}} for entry in entry_points}}
        (tmp_path / "roles" / role / "meta" / "argument_specs.yml").write_text(yaml.safe_dump(spec))
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return tmp_path


SETS_RESULT = "- name: Publish\n  ansible.builtin.set_fact:\n    result_x: 1\n  register: __a_private\n"
ROLES = {"a": ["main"], "b": ["main"]}


@pytest.mark.parametrize(
    ("readers", "path", "text", "breach"),
    [
        # Even a reader the row lists may not read the fact in its defaults: the playbook passes it.
        (
            "role `b` (`b_flag`)",
            "roles/b/defaults/main.yml",
            "b_flag: '{{ result_x.ok }}'\n",
            "its default reads fact result_x of another role (the playbook passes it instead)",
        ),
        (
            "`playbooks/x.yml`, role `a` (not role `b`)",
            "roles/b/tasks/main.yml",
            "- when: result_x | bool\n  debug: {}\n",
            "reads fact result_x, whose row in docs/design.md lists no reader b",
        ),
        (
            None,
            "roles/b/tasks/main.yml",
            "- debug: {var: result_x}\n",
            "reads result_x of role a, not in docs/design.md",
        ),
    ],
)
def test_a_read_the_table_does_not_allow_is_a_breach(tmp_path, readers, path, text, breach):
    rows = [ROW.format(fact="result_x", writer="a", readers=readers)] if readers else []
    tree = make_tree(tmp_path, rows, {"roles/a/tasks/main.yml": SETS_RESULT, path: text}, ROLES)
    assert contract_breaches(tree) == [f"{path}: {breach}"]


def test_private_names_of_another_role_or_the_playbooks_are_breaches(tmp_path):
    files = {
        "roles/a/tasks/main.yml": SETS_RESULT,
        "roles/b/tasks/main.yml": (
            "- debug: {msg: \"{{ __a_private }} {{ __gpufleet_phase }} {{ hostvars[h]['__b_own'] }} {{ __local }}\"}\n"
        ),
        "playbooks/p.yml": "- hosts: all\n  tasks:\n    - debug: {msg: '{{ __a_private }} {{ __gpufleet_x }}'}\n",
    }
    tree = make_tree(tmp_path, [ROW.format(fact="result_x", writer="a", readers="every role")], files, ROLES)
    assert contract_breaches(tree) == [
        "roles/b/tasks/main.yml: reads __a_private, private to a (read a published fact instead)",
        "roles/b/tasks/main.yml: reads __gpufleet_phase, private to gpufleet (read a published fact instead)",
        "playbooks/p.yml: reads __a_private, private to a",
    ]


def test_comments_task_names_and_attributes_are_not_reads(tmp_path):
    rows = [ROW.format(fact="result_x", writer="a", readers="role `a`")]
    files = {
        "roles/a/tasks/main.yml": SETS_RESULT,
        "roles/b/defaults/main.yml": "# the playbook passes result_x\nb_flag: false\n",
        "roles/b/tasks/main.yml": "- name: Use result_x\n  debug: {msg: \"{{ x.result_x }} {{ {'result_x': 1} }}\"}\n",
    }
    assert contract_breaches(make_tree(tmp_path, rows, files, ROLES)) == []


def test_a_fact_without_its_writer_or_with_another_writer_is_a_breach(tmp_path):
    rows = [
        ROW.format(fact="result_x", writer="b", readers="role `a`"),
        ROW.format(fact="gone", writer="a", readers=""),
    ]
    tree = make_tree(tmp_path, rows, {"roles/a/tasks/main.yml": SETS_RESULT}, ROLES)
    assert writer_breaches(tree) == [
        "docs/design.md lists gone, which nothing in roles/, playbooks/ or plugins/ sets",
        "roles/a sets result_x, whose row in docs/design.md names another writer",
    ]


def test_an_undeclared_entry_point_is_a_breach(tmp_path):
    include = "- ansible.builtin.include_role:\n    name: gpufleet.upgrade.a\n    tasks_from: {}\n"
    files = {"roles/b/tasks/main.yml": include.format("snapshot.yml"), "playbooks/p.yml": include.format("main")}
    tree = make_tree(tmp_path, [], files, ROLES)
    phases = [Phase("x", ("a:describe", "b"))]
    assert entry_point_breaches(tree, phases) == [
        "roles/b/tasks/main.yml: runs snapshot.yml of role a, no entry point it declares",
        "_state.PHASE_TABLE: phase x runs a:describe, no entry point of role a",
    ]


def test_reads_tell_a_variable_from_an_attribute_and_a_key():
    assert not reads(["{{ preflight_recovery.backup_id }}"], "backup_id")
    assert not reads(["{{ {'backup_id': x} }}"], "backup_id")
    assert reads(["{{ hostvars[h]['backup_id'] }}"], "backup_id")
    assert reads(["backup_id | length > 0"], "backup_id")
    assert owner_of_private("__venv_rebuild_locks", ["venv_rebuild", "serving"]) == "venv_rebuild"
    assert owner_of_private("__hosts", ["venv_rebuild"]) == ""
