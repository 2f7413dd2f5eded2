# Copyright: (c) 2026, gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Write the variables section of every role's README from its meta/argument_specs.yml.

The argument spec is what Ansible validates a role's variables against, so the README's table is taken from it
rather than written by hand twice. Each roles/<role>/README.md has a hand-written part (what the role does, the
facts it publishes, an example) and one generated part between the markers below; only the generated part is
ever rewritten. A README without the markers gets the generated part appended; a role without a README gets
one with a title and a placeholder for the hand-written part.

    python scripts/role_docs.py            # rewrite the generated part of every README that is out of step
    python scripts/role_docs.py --check    # exit 1 naming each README that is out of step (make lint)
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import jinja2
import yaml

REPO = Path(__file__).resolve().parent.parent
BEGIN = "<!-- BEGIN generated from meta/argument_specs.yml: run scripts/role_docs.py -->"
END = "<!-- END generated -->"

TEMPLATE = """\
{{ begin }}
## Variables

{% if not entry_points %}
This role has no `meta/argument_specs.yml`: its variables are not validated.
{% endif %}
{% for ep in entry_points %}
### Entry point `{{ ep.name }}`{% if ep.name != 'main' %} (`tasks_from: {{ ep.name }}`){% endif %}


{% if ep.short_description %}
{{ ep.short_description }}

{% endif %}
{% for para in ep.description %}
{{ para }}

{% endfor %}
{% if ep.same_as %}
Options: the same as entry point `{{ ep.same_as }}`.

{% elif not ep.rows %}
No options.

{% else %}
| option | type | default | required | choices | description |
|---|---|---|---|---|---|
{% for r in ep.rows %}
| `{{ r.name }}` | {{ r.type }} | {{ r.default }} | {{ r.required }} | {{ r.choices }} | {{ r.description }} |
{% endfor %}

{% if ep.role_defaults %}
A default marked (defaults/main.yml) is not in the argument spec; it is the role's default for that variable.

{% endif %}
{% endif %}
{% endfor %}
{{ end }}
"""

_ENV = jinja2.Environment(trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True, autoescape=False)

# Ansible's documentation markup, as argument specs use it, to Markdown. The argument may hold one level of
# parentheses: C(http(s)://).
_ARG = r"\(((?:[^()]|\([^()]*\))*)\)"
_MARKUP = [
    (re.compile(r"\b[COV]" + _ARG), r"`\1`"),
    (re.compile(r"\bI" + _ARG), r"*\1*"),
    (re.compile(r"\bB" + _ARG), r"**\1**"),
    (re.compile(r"\bU" + _ARG), r"\1"),
]
_CODE_SPAN = re.compile(r"(`[^`]*`)")


class DocError(Exception):
    pass


def _markdown(text: str) -> str:
    for pattern, repl in _MARKUP:
        text = pattern.sub(repl, text)
    # Outside code spans a Markdown renderer takes <root> for an HTML tag and drops it.
    parts = _CODE_SPAN.split(text)
    return "".join(part if part.startswith("`") else part.replace("<", "&lt;").replace(">", "&gt;") for part in parts)


def _paragraphs(value) -> list[str]:
    if value is None:
        return []
    items = value if isinstance(value, list) else [value]
    return [_markdown(" ".join(str(item).split())) for item in items]


def _cell(text: str) -> str:
    """One table cell: one line, pipes escaped (GitHub also unescapes \\| inside code spans of a table)."""
    return " ".join(text.split()).replace("|", "\\|")


def _code(value) -> str:
    # An empty string would make an empty code span, which renders as two backticks.
    text = value if isinstance(value, str) and value else json.dumps(value)
    text = " ".join(text.split())
    # A code span that holds a backtick needs a longer fence.
    fence = "``" if "`" in text else "`"
    pad = " " if fence == "``" else ""
    return _cell(f"{fence}{pad}{text}{pad}{fence}")


def _type(spec: dict) -> str:
    kind = spec.get("type", "str")
    if kind == "list" and spec.get("elements"):
        return f"list of {spec['elements']}"
    return str(kind)


