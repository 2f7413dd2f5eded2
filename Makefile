# gpufleet.upgrade — the README's two commands (`make demo`, `make test`) and their parts.
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
VENV := .venv
PY := $(VENV)/bin/python
LAB_NODES ?= 2
PYTEST_ARGS ?=

export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
export CONTAINERS_CONF := $(CURDIR)/lab/containers.conf
export PYTHONUNBUFFERED := 1

.PHONY: help setup demo lab-up lab-down mirrors test lint sanity unit molecule integration integration-long matrix matrix-ci fault-injection-doc bench-real-stack build clean

help:
	@echo "make demo   - bring up a lab fleet ($(LAB_NODES) hosts) and upgrade it end to end with playbooks/upgrade.yml"
	@echo "make test   - lint + sanity + unit + molecule + integration"
	@echo "make setup  - system packages, .venv with pinned tooling, collection link (both targets run it)"

setup:
	@bash scripts/setup.sh

## The main job: a lab fleet in the old state, upgraded to the lab stack.
demo: setup mirrors
	$(PY) -m lab down --name lab
	$(PY) -m lab up $(LAB_NODES) --name lab
	ansible-playbook -i inventories/lab/hosts.yml playbooks/upgrade.yml -e gpufleet_bench_enabled=true
	@echo ""
	@echo "What next (in a new shell, from this folder, first: . .venv/bin/activate):"
	@echo "  ansible-playbook -i inventories/lab/hosts.yml playbooks/audit.yml --check --diff   # both hosts in sync"
	@echo "  ansible-playbook -i inventories/lab/hosts.yml playbooks/rollback.yml -e gpufleet_rollback_all=true"
	@echo "  the fleet report: the path the line 'gpufleet report:' above gives (report.html, .md, .json, junit.xml)"
	@echo "  docs/operator-guide.md: the same on your own fleet, from the installed collection (make build)"
	@echo "  make lab-down   # remove the lab hosts and stop the mirrors"

mirrors: setup
	$(PY) -m lab image
	$(PY) -m lab mirrors build
	$(PY) -m lab mirrors start

lab-up: mirrors
	$(PY) -m lab up $(LAB_NODES) --name lab

lab-down:
	$(PY) -m lab down --name lab
	$(PY) -m lab mirrors stop

## The tests.
test: setup lint sanity unit molecule integration

lint: setup
	ruff check .
	ruff format --check .
	yamllint .
	antsibull-changelog lint
	ansible-lint
	$(PY) scripts/role_docs.py --check

sanity: setup
	bash tests/sanity/run.sh

unit: setup
	GPUFLEET_TORCH_PYTHON=$(if $(wildcard $(VENV)/torch/bin/python),$(CURDIR)/$(VENV)/torch/bin/python,) \
	  $(PY) -m pytest tests/unit lab/tests -q $(PYTEST_ARGS)
	if [ -x $(VENV)/torch/bin/python ]; then \
	  $(VENV)/torch/bin/python -m pytest -q -p no:cacheprovider tests/unit/plugins/module_utils/test_smoke_worker_torch.py; fi
	$(VENV)/sglang/bin/python -m pytest -q -p no:cacheprovider tests/unit/plugins/module_utils/test_sglang_protocol.py

