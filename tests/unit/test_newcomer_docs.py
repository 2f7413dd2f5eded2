# Copyright: (c) 2026, gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The docs walked as a newcomer follows them literally: the README an installed copy opens with gives the installed
commands, says how the tarball is made and that the tools live in .venv; its requirements list and layout table
name what the checkout has; `make demo` ends with what next and `make lab-down` stops the mirrors; the supported
ansible-core range (2.19-2.22) is the same in requirements.txt, the matrix, the sanity ignores and the README; a lock
file's header gives the command in the installed form."""

from __future__ import annotations

import re
from pathlib import Path

from packaging.requirements import Requirement

from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _lock_file

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text(encoding="utf-8")
MAKEFILE = (REPO / "Makefile").read_text(encoding="utf-8")


def requirements():
    lines = (REPO / "requirements.txt").read_text(encoding="utf-8").splitlines()
    return [Requirement(line) for line in lines if line.strip() and not line.lstrip().startswith("#")]


def recipe(target):
    match = re.search(rf"^{target}:.*\n((?:\t.*\n)+)", MAKEFILE, re.M)
    assert match, target
    return match.group(1)


def layout_row(folder):
    return next(line for line in README.splitlines() if line.startswith(f"| `{folder}` |"))


def test_the_readme_opens_with_the_installed_commands_then_how_to_build_the_tarball():
    first_block = README.split("```", 2)[1]
    assert "ansible-playbook -i hosts.yml gpufleet.upgrade.upgrade" in first_block
    assert "make " not in first_block, "an installed copy has no Makefile"
    assert "make build" in README and "ansible-galaxy collection build" in README
    assert ". .venv/bin/activate" in README


def test_the_readme_requirements_list_names_every_package_of_requirements_txt():
    listed = re.search(r"`requirements\.txt`\n\(([^)]*)\)", README).group(1)
    for req in requirements():
        assert req.name in listed, (req.name, listed)


def test_the_layout_table_names_every_role_and_playbook():
    roles = layout_row("roles/")
    for role in sorted(p.name for p in (REPO / "roles").iterdir() if (p / "tasks").is_dir()):
        assert f"`{role}`" in roles, role
    playbooks = layout_row("playbooks/")
    for playbook in sorted(p.name for p in (REPO / "playbooks").glob("*.yml")):
        assert f"`{playbook}`" in playbooks, playbook


def test_make_demo_ends_with_what_next_and_lab_down_stops_the_mirrors():
    demo = recipe("demo")
    assert demo.index("playbooks/upgrade.yml") < demo.index("What next")
    assert ".venv/bin/activate" in demo and "gpufleet_rollback_all=true" in demo
    assert "lab mirrors stop" in recipe("lab-down")


def test_ansible_core_2_19_to_2_22_everywhere():
    core = next(r for r in requirements() if r.name == "ansible-core")
    assert core.specifier.contains("2.22.0") and core.specifier.contains("2.19.0")
    assert not core.specifier.contains("2.23.0") and not core.specifier.contains("2.18.9")
    matrix = (REPO / "scripts" / "matrix.sh").read_text(encoding="utf-8")
    assert re.search(r"versions=\$\{MATRIX_VERSIONS:-2\.19 2\.20 2\.21 2\.22\}", matrix)
    assert "[2.22]=3.13" in matrix
    assert (REPO / "tests" / "sanity" / "ignore-2.22.txt").is_file()
    assert "ansible-core 2.19\u20132.22" in README and "<2.23'" in README


def test_the_lock_file_header_gives_the_installed_command():
    assert "planned by gpufleet.upgrade.plan" in _lock_file.HEADER
    assert "ansible-playbook -i <inventory> gpufleet.upgrade.upgrade -e gpufleet_lock_file=" in _lock_file.HEADER
    assert "playbooks/" not in _lock_file.HEADER
