# Copyright: (c) 2026, gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The roles and playbooks read no fact through an injected ``ansible_<fact>`` variable.

ansible-core 2.24 turns INJECT_FACTS_AS_VARS off (2.21 warns at every such read): a fact is then only
``ansible_facts['<fact>']``. Every ``ansible_*`` name the roles, playbooks and templates use must be a magic or
connection variable, which stay. (What this collection's own modules publish is kept as variables by the roles that
call them; ``scripts/matrix.sh`` with ``MATRIX_INJECT_FACTS_AS_VARS=False`` runs the lab end to end that way.)
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# Magic and connection variables (not facts): ansible-core keeps them whatever INJECT_FACTS_AS_VARS says.
NOT_FACTS = {
    "ansible_facts",
    "ansible_check_mode",
    "ansible_diff_mode",
    "ansible_failed_result",
    "ansible_failed_task",
    "ansible_play_hosts",
    "ansible_play_hosts_all",
    "ansible_play_batch",
    "ansible_play_name",
    "ansible_play_role_names",
    "ansible_playbook_python",
    "ansible_python_interpreter",
    "ansible_managed",
    "ansible_loop",
    "ansible_loop_var",
    "ansible_index_var",
    "ansible_parent_role_names",
    "ansible_parent_role_paths",
    "ansible_role_name",
    "ansible_role_names",
    "ansible_collection_name",
    "ansible_run_tags",
    "ansible_skip_tags",
    "ansible_limit",
    "ansible_version",
    "ansible_verbosity",
    "ansible_forks",
    "ansible_config_file",
    "ansible_search_path",
    "ansible_inventory_sources",
    "ansible_host",
    "ansible_port",
    "ansible_user",
    "ansible_connection",
    "ansible_become",
    "ansible_become_user",
    "ansible_become_method",
    "ansible_ssh_private_key_file",
    "ansible_ssh_common_args",
}
NAME = re.compile(r"\bansible_[a-z0-9_]+\b")


def injected_reads(repo: Path = REPO) -> list[str]:
    found = []
    for top in ("roles", "playbooks"):
        for path in sorted((repo / top).rglob("*")):
            if path.suffix not in (".yml", ".yaml", ".j2") or not path.is_file():
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if line.lstrip().startswith("#"):
                    continue
                found += [
                    f"{path.relative_to(repo)}:{number}: {name}"
                    for name in NAME.findall(line)
                    if name not in NOT_FACTS and not name.startswith("ansible_facts")
                ]
    return found


def test_no_fact_is_read_as_an_injected_variable():
    reads = injected_reads()
    assert not reads, (
        "facts read as injected ansible_* variables (undefined once INJECT_FACTS_AS_VARS is off): "
        f"{reads}; read them as ansible_facts.<name without ansible_>"
    )


def test_the_scan_sees_an_injected_read(tmp_path):
    # The scan itself: a file that reads ansible_env is found, one that reads ansible_facts.env is not.
    (tmp_path / "roles/r/tasks").mkdir(parents=True)
    (tmp_path / "playbooks").mkdir()
    (tmp_path / "roles/r/tasks/main.yml").write_text(
        "- ansible.builtin.debug:\n"
        "    msg: '{{ ansible_env.HOME }} {{ ansible_facts.env.HOME }} {{ ansible_check_mode }}'\n"
    )
    assert injected_reads(tmp_path) == ["roles/r/tasks/main.yml:2: ansible_env"]
