"""The collection builds with ansible-galaxy, installs into a fresh path, and works from there."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw)


def test_build_install_and_run_a_module(tmp_path):
    run([str(BIN / "ansible-galaxy"), "collection", "build", str(REPO), "--output-path", str(tmp_path)])
    tarball = next(tmp_path.glob("gpufleet-upgrade-*.tar.gz"))
    with tarfile.open(tarball) as tar:
        names = tar.getnames()
    assert "stacks/cu130.yml" in names and "plugins/action/stack_profile.py" in names
    assert not [n for n in names if n.startswith(("lab/", ".venv", "bench/"))], "build_ignore leaks lab/venv files"

    install = tmp_path / "collections"
    config = tmp_path / "ansible.cfg"
    config.write_text(f"[defaults]\ncollections_path = {install}\nstdout_callback = json\n")
    env = dict(os.environ, ANSIBLE_CONFIG=str(config))
    env.pop("ANSIBLE_COLLECTIONS_PATH", None)
    # --no-deps: no Galaxy server here; ansible.utils comes with the ansible bundle in the venv.
    run(
        [
            str(BIN / "ansible-galaxy"),
            "collection",
            "install",
            "--force",
            "--no-deps",
            str(tarball),
            "-p",
            str(install),
        ],
        env=env,
    )
    playbook = tmp_path / "play.yml"
    playbook.write_text(
        "- hosts: localhost\n  gather_facts: false\n  tasks:\n    - gpufleet.upgrade.stack_profile: {name: cu130}\n"
    )
    out = run([str(BIN / "ansible-playbook"), "-i", "localhost,", "-c", "local", str(playbook)], env=env, cwd=tmp_path)
    result = json.loads(out.stdout)["plays"][0]["tasks"][0]["hosts"]["localhost"]
    assert result["profile"]["cuda"]["version"] == "13.0"
    assert str(install) in result["profile"]["source"]["path"], "the module ran from the checkout, not the install"
