"""The collection as released: built by ansible-galaxy, lean, installed into an empty path, and run from there.

- The tarball holds only what a fleet runs (an allow-list by folder: no lab, tests, molecule, bench, scripts, lab
  profiles or inventory); its size and contents by folder are printed.
- Installed into an empty collections path with the collections galaxy.yml declares (copied from the tooling venv's
  ``ansible`` bundle: no Galaxy server here) in a venv holding only ansible-core and requirements.txt, it upgrades a
  lab host with ``ansible-playbook gpufleet.upgrade.upgrade`` from a folder outside the checkout, the summary
  callback enabled as the README says, the site's profile found through ``gpufleet_stack_search_dirs``; then a
  failure injected after the switch is rolled back automatically from the install (the rescue path needs nothing
  undeclared).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import urllib.request
from collections import Counter
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent

# What may ship, by top-level entry; a folder's entries below it are checked by SHIPPED_BELOW.
SHIPPED = {
    "FILES.json",
    "MANIFEST.json",
    "README.md",
    "CHANGELOG.md",
    "LICENSE",
    "requirements.txt",
    "changelogs",
    "docs",
    "inventories",
    "meta",
    "playbooks",
    "plugins",
    "roles",
    "stacks",
}
SHIPPED_BELOW = {
    "inventories": {"example"},
    # Ansible's plugin folders (a new kind of plugin ships; anything else under plugins/ does not).
    "plugins": {
        *("action", "become", "cache", "callback", "cliconf", "connection", "doc_fragments", "filter", "httpapi"),
        *("inventory", "lookup", "module_utils", "modules", "netconf", "plugin_utils", "shell", "strategy"),
        *("terminal", "test", "vars"),
    },
}
# What a fleet needs to run the three playbooks as the README and the operator's guide say.
REQUIRED = {
    "playbooks/upgrade.yml",
    "playbooks/audit.yml",
    "playbooks/rollback.yml",
    "stacks/cu130.yml",
    "stacks/cu128.yml",
    "stacks/schema/stack-profile.schema.yml",
    "plugins/callback/upgrade_summary.py",
    "meta/runtime.yml",
    "requirements.txt",
    "LICENSE",
    "CHANGELOG.md",
    "docs/operator-guide.md",
    "inventories/example/hosts.yml",
}


def run(cmd, **kw):
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, check=False, **kw)
    assert proc.returncode == 0, (
        f"{' '.join(map(str, cmd))}: rc {proc.returncode}\n{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}"
    )
    return proc


def by_folder(names: list[str], sizes: dict[str, int]) -> dict[str, tuple[int, int]]:
    """{first two path parts: (files, bytes)} of a tarball's regular files."""
    out: dict[str, list[int]] = {}
    for name in names:
        parts = name.split("/")
        key = "/".join(parts[:2]) if len(parts) > 2 else parts[0]
        entry = out.setdefault(key, [0, 0])
        entry[0] += 1
        entry[1] += sizes[name]
    return {k: (v[0], v[1]) for k, v in sorted(out.items())}


