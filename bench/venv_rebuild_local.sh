#!/usr/bin/env bash
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
#
# Benchmark: bench/venv_rebuild.py's role-lock and pip rows as whole ansible-playbook runs against this machine
# itself (connection local, as root), for a machine with no lab node: a many-core GPU host. Offline: it needs
# .lab/mirrors/lab-main and lab-stale (python -m lab mirrors build) and, in WHEELS, the wheels of ansible-core,
# resolvelib, pypiserver, defusedxml, importlib-resources, jsonschema and its dependencies (and cryptography, cffi,
# pycparser where the Python lacks cryptography), and the collection ansible.utils; the machine's Python must have
# jinja2, PyYAML and packaging. It writes under /opt/gpufleet and WORK (default /tmp/gpufleet-vr-local).
#
#     WHEELS=.devwheels SCALE=1 REPEATS=2 bash bench/venv_rebuild_local.sh
#
# On the device machine (no network), carry .lab/mirrors/lab-main, .lab/mirrors/lab-stale, the WHEELS folder
# (filled here with `pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64
# -d .devwheels ansible-core==<the .venv's> ...`, the versions of this checkout's .venv) and
# .venv/lib/python3.11/site-packages/ansible_collections/ansible/utils.
#
# Builds the sized set (lab.wheels.sized_index), serves it and lab-stale on loopback, copies the lab profile with
# this machine's Python version, runs the role once to plan and fill the wheelhouses, then REPEATS times: the role
# given the planned lock (role-lock) and the same lock through ansible.builtin.pip, each into a fresh venv after a
# sync. Prints each run's wall seconds and the medians' ratio.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
WORK=${WORK:-/tmp/gpufleet-vr-local}
SCALE=${SCALE:-1}
REPEATS=${REPEATS:-2}
WHEELS=${WHEELS:-$REPO/.devwheels}
PY=$(command -v python3)
PYV=$($PY -c 'import sys; print("%d.%d" % sys.version_info[:2])')
rm -rf "$WORK" && mkdir -p "$WORK/col/ansible_collections/gpufleet"
ln -s "$REPO" "$WORK/col/ansible_collections/gpufleet/upgrade"
# ansible.utils (fact_diff): from COLLECTIONS, a folder holding ansible/utils (the controller's ansible package has it)
mkdir -p "$WORK/col/ansible_collections/ansible"
ln -s "${COLLECTIONS:-$REPO/.venv/lib/python3.11/site-packages/ansible_collections}/ansible/utils" \
  "$WORK/col/ansible_collections/ansible/utils"
# Into a folder on PYTHONPATH, not a venv: the machine's python3 may itself be a venv's, whose packages a
# --system-site-packages venv would not see.
$PY -m pip install -q --no-deps --no-index --target "$WORK/site" --find-links "$WHEELS" \
  --find-links "$REPO/.lab/mirrors/lab-main" ansible-core resolvelib pypiserver defusedxml importlib-resources uv \
  jsonschema jsonschema-specifications referencing rpds-py attrs typing-extensions \
  $($PY -c 'import cryptography' 2>/dev/null || echo cryptography cffi pycparser)
export PYTHONPATH="$WORK/site" PATH="$WORK/site/bin:$PATH"
CTL="$WORK/site/bin"
printf '#!/bin/sh\nexec %s "$@"\n' "$PY" >"$CTL/python" && chmod +x "$CTL/python"
cd "$REPO"
ROOT=$("$CTL/python" -c "from lab.wheels import sized_index; print(sized_index($SCALE)['root'])")
"$CTL/python" -m lab.serve --kind pypi --root "$ROOT" --pep691 --port 38190 --access-log "$WORK/main.log" &
MAIN=$!
"$CTL/python" -m lab.serve --kind pypi --root .lab/mirrors/lab-stale --pep691 --port 38191 \
  --access-log "$WORK/stale.log" &
STALE=$!
trap 'kill $MAIN $STALE 2>/dev/null || true' EXIT
sed "s/^  version: \"3.11\"/  version: \"$PYV\"/" stacks/lab.yml >"$WORK/lab-local.yml"
printf '[defaults]\ncollections_path = %s\nstdout_callback = default\n' "$WORK/col" >"$WORK/ansible.cfg"
cat >"$WORK/vars.json" <<EOF
{"gpufleet_stack_profile": "$WORK/lab-local.yml", "gpufleet_controller_dir": "$WORK/controller",
 "gpufleet_index_urls": {"lab-main": "http://127.0.0.1:38190/simple", "lab-stale": "http://127.0.0.1:38191/simple"},
 "gpufleet_fleet_cache_bind": "127.0.0.1", "gpufleet_fleet_cache_host": "127.0.0.1", "gpufleet_gpu_required": false,
 "venv_rebuild_switch": false, "venv_rebuild_keep": 5, "ansible_python_interpreter": "$PY"}
EOF
export ANSIBLE_CONFIG="$WORK/ansible.cfg"
sleep 2
play() { "$CTL/ansible-playbook" -i localhost, -c local -e "@$WORK/vars.json" "$@" >"$WORK/last.log" 2>&1 || {
  tail -40 "$WORK/last.log"
  exit 1
}; }
# The tools venv with the lab's uv, made by uv: a Python without ensurepip (python3-venv missing) cannot make the
# role's `python -m venv` of it. The role finds the lock's uv there and leaves it.
if ! /opt/gpufleet/tools/bin/uv --version >/dev/null 2>&1; then
  rm -rf /opt/gpufleet/tools
  "$CTL/uv" venv -q --python "/usr/bin/python$PYV" /opt/gpufleet/tools
  "$CTL/uv" pip install -q --python /opt/gpufleet/tools/bin/python --no-index --find-links .lab/mirrors/lab-main uv
fi
play tests/integration/playbooks/venv_rebuild.yml
LOCK=$(ls "$WORK"/controller/locks/lab-*.json)
"$CTL/python" -c "import json,sys; print(json.dumps({'gpufleet_wheel_lock': json.load(open(sys.argv[1]))}))" "$LOCK" \
  >"$WORK/lock-vars.json"
NAME=$("$CTL/python" -c "import json,sys; print(json.load(open(sys.argv[1]))['venv_name'])" "$LOCK")
timed() {
  rm -rf "/opt/gpufleet/serving/venvs/$NAME" /opt/gpufleet/serving/bench-pip /root/.cache/pip && sync
  local s e
  s=$(date +%s.%N)
  play "$@"
  e=$(date +%s.%N)
  $PY -c "print(round($e - $s, 2))"
}
for _ in $(seq "$REPEATS"); do
  echo "role-lock $(timed tests/integration/playbooks/venv_rebuild.yml -e "@$WORK/lock-vars.json")"
  echo "pip $(timed tests/integration/playbooks/venv_bench_pip.yml -e bench_lock_file="/opt/gpufleet/serving/locks/$NAME.txt" \
    -e bench_venv=/opt/gpufleet/serving/bench-pip -e bench_python="/usr/bin/python$PYV")"
done | tee "$WORK/times.txt"
$PY - "$WORK/times.txt" "$SCALE" <<'EOF'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    method, secs = line.split()
    rows.setdefault(method, []).append(float(secs))
med = {k: statistics.median(v) for k, v in rows.items()}
print(f"scale 1/{sys.argv[2]}: medians {med}; pip/role-lock {med['pip'] / med['role-lock']:.2f}x")
EOF
