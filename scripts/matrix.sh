#!/usr/bin/env bash
# The collection on every ansible-core it supports: per version a venv from pyenv's Python with the matching ansible
# bundle (ansible-core comes with it), requirements.txt and the test tools, then ansible-test sanity, the unit tests
# and the lab end to end (upgrade, audit, rollback, audit) on one fresh lab host. Each step is timed.
#
#   bash scripts/matrix.sh                              every version, every step
#   MATRIX_VERSIONS="2.21" bash scripts/matrix.sh       one version
#   MATRIX_STEPS="sanity unit" bash scripts/matrix.sh   some steps
#   MATRIX_INJECT_FACTS_AS_VARS=False ...               the end to end with ansible-core's coming default
#   MATRIX_LAB=name ...                                 the lab's name prefix (runs side by side need their own)
#
# Venvs live in .venv/matrix/<version> (rebuilt when their pins change); logs and times in build/matrix/.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
tooling_py=$repo/.venv/bin/python
uv=$repo/.venv/bin/uv

# ansible-core minor : Python (pyenv) : ansible bundle of that ansible-core. 2.20 and later need Python >= 3.12.
# A version no bundle carries yet (CORE) gets its ansible-core beside the newest bundle's collections (--no-deps).
declare -A PYTHON=([2.19]=3.12 [2.20]=3.12 [2.21]=3.13 [2.22]=3.13)
declare -A BUNDLE=([2.19]=12.3.0 [2.20]=13.8.0 [2.21]=14.5.0 [2.22]=14.5.0)
declare -A CORE=([2.22]=2.22.0)
versions=${MATRIX_VERSIONS:-2.19 2.20 2.21 2.22}
steps=${MATRIX_STEPS-sanity unit e2e}
out=$repo/build/matrix
mkdir -p "$out"
export ANSIBLE_CONFIG=$repo/ansible.cfg CONTAINERS_CONF=$repo/lab/containers.conf PYTHONUNBUFFERED=1
export ANSIBLE_NOCOLOR=1
# This checkout is the collection for every step, whatever .venv/collections points at.
mkdir -p "$out/collections/ansible_collections/gpufleet"
ln -sfn "$repo" "$out/collections/ansible_collections/gpufleet/upgrade"
export ANSIBLE_COLLECTIONS_PATH=$out/collections

# The test tools of requirements/tooling.txt that do not carry their own ansible-core (the bundle brings it).
test_pins() {
  grep -vE '^\s*(#|$)|^(ansible|ansible-core|ansible-lint|molecule|molecule-plugins\[podman\]|pytest-testinfra)==' \
    requirements/tooling.txt
}

python_for() {
  local want=$1 root
  root=$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")
  # The newest patch release pyenv has of that minor version.
  find "$root/versions" -maxdepth 1 -name "$want.*" -printf '%f\n' | sort -V | tail -1 |
    sed "s|^|$root/versions/|; s|$|/bin/python$want|"
}

venv_for() {
  local v=$1 py venv stamp
  py=$(python_for "${PYTHON[$v]}")
  [[ -x $py ]] || { echo "matrix: no Python ${PYTHON[$v]} under pyenv for ansible-core $v (pyenv install ${PYTHON[$v]})" >&2; exit 1; }
  venv=$repo/.venv/matrix/$v
  stamp=$venv/.pins-$( (echo "$py ${BUNDLE[$v]} ${CORE[$v]:-}"; cat requirements.txt; test_pins) | sha256sum | cut -c1-12)
  if [[ ! -e $stamp ]]; then
    rm -rf "$venv"
    "$uv" venv -q --seed --python "$py" "$venv"
    if [[ -n ${CORE[$v]:-} ]]; then
      "$uv" pip install -q --python "$venv/bin/python" "ansible-core==${CORE[$v]}" -r requirements.txt $(test_pins)
      "$uv" pip install -q --python "$venv/bin/python" --no-deps "ansible==${BUNDLE[$v]}"
    else
      "$uv" pip install -q --python "$venv/bin/python" "ansible==${BUNDLE[$v]}" -r requirements.txt $(test_pins)
    fi
    touch "$stamp"
  fi
  echo "$venv"
}

