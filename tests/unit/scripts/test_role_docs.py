# Copyright: (c) 2026, gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""scripts/role_docs.py: the README variables table follows meta/argument_specs.yml, --check catches drift."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "scripts" / "role_docs.py"

sys.path.insert(0, str(REPO / "scripts"))
import role_docs as docs  # noqa: E402

SPEC = """\
---
argument_specs:
  main:
    short_description: Do the thing
    description:
      - Writes C(<root>/thing) and publishes C(demo_done).
    options: &demo_options
      demo_path:
        type: path
        required: true
        description: Where the thing goes.
      demo_mode:
        type: str
        choices: [fast, safe]
        default: safe
        description: How, C(fast) or C(safe).
      demo_filter:
        type: str
        default: "{{ demo_items | map('upper') | list }}"
        description: A default with a pipe.
      demo_limits:
        type: dict
        description: Limits.
        options:
          max_bytes:
            type: int
            default: 10
            description: Largest file.
          names:
            type: list
            elements: str
            default: []
            description: Names kept.
      demo_from_defaults:
        type: bool
        description: Default only in defaults/main.yml.
      demo_empty:
        type: str
        default: ""
        description: Empty by default.
  undo:
    short_description: Undo the thing
    options:
      demo_keep:
        type: bool
        default: false
        description: Keep the thing.
  again:
    short_description: Do it again
    options: *demo_options
"""

TABLE_MAIN = """\
| option | type | default | required | choices | description |
|---|---|---|---|---|---|
| `demo_path` | path |  | yes |  | Where the thing goes. |
| `demo_mode` | str | `safe` | no | `fast`, `safe` | How, `fast` or `safe`. |
| `demo_filter` | str | `{{ demo_items \\| map('upper') \\| list }}` | no |  | A default with a pipe. |
| `demo_limits` | dict |  | no |  | Limits. |
| `demo_limits.max_bytes` | int | `10` | no |  | Largest file. |
| `demo_limits.names` | list of str | `[]` | no |  | Names kept. |
| `demo_from_defaults` | bool | `true` (defaults/main.yml) | no |  | Default only in defaults/main.yml. |
| `demo_empty` | str | `""` | no |  | Empty by default. |
"""

HAND_BEFORE = "# gpufleet.upgrade.demo\n\nDoes the thing, step by step.\n\n"
HAND_AFTER = "\n\n## Tests\nSee the unit tests.\n"


def make_role(tmp_path: Path, spec: str = SPEC) -> Path:
    role = tmp_path / "roles" / "demo"
    (role / "meta").mkdir(parents=True)
    (role / "defaults").mkdir()
    (role / "meta" / "argument_specs.yml").write_text(spec)
    (role / "defaults" / "main.yml").write_text("---\ndemo_from_defaults: true\ndemo_mode: safe\n")
    return role


def run(roles_dir: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--roles-dir", str(roles_dir), *args],
        capture_output=True,
        text=True,
        check=False,
    )


def test_spec_renders_the_expected_table(tmp_path):
    section = docs.render_section(make_role(tmp_path))
    assert section.startswith(docs.BEGIN + "\n## Variables\n")
    assert section.rstrip().endswith(docs.END)
    assert "### Entry point `main`\n\nDo the thing\n\nWrites `<root>/thing` and publishes `demo_done`.\n" in section
    assert TABLE_MAIN in section
    assert "A default marked (defaults/main.yml) is not in the argument spec" in section
    # Another entry point gets its own table; one sharing main's options (a YAML anchor) says so.
    assert "### Entry point `undo` (`tasks_from: undo`)\n\nUndo the thing\n" in section
    assert "| `demo_keep` | bool | `false` | no |  | Keep the thing. |" in section
    assert (
        "### Entry point `again` (`tasks_from: again`)\n\nDo it again\n\nOptions: the same as entry point `main`."
        in section
    )
    # main comes first whatever the spec's order.
    assert section.index("`main`") < section.index("`undo`") < section.index("`again`")


def test_angle_brackets_outside_code_are_escaped():
    assert (
        docs._markdown("goes to <root>/x, C(<root>/y), C(http(s)://)")
        == "goes to &lt;root&gt;/x, `<root>/y`, `http(s)://`"
    )


def test_check_fails_on_a_stale_readme_and_passes_after_regenerating(tmp_path):
    role = make_role(tmp_path)
    roles_dir = role.parent
    readme = role / "README.md"
    readme.write_text(HAND_BEFORE + docs.BEGIN + "\n## Variables\nold table\n" + docs.END + HAND_AFTER)

    stale = run(roles_dir, "--check")
    assert stale.returncode == 1
    assert f"{readme}: out of step with {role / 'meta' / 'argument_specs.yml'}" in stale.stderr
    assert "fix: run scripts/role_docs.py" in stale.stderr
    assert "old table" in readme.read_text(), "--check must not write"

    wrote = run(roles_dir)
    assert wrote.returncode == 0, wrote.stderr
    assert f"wrote {readme}" in wrote.stdout
    assert run(roles_dir, "--check").returncode == 0

    # A spec change makes the README stale again.
    spec = role / "meta" / "argument_specs.yml"
    spec.write_text(spec.read_text().replace("Where the thing goes.", "Where the thing lives."))
    again = run(roles_dir, "--check")
    assert again.returncode == 1 and str(readme) in again.stderr


def test_hand_written_part_is_kept(tmp_path):
    role = make_role(tmp_path)
    readme = role / "README.md"
    readme.write_text(HAND_BEFORE + docs.BEGIN + "\nstale\n" + docs.END + HAND_AFTER)
    assert docs.main(["--roles-dir", str(role.parent)]) == 0
    text = readme.read_text()
    assert text.startswith(HAND_BEFORE + docs.BEGIN + "\n## Variables\n")
    assert text.endswith(docs.END + HAND_AFTER)
    assert "stale" not in text and TABLE_MAIN in text


def test_readme_without_markers_gets_the_section_appended_and_a_missing_one_is_created(tmp_path):
    role = make_role(tmp_path)
    readme = role / "README.md"
    readme.write_text("# gpufleet.upgrade.demo\n\nHand-written only.\n")
    assert docs.main(["--roles-dir", str(role.parent)]) == 0
    assert readme.read_text().startswith("# gpufleet.upgrade.demo\n\nHand-written only.\n\n" + docs.BEGIN)

    readme.unlink()
    assert docs.main(["--roles-dir", str(role.parent), "--check"]) == 1
    assert docs.main(["--roles-dir", str(role.parent)]) == 0
    assert readme.read_text().startswith("# gpufleet.upgrade.demo\n")


def test_broken_spec_is_named_and_other_roles_still_written(tmp_path):
    good = make_role(tmp_path)
    bad = tmp_path / "roles" / "broken"
    (bad / "meta").mkdir(parents=True)
    (bad / "meta" / "argument_specs.yml").write_text("argument_specs:\n  main:\n    description: a: b\n")
    res = run(good.parent)
    assert res.returncode == 2
    assert "broken/meta/argument_specs.yml: not valid YAML" in res.stderr
    assert (good / "README.md").exists()


def test_the_collection_readmes_are_in_step():
    res = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stderr
