#!/usr/bin/env bash
# Set up a fresh machine for the demo and the tests: system packages the lab needs (podman, runc, debootstrap, haproxy, slurm)
# and the report test's chromium,
# the pinned tooling venv (.venv), and the link that makes this checkout the collection gpufleet.upgrade.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
# chromium: the fleet report's HTML is opened in headless Chromium by its tests.
for tool in podman runc debootstrap xz haproxy nginx slurmctld slurmd munged chromium; do
  command -v "$tool" >/dev/null 2>&1 || need+=("$tool")
done
if ((${#need[@]})); then
  echo "setup: installing system packages for: ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >/dev/null
  apt-get install -y -q podman runc debootstrap xz-utils uidmap haproxy nginx-light slurmctld slurmd slurm-client munge chromium >/dev/null
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

# An installed copy of this collection in the user's collection path (left by a tool's "install the project" step)
# shadows this checkout for ansible-lint, which always searches ~/.ansible/collections: a copy of older code there
# fails lint with modules "not found". This checkout is the collection; such a copy is never right.
user_copy="${HOME}/.ansible/collections/ansible_collections/gpufleet/upgrade"
if [[ -e $user_copy && "$(readlink -f "$user_copy")" != "$PWD" ]]; then
  echo "setup: removing $user_copy (an installed copy of gpufleet.upgrade that would shadow this checkout)"
  rm -rf "$user_copy"
fi

# ansible-test fetches a pip bootstrap script from a server these machines cannot reach; give it the offline one,
# under the names the installed ansible-test asks for (fails, saying why, when they cannot be determined).
.venv/bin/python scripts/ansible_test_bootstrap.py

# A CPU build of torch for the smoke test's comparison tests (.venv/torch), taken only from a wheel this machine
# already has (pip's configured find-links): never download a multi-GB CUDA build for the tests.
if [[ ! -x .venv/torch/bin/python ]] || ! .venv/torch/bin/python -c 'import torch, pytest, yaml' 2>/dev/null; then
  rm -rf .venv/torch.tmp
  python3 -m venv .venv/torch.tmp
  if .venv/torch.tmp/bin/pip install -q --disable-pip-version-check --no-index --no-deps 'torch==2.13.0' 2>/dev/null; then
    .venv/torch.tmp/bin/pip install -q --disable-pip-version-check 'torch==2.13.0' 'pytest==8.4.2' 'PyYAML==6.0.4' 'numpy<3'
    rm -rf .venv/torch && mv .venv/torch.tmp .venv/torch
    echo "setup: .venv/torch ready (CPU torch for the smoke-test comparison tests)"
  else
    rm -rf .venv/torch.tmp
    echo "setup: no local CPU build of torch 2.13.0; the torch comparison tests will be skipped"
  fi
fi

# SGLang 0.5.9's own Python code (.venv/sglang) for the protocol tests that hold the benchmark client and the lab
# stand-in to it (tests/unit/plugins/module_utils/test_sglang_protocol.py). The wheel is pure Python; installed
# without its dependencies (torch, flashinfer, sgl-kernel: gigabytes), plus only what importing
# sglang.srt.entrypoints.openai.protocol needs (found by trying: sglang/utils.py imports numpy, pybase64, requests,
# IPython, aiohttp at the top; protocol.py pydantic and openai) and orjson, with which http_server.py frames its
# stream. Keyed by these pins: a change rebuilds it.
sglang_pins=('sglang==0.5.9' 'pydantic==2.14.4' 'openai==2.6.1' 'numpy==2.4.6' 'pybase64==1.5.1' 'requests==2.34.2'
  'ipython==9.18.1' 'aiohttp==3.14.5' 'orjson==3.13.0' 'pytest==8.4.2')
sglang_stamp=.venv/sglang/.pins-$(printf '%s\n' "${sglang_pins[@]}" | sha256sum | cut -c1-12)
if [[ ! -e $sglang_stamp ]] || ! .venv/sglang/bin/python -c 'import sglang.srt.entrypoints.openai.protocol, orjson, pytest' 2>/dev/null; then
  rm -rf .venv/sglang.tmp
  if .venv/bin/uv venv -q --python python3 .venv/sglang.tmp \
    && .venv/bin/uv pip install -q --python .venv/sglang.tmp/bin/python --no-deps "${sglang_pins[0]}" \
    && .venv/bin/uv pip install -q --python .venv/sglang.tmp/bin/python "${sglang_pins[@]:1}" \
    && .venv/sglang.tmp/bin/python -c 'import sglang.srt.entrypoints.openai.protocol, orjson, pytest'; then
    touch ".venv/sglang.tmp/${sglang_stamp#.venv/sglang/}"
    rm -rf .venv/sglang && mv .venv/sglang.tmp .venv/sglang
    echo "setup: .venv/sglang ready (SGLang 0.5.9's code, without its heavy dependencies, for the protocol tests)"
  else
    rm -rf .venv/sglang.tmp
    echo "setup: could not build .venv/sglang from the default index (see the errors above); the SGLang protocol" \
      "tests need it: check that pip's configured index is reachable and run make setup again" >&2
    exit 1
  fi
fi