## Every scenario (as molecule test --all), MOLECULE_JOBS at a time (each scenario has its own node, serving port
## and ephemeral folder; they wait on systemd and SSH more than they compute), longest first; each one's time and,
## for a failed one, the end of its log (build/molecule/<scenario>.log) are printed. MOLECULE_JOBS=1: one at a time.
MOLECULE_JOBS ?= 2
MOLECULE_LONGEST_FIRST := rollback upgrade preflight postcheck cuda_toolkit venv_rebuild serving backup
MOLECULE_SCENARIOS := $(patsubst molecule/%/molecule.yml,%,$(wildcard molecule/*/molecule.yml))
MOLECULE_ORDER := $(filter $(MOLECULE_SCENARIOS),$(MOLECULE_LONGEST_FIRST)) \
  $(filter-out $(MOLECULE_LONGEST_FIRST),$(MOLECULE_SCENARIOS))
molecule: mirrors
	@mkdir -p build/molecule; t0=$$(date +%s); \
	printf '%s\n' $(MOLECULE_ORDER) | xargs -P $(MOLECULE_JOBS) -I{} sh -c \
	  't=$$(date +%s); if molecule test -s {} >build/molecule/{}.log 2>&1; then \
	     echo "molecule: scenario {} took $$(( $$(date +%s) - t )) s"; else \
	     echo "molecule: scenario {} FAILED after $$(( $$(date +%s) - t )) s; the end of build/molecule/{}.log:"; \
	     tail -n 150 build/molecule/{}.log; exit 255; fi' \
	  && echo "molecule: every scenario passed in $$(( $$(date +%s) - t0 )) s ($(MOLECULE_JOBS) at a time)"

## A lab that breaks (a full disk, a stopped mirror) fails every test after it slowly: stop after a few failures so
## their tracebacks print within CI's time limit (INTEGRATION_MAXFAIL=0 runs everything).
INTEGRATION_MAXFAIL ?= 3
## Lab tests wait on SSH round trips, unit restarts and health polls more than they compute (load about 1.5 on two
## cores with one module at a time): modules run side by side, each whole on one xdist worker (--dist loadfile keeps
## a module's fleet and its tests' order together; every module's fleet has its own name; the mirrors are shared).
## INTEGRATION_WORKERS=0 runs them one after another.
INTEGRATION_WORKERS ?= 3
integration: mirrors
	$(PY) -m pytest tests/integration -q -rfE --durations=25 --maxfail=$(INTEGRATION_MAXFAIL) -m "not long" \
	  $(if $(filter-out 0,$(INTEGRATION_WORKERS)),-n $(INTEGRATION_WORKERS) --dist loadfile,) $(PYTEST_ARGS)

## Lab runs too long for every CI run (the HAProxy drain under load across a rolling upgrade of 4 hosts).
integration-long: mirrors
	$(PY) -m pytest tests/integration -q --durations=25 -m long $(PYTEST_ARGS)

## Every ansible-core the collection supports (2.19, 2.20, 2.21), each in its own venv from pyenv's Pythons with the
## matching ansible bundle: sanity, unit, and upgrade + audit + rollback + audit on one lab host, each timed
## (scripts/matrix.sh; MATRIX_VERSIONS, MATRIX_STEPS and MATRIX_INJECT_FACTS_AS_VARS pick a part).
matrix: mirrors
	bash scripts/matrix.sh

## Sanity and unit on the other supported ansible-cores, run by hand before a release (make test's released-artifact
## test runs the newest ansible-core end to end; its sanity and unit run 2.19).
matrix-ci: setup
	MATRIX_VERSIONS="2.20 2.21" MATRIX_STEPS="sanity unit" bash scripts/matrix.sh

## Refresh the committed fault-injection tables (make test writes them to reports/, leaving the clone clean): the
## fault table, then the recovery matrix as its second table, every case (PYTEST_ARGS='-m "not long"': the slice).
fault-injection-doc: mirrors
	GPUFLEET_UPDATE_DOCS=1 $(PY) -m pytest tests/integration/test_fault_injection.py \
	  tests/integration/test_recovery_matrix.py -q $(PYTEST_ARGS)

## Not in CI: the real cu130-sglang0523 stack planned on the default index (plan.yml, a lock file) and upgraded on
## REAL_STACK_HOSTS lab hosts through an nginx site cache, audited, one rolled back (bench/real_stack.py --hosts; about
## 70 GB of disk for 4 hosts, fewer hosts when less is free; an hour or more on a 2-core machine). docs/profiles.md.
REAL_STACK_HOSTS ?= 4
bench-real-stack: mirrors
	nice -n 10 $(PY) bench/real_stack.py --hosts $(REAL_STACK_HOSTS)

build: setup
	ansible-galaxy collection build --force --output-path build/

clean: lab-down
	$(PY) -m lab mirrors stop || true
	rm -rf build tests/output
