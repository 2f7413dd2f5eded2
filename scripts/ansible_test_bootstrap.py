# Copyright: (c) 2026, gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Put ansible-test's pip bootstrap script in place, offline.

ansible-test bootstraps pip into each sanity venv with a script it downloads from its own file server
(unreachable from these machines) and caches as ~/.ansible/test/cache/get_pip_<pip version>.py. This writes
the offline stand-in (tests/sanity/get_pip_bootstrap.py) under every name the installed ansible-test will ask
for. The pip versions come from ansible-test's own function (get_venv_packages) for every Python it supports,
not from a text search, and the installed ansible-core must be the one requirements/tooling.txt pins: if either
cannot be determined, this fails and says what to do instead of silently writing nothing.

The files are rewritten from the clone on every run (byte-compared first), so a stale or hand-made copy under
~/.ansible is never what ansible-test runs.

    python scripts/ansible_test_bootstrap.py            # writes, prints one line per file
    python scripts/ansible_test_bootstrap.py --check    # exit 1 when a file is missing or differs
"""

from __future__ import annotations

import argparse
import os
import sys
import types
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
STAND_IN = REPO / "tests" / "sanity" / "get_pip_bootstrap.py"
TOOLING = REPO / "requirements" / "tooling.txt"


class SetupError(Exception):
    pass


def pinned_ansible_core(tooling: Path = TOOLING) -> str:
    """The ansible-core version requirements/tooling.txt pins with ==."""
    from packaging.requirements import InvalidRequirement, Requirement

    for raw in tooling.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        if req.name == "ansible-core":
            pins = [s.version for s in req.specifier if s.operator == "=="]
            if len(pins) == 1:
                return pins[0]
            raise SetupError(f"{tooling}: ansible-core is not pinned with == ({line!r}); pin one version")
    raise SetupError(f"{tooling}: no ansible-core line; add ansible-core==<version>")


def installed_ansible_core() -> str:
    try:
        return metadata.version("ansible-core")
    except metadata.PackageNotFoundError as exc:
        raise SetupError("ansible-core is not installed in this Python; run scripts/setup.sh first") from exc


def pip_versions() -> dict[str, str]:
    """Python version -> the pip version ansible-test bootstraps into that Python's sanity venvs."""
    try:
        from ansible_test._internal.constants import SUPPORTED_PYTHON_VERSIONS
        from ansible_test._internal.python_requirements import get_venv_packages
    except ImportError as exc:
        raise SetupError(
            f"cannot read ansible-test's pip pin ({exc}); this ansible-core moved it: find where ansible-test "
            "builds its PipBootstrap (python_requirements.py: collect_bootstrap) and update "
            "scripts/ansible_test_bootstrap.py"
        ) from exc
    found = {}
    for version in SUPPORTED_PYTHON_VERSIONS:
        pip = get_venv_packages(types.SimpleNamespace(version=version)).get("pip")
        if not pip:
            raise SetupError(f"ansible-test names no pip version for Python {version}; update this script")
        found[version] = pip
    if not found:
        raise SetupError("ansible-test lists no supported Python versions; update this script")
    return found


def cache_dir() -> Path:
    # ansible-test itself uses os.path.expanduser('~/.ansible/test/cache'): HOME decides, as here.
    return Path(os.path.expanduser("~/.ansible/test/cache"))


def targets() -> list[Path]:
    return [cache_dir() / f"get_pip_{pip.replace('.', '_')}.py" for pip in sorted(set(pip_versions().values()))]


def out_of_date(paths: list[Path], body: bytes) -> list[Path]:
    return [p for p in paths if not p.exists() or p.read_bytes() != body]


def install(any_core: bool = False) -> list[Path]:
    pinned, installed = pinned_ansible_core(), installed_ansible_core()
    if pinned != installed and not any_core:
        raise SetupError(
            f"ansible-core {installed} is installed but requirements/tooling.txt pins {pinned}; "
            "rebuild the tooling venv (rm -rf .venv && bash scripts/setup.sh)"
        )
    body = STAND_IN.read_bytes()
    paths = targets()
    for path in out_of_date(paths, body):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + f".tmp-{os.getpid()}")
        tmp.write_bytes(body)
        tmp.replace(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only report whether every file is in place and current")
    ap.add_argument(
        "--any-ansible-core",
        action="store_true",
        help="for the ansible-core of this Python, whatever requirements/tooling.txt pins (scripts/matrix.sh)",
    )
    args = ap.parse_args(argv)
    try:
        if args.check:
            bad = out_of_date(targets(), STAND_IN.read_bytes())
            for p in bad:
                print(f"ansible-test bootstrap: {p} missing or not the clone's stand-in", file=sys.stderr)
            return 1 if bad else 0
        for path in install(args.any_ansible_core):
            print(f"setup: ansible-test pip bootstrap {path}")
    except SetupError as exc:
        print(f"setup: ansible-test bootstrap: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
