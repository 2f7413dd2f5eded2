#!/usr/bin/env bash
# Set up a fresh machine for the demo and the tests: system packages the lab needs (podman, runc, debootstrap),
# the pinned tooling venv (.venv), and the link that makes this checkout the collection gpufleet.upgrade.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
for tool in podman runc debootstrap xz; do
  command -v "$tool" >/dev/null 2>&1 || need+=("$tool")
done
if ((${#need[@]})); then
  echo "setup: installing system packages for: ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >/dev/null
  apt-get install -y -q podman runc debootstrap xz-utils uidmap >/dev/null
fi

stamp=.venv/.tooling-$(sha256sum requirements/tooling.txt | cut -c1-12)
if [[ ! -e $stamp ]]; then
  echo "setup: building .venv from requirements/tooling.txt"
  python3 -m venv .venv
  .venv/bin/pip install -q --disable-pip-version-check --upgrade pip
  .venv/bin/pip install -q --disable-pip-version-check -r requirements/tooling.txt
  rm -f .venv/.tooling-*
  touch "$stamp"
fi

mkdir -p .venv/collections/ansible_collections/gpufleet
ln -sfn "$PWD" .venv/collections/ansible_collections/gpufleet/upgrade

# ansible-test fetches a pip bootstrap script from a server these machines cannot reach; give it the offline one.
for version in $(.venv/bin/python - <<'PY'
import pathlib, re
import ansible_test
root = pathlib.Path(ansible_test.__file__).parent
found = set()
for f in root.rglob("*.txt"):
    for m in re.finditer(r"^pip==([0-9.]+)", f.read_text(errors="ignore"), re.M):
        found.add(m.group(1))
print(" ".join(sorted(found)))
PY
); do
  mkdir -p ~/.ansible/test/cache
  cp tests/sanity/get_pip_bootstrap.py ~/.ansible/test/cache/get_pip_${version//./_}.py
done