def _rows(options: dict, role_defaults: dict, prefix: str = "") -> list[dict]:
    rows = []
    for name, spec in (options or {}).items():
        spec = spec or {}
        full = f"{prefix}{name}"
        marked = False
        if "default" in spec:
            default = _code(spec["default"])
        elif not prefix and name in role_defaults:
            default = _code(role_defaults[name]) + " (defaults/main.yml)"
            marked = True
        else:
            default = ""
        rows.append(
            {
                "name": full,
                "type": _type(spec),
                "default": default,
                "required": "yes" if spec.get("required") else "no",
                "choices": ", ".join(_code(c) for c in spec.get("choices") or []),
                "description": _cell(" ".join(_paragraphs(spec.get("description")))),
                "marked": marked,
            }
        )
        # Suboptions of a dict, or of each element of a list of dicts.
        rows.extend(_rows(spec.get("options") or {}, role_defaults, prefix=f"{full}."))
    return rows


def load_yaml(path: Path):
    try:
        return yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise DocError(f"{_shown(path)}: not valid YAML ({exc}); fix the file") from exc


def render_section(role_dir: Path) -> str:
    """The generated part of role_dir's README, markers included."""
    spec_path = role_dir / "meta" / "argument_specs.yml"
    specs = {}
    if spec_path.exists():
        doc = load_yaml(spec_path) or {}
        specs = doc.get("argument_specs") or {}
        if not isinstance(specs, dict):
            raise DocError(f"{spec_path}: argument_specs is not a mapping of entry points")
    defaults_path = role_dir / "defaults" / "main.yml"
    role_defaults = (load_yaml(defaults_path) or {}) if defaults_path.exists() else {}
    # main first, then the other entry points in the spec's order.
    names = sorted(specs, key=lambda n: n != "main")
    entry_points, seen = [], []
    for name in names:
        spec = specs[name] or {}
        options = spec.get("options") or {}
        same_as = next((other for other, opts in seen if options and opts == options), None)
        seen.append((name, options))
        rows = [] if same_as else _rows(options, role_defaults)
        entry_points.append(
            {
                "name": name,
                "short_description": " ".join(_paragraphs(spec.get("short_description"))),
                "description": _paragraphs(spec.get("description")),
                "same_as": same_as,
                "rows": rows,
                "role_defaults": any(r["marked"] for r in rows),
            }
        )
    return _ENV.from_string(TEMPLATE).render(begin=BEGIN, end=END, entry_points=entry_points)


def update_readme(text: str | None, section: str, role: str) -> str:
    """text with its generated part replaced by section; everything outside the markers is kept as it is."""
    if text is None:
        return (
            f"# gpufleet.upgrade.{role}\n\n"
            "What the role does, the facts it publishes and an example: to be written.\n\n" + section
        )
    start, stop = text.find(BEGIN), text.find(END)
    if start == -1 and stop == -1:
        return text.rstrip("\n") + "\n\n" + section
    if start == -1 or stop == -1 or stop < start:
        raise DocError(f"one of the markers is missing or they are out of order; keep {BEGIN!r} before {END!r}")
    return text[:start] + section.rstrip("\n") + text[stop + len(END) :]


def roles(roles_dir: Path) -> list[Path]:
    return sorted(p for p in roles_dir.iterdir() if p.is_dir() and not p.name.startswith("."))


def _shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(REPO))
    except ValueError:
        return str(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 when a README is out of step")
    parser.add_argument("--roles-dir", type=Path, default=REPO / "roles", help="folder of the roles (default: roles/)")
    args = parser.parse_args(argv)
    stale, broken = [], 0
    for role_dir in roles(args.roles_dir):
        readme = role_dir / "README.md"
        try:
            old = readme.read_text() if readme.exists() else None
            new = update_readme(old, render_section(role_dir), role_dir.name)
        except DocError as exc:
            # One broken spec must not hide the state of the other roles.
            print(f"{_shown(readme)}: {exc}", file=sys.stderr)
            broken += 1
            continue
        if new == old:
            continue
        if args.check:
            stale.append(readme)
        else:
            readme.write_text(new)
            print(f"wrote {_shown(readme)}")
    for readme in stale:
        spec = readme.parent / "meta" / "argument_specs.yml"
        print(f"{_shown(readme)}: out of step with {_shown(spec)}", file=sys.stderr)
    if stale:
        print("fix: run scripts/role_docs.py and commit the READMEs it rewrites", file=sys.stderr)
    if broken:
        return 2
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