declare -A TIMES
timed() {  # timed <label> <command...>: runs it, logs to build/matrix/<label>.log, keeps its seconds
  local label=$1 t rc=0
  shift
  t=$(date +%s)
  "$@" >"$out/$label.log" 2>&1 || rc=$?
  TIMES[$label]="$(($(date +%s) - t)) s $([[ $rc == 0 ]] && echo passed || echo "FAILED rc=$rc")"
  echo "matrix: $label: ${TIMES[$label]} (log build/matrix/$label.log)"
  return $rc
}

sanity() {
  local venv=$1
  "$venv/bin/python" scripts/ansible_test_bootstrap.py --any-ansible-core >/dev/null || return 1
  ANSIBLE_TEST=$venv/bin/ansible-test SANITY_PYTHON=$("$venv/bin/python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")') \
    bash tests/sanity/run.sh
}

unit() {
  local venv=$1
  # tests/unit/scripts test this checkout's set-up against the tooling venv's pins (make unit runs them).
  "$venv/bin/python" -m pytest tests/unit -q -p no:cacheprovider --ignore=tests/unit/scripts
}

# One host, fresh in the old state: upgrade, audit in sync, rollback, audit naming the drift. Each command is
# checked here: set -e does not hold inside a function called from `||`.
e2e() {
  local venv=$1 v=$2 lab=${MATRIX_LAB:-matrix}-${2//./-} inv summary rc=0
  "$tooling_py" -m lab mirrors build >/dev/null && "$tooling_py" -m lab mirrors start >/dev/null || return 1
  "$tooling_py" -m lab down --name "$lab" >/dev/null || return 1
  "$tooling_py" -m lab up 1 --name "$lab" || return 1
  inv=$repo/.lab/$lab/inventory.yml
  summary=$out/$v-summary.json
  play() {
    # INJECT_FACTS_AS_VARS is set by ANSIBLE_INJECT_FACT_VARS (the setting's environment variable).
    ANSIBLE_INJECT_FACT_VARS=${MATRIX_INJECT_FACTS_AS_VARS:-True} GPUFLEET_SUMMARY_FILE=$summary \
      "$venv/bin/ansible-playbook" -i "$inv" "$@"
  }
  outcome() {
    "$venv/bin/python" -c '
import json, sys
hosts = json.load(open(sys.argv[1]))["hosts"]
kinds = {h: r.get("outcome_kind") for h, r in hosts.items()}
assert kinds and set(kinds.values()) == {sys.argv[2]}, f"expected {sys.argv[2]}: {kinds}"
print(f"matrix: {kinds}")' "$summary" "$1"
  }
  play playbooks/upgrade.yml && outcome upgraded || return 1
  play playbooks/audit.yml --check --diff || return 1
  play playbooks/rollback.yml && outcome restored || return 1
  # The rollback keeps the new toolkit beside the old one; the venv link is back on the old stack's venv.
  play playbooks/audit.yml --check --diff -e gpufleet_audit_fail_on_drift=true >"$out/$v-audit-after-rollback.log" 2>&1 ||
    rc=$?
  if [[ $rc == 0 ]] || ! grep -q "drift: serving venv link: current is" "$out/$v-audit-after-rollback.log"; then
    echo "matrix: the audit after the rollback did not name the drift (rc $rc): build/matrix/$v-audit-after-rollback.log"
    return 1
  fi
  echo "matrix: the audit after the rollback names the drift (rc $rc)"
  "$tooling_py" -m lab down --name "$lab" >/dev/null
}

failed=0
for v in $versions; do
  [[ -n ${BUNDLE[$v]:-} ]] || { echo "matrix: unknown ansible-core $v (known: ${!BUNDLE[*]})" >&2; exit 2; }
  t=$(date +%s)
  venv=$(venv_for "$v")
  TIMES[$v-venv]="$(($(date +%s) - t)) s"
  echo "matrix: ansible-core $("$venv/bin/python" -c 'import ansible; print(ansible.__version__)') on $("$venv/bin/python" -V) (venv ${TIMES[$v-venv]})"
  for step in $steps; do
    timed "$v-$step" "$step" "$venv" "$v" || failed=1
  done
  deprecations=$(cat "$out/$v"-*.log 2>/dev/null | grep -c "DEPRECATION WARNING" || true)
  echo "matrix: ansible-core $v: $deprecations deprecation warnings in the logs"
done

echo "matrix: times"
for key in $(printf '%s\n' "${!TIMES[@]}" | sort); do echo "  $key: ${TIMES[$key]}"; done | tee "$out/times.txt"
exit $failed