@pytest.fixture(scope="module")
def tarball(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("build")
    run([BIN / "ansible-galaxy", "collection", "build", REPO, "--output-path", out])
    return next(out.glob("gpufleet-upgrade-*.tar.gz"))


def test_the_tarball_ships_what_a_fleet_runs_and_nothing_of_the_lab(tarball):
    with tarfile.open(tarball) as tar:
        members = [m for m in tar.getmembers() if m.isfile()]
    names = [m.name for m in members]
    folders = by_folder(names, {m.name: m.size for m in members})
    print(f"\n{tarball.name}: {tarball.stat().st_size} bytes compressed, {len(names)} files")
    for folder, (count, size) in folders.items():
        print(f"  {folder:32} {count:4} files {size:9} bytes")

    leaked = sorted(
        n
        for n in names
        if n.split("/")[0] not in SHIPPED
        or (n.split("/")[0] in SHIPPED_BELOW and n.split("/")[1] not in SHIPPED_BELOW[n.split("/")[0]])
    )
    assert not leaked, f"the tarball ships files outside the allow-list (add them to galaxy.yml build_ignore): {leaked}"
    lab_stacks = [n for n in names if n.startswith("stacks/") and Path(n).name.startswith("lab")]
    assert not lab_stacks, f"the lab's profiles ship: {lab_stacks}"
    caches = [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    assert not caches, caches
    assert not REQUIRED - set(names), f"the tarball lacks {sorted(REQUIRED - set(names))}"
    # Every role and every plugin of the checkout ships.
    tracked = run(["git", "ls-files", "roles", "plugins"], cwd=REPO).stdout.split()
    unshipped = [p for p in tracked if p not in names and (REPO / p).exists()]
    assert not unshipped, f"tracked roles/plugins files missing from the tarball: {unshipped}"


def _declared_collection_dirs() -> list[Path]:
    """The folders of the collections galaxy.yml declares, as the tooling venv's ansible bundle holds them."""
    deps = yaml.safe_load((REPO / "galaxy.yml").read_text()).get("dependencies") or {}
    roots = [Path(p) / "ansible_collections" for p in sys.path if (Path(p) / "ansible_collections").is_dir()]
    found = []
    for fqcn in deps:
        ns, name = fqcn.split(".")
        where = [r / ns / name for r in roots if (r / ns / name / "MANIFEST.json").is_file()]
        if not where:
            pytest.fail(f"declared dependency {fqcn} is not in the tooling venv ({roots}): install it there first")
        found.append(where[0])
    return found


def newest_python() -> str:
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    found = sorted(
        (tuple(int(x) for x in p.name.split(".")), p / "bin/python3")
        for p in (root.iterdir() if root.is_dir() else [])
        if re.fullmatch(r"3\.\d+\.\d+", p.name) and (p / "bin/python3").exists()
    )
    return str(found[-1][1]) if found and found[-1][0] >= (3, 12) else sys.executable


@pytest.fixture(scope="module")
def released(tarball, tmp_path_factory):
    """A controller as the README sets one up, outside the checkout: a venv with ansible-core and requirements.txt
    only, the tarball and its declared collections in an empty collections path, an ansible.cfg enabling the
    summary callback. Returns (site folder, env, bin)."""
    site = tmp_path_factory.mktemp("site")
    venv = site / "venv"
    # What `pip install -r requirements.txt` gives a user today: the newest ansible-core it allows, on the newest
    # Python pyenv has (ansible-core 2.20+ needs 3.12+); this machine's Python (ansible-core 2.19) without pyenv.
    run([BIN / "uv", "venv", "-q", "--python", newest_python(), venv])
    run([BIN / "uv", "pip", "install", "-q", "--python", venv / "bin/python", "-r", REPO / "requirements.txt"])
    print(f"\nreleased controller: {run([venv / 'bin/ansible', '--version']).stdout.splitlines()[0]}")
    bundle = subprocess.run([venv / "bin/python", "-c", "import ansible_collections"], capture_output=True, check=False)
    assert bundle.returncode != 0, "the released venv holds the ansible bundle: it would hide undeclared dependencies"

    collections = site / "collections"
    config = site / "ansible.cfg"
    config.write_text(
        f"[defaults]\ncollections_path = {collections}\n"
        "callbacks_enabled = gpufleet.upgrade.upgrade_summary\ninterpreter_python = auto_silent\n"
        "[ssh_connection]\npipelining = True\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "GPUFLEET_"))}
    env.update(ANSIBLE_CONFIG=str(config), PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", ANSIBLE_NOCOLOR="1")
    galaxy = venv / "bin/ansible-galaxy"
    run([galaxy, "collection", "install", "--no-deps", tarball, "-p", collections], env=env, cwd=site)
    for folder in _declared_collection_dirs():
        run([galaxy, "collection", "install", "--no-deps", folder, "-p", collections], env=env, cwd=site)
    listed = json.loads(run([galaxy, "collection", "list", "--format", "json"], env=env, cwd=site).stdout)
    names = {name for path, found in listed.items() if path.startswith(str(collections)) for name in found}
    assert names == {"gpufleet.upgrade", *yaml.safe_load((REPO / "galaxy.yml").read_text())["dependencies"]}, listed
    return site, env, venv / "bin"


def test_installed_module_runs_from_the_install(released):
    site, env, bindir = released
    out = site / "profile.json"
    playbook = site / "play.yml"
    playbook.write_text(
        "- hosts: localhost\n  gather_facts: false\n  tasks:\n"
        "    - gpufleet.upgrade.stack_profile: {name: cu130}\n      register: loaded\n"
        f"    - ansible.builtin.copy: {{content: '{{{{ loaded.profile | to_json }}}}', dest: {out}}}\n"
    )
    local = ["-i", "localhost,", "-c", "local", "-e", f"ansible_python_interpreter={bindir / 'python'}"]
    run([bindir / "ansible-playbook", *local, playbook], env=env, cwd=site)
    profile = json.loads(out.read_text())
    assert profile["cuda"]["version"] == "13.0"
    assert str(site / "collections") in profile["source"]["path"], "the module ran from the checkout"


@pytest.mark.integration
def test_installed_collection_upgrades_audits_and_rolls_back_a_lab_host_from_outside_the_checkout(
    released, lab_fleet, node_exec
):
    site, env, bindir = released
    fleet = lab_fleet(1, name="it-collection-build")
    node = fleet.nodes[0]
    # The site's own profiles live in its folder; the lab's target stack stands for one (it does not ship).
    stacks = site / "stacks"
    stacks.mkdir(exist_ok=True)
    shutil.copy(REPO / "stacks/lab.yml", stacks / "lab.yml")
    site_vars = json.dumps({"gpufleet_stack_search_dirs": [str(stacks)], "gpufleet_stack_profile": "lab"})
    deprecations: Counter = Counter()

    def playbook(name: str, *args: str, rc: int = 0) -> tuple[str, dict]:
        summary = site / f"{name}.json"
        proc = subprocess.run(
            [bindir / "ansible-playbook", f"gpufleet.upgrade.{name}", "-i", fleet.inventory, "-e", site_vars, *args],
            env=dict(env, GPUFLEET_SUMMARY_FILE=str(summary)),
            cwd=site,
            capture_output=True,
            text=True,
            check=False,
        )
        assert proc.returncode == rc, f"{name}: rc {proc.returncode}\n{proc.stdout[-8000:]}\n{proc.stderr[-3000:]}"
        deprecations.update(deprecated_here(proc.stderr))
        return proc.stdout, json.loads(summary.read_text()) if summary.exists() else {}

    out, summary = playbook("upgrade")
    assert summary["hosts"][node]["outcome_kind"] == "upgraded", summary
    assert f"gpufleet: {node}: upgraded" in out, out[-4000:]
    assert "gpufleet report:" in out, "the summary callback did not write the fleet report"
    assert served(fleet, node)["cuda_home"] == "/usr/local/cuda-13.0"

    out = playbook("audit", "--check", "--diff")[0]
    assert f"{node}: in sync" in out, out[-4000:]

    out, summary = playbook("rollback")
    assert summary["hosts"][node]["outcome_kind"] == "restored", summary
    assert served(fleet, node)["cuda_home"] == "/usr/local/cuda-12.8"

    # The rescue path as installed: a failure after the switch is rolled back automatically with only ansible-core
    # and the declared collections (a rollback that needed an undeclared collection ended the run with rc 4, the host
    # on the new venv, the lock held and no report).
    out, summary = playbook("upgrade", "-e", "gpufleet_fault_inject=after_venv", rc=2)
    assert summary["hosts"][node]["outcome_kind"] == "rolled_back", summary
    assert served(fleet, node)["cuda_home"] == "/usr/local/cuda-12.8", "the old stack does not serve"
    node_state = json.loads(node_exec(node, "cat /var/lib/gpufleet/state.json").stdout)
    assert node_state["result"] == "rolled_back", node_state
    held = node_exec(node, "test -e /var/lib/gpufleet/upgrade.lock && echo held || echo free")
    assert held.stdout.strip() == "free", "the automatic rollback left the host lock held"

    # Printed, not asserted: ansible-core 2.21 still warns where a template names a variable that a module of this
    # collection also publishes as a fact (once per upgrade run, in roles/venv_rebuild/tasks/plan.yml); with
    # INJECT_FACTS_AS_VARS=False (scripts/matrix.sh MATRIX_INJECT_FACTS_AS_VARS=False) there is none.
    print(f"\nreleased runs: deprecation warnings whose origin is this collection's code: {dict(deprecations)}")


def deprecated_here(stderr: str) -> list[str]:
    """'<warning> at <origin>' of each deprecation warning whose Origin is a file of gpufleet.upgrade."""
    found = []
    for block in stderr.split("[DEPRECATION WARNING]:")[1:]:
        origin = re.search(r"^Origin: (\S+)", block, re.M)
        if origin and "/ansible_collections/gpufleet/upgrade/" in origin.group(1):
            found.append(f"{block.splitlines()[0].strip()} at {origin.group(1).split('/gpufleet/upgrade/')[1]}")
    return found


def served(fleet, node) -> dict:
    url = f"http://127.0.0.1:{fleet.serving_port(node)}/get_server_info"
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.load(resp)["gpufleet_lab"]
