#!/usr/bin/env bash
# ansible-test must run from an ansible_collections/<namespace>/<name> path inside a git tree: copy the tracked files
# there, then run the sanity tests with this machine's Python.
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD
# A folder of its own per run, so runs side by side do not delete each other's copy.
mkdir -p build
work=$(mktemp -d "$repo/build/sanity.XXXXXX")
trap 'rm -rf "$work"' EXIT
dest=$work/ansible_collections/gpufleet/upgrade
mkdir -p "$dest"
# tests/data holds upstream files recorded verbatim (a package's own loader, read as the lock rules' evidence): they
# are not the collection's code, so sanity does not judge them (as lab/ and bench/, tooling outside the collection).
git ls-files -co --exclude-standard | grep -v '^lab/\|^bench/\|^tests/data/' | tar -cT - | tar -C "$dest" -x
cd "$dest"
git init -q && git add -A && git -c user.email=ci@localhost -c user.name=ci commit -qm sanity
# ANSIBLE_TEST and SANITY_PYTHON: another ansible-core's ansible-test and its Python (scripts/matrix.sh).
"${ANSIBLE_TEST:-$repo/.venv/bin/ansible-test}" sanity \
  --python "${SANITY_PYTHON:-$(python3 -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')}" \
  "$@" 2>&1 | grep -v -E '^(Looking in|WARNING: Location|Collecting|Downloading|  Downloading|Using cached|Successfully|Installing collected|Requirement already| +━)' 
