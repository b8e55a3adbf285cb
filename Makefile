# Mallard: `make run` to try it, `make test` to check it. `make help` lists every target.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
# uv from PATH, else bootstrapped with pip into .uv/ (nothing else is installed by hand)
UV := $(shell command -v uv 2>/dev/null || echo $(CURDIR)/.uv/bin/uv)
VENV := $(CURDIR)/.venv
# uv installs from uv.lock and the package index only, never a Python of its own; it runs in
# `make install` only. Telemetry switches: mallard/offline.py, forced by every mallard command.
export UV_PYTHON_DOWNLOADS := never
export MALLARD_DATA_DIR ?= $(CURDIR)/data

.PHONY: help install test-deps run test test-promises test-faults test-airgap test-reliability test-distributed soak test-fast lint format bench bench-full clean-data

help: ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

$(CURDIR)/.uv/bin/uv:
	@echo "installing uv into .uv/ (pip, once)"
	@$(PYTHON) -m venv $(CURDIR)/.uv
	@$(CURDIR)/.uv/bin/pip install --quiet uv

# Bytecode is compiled once here: with PYTHONDONTWRITEBYTECODE set (as on CI) every process
# otherwise compiles ~2,800 modules at import (5 s per `mallard pipeline run`, measured).
$(VENV)/.synced: uv.lock pyproject.toml | $(UV)
	@echo "installing Python packages from uv.lock into .venv (the first time takes a few minutes)"
	@$(UV) sync --frozen --all-groups --quiet --compile-bytecode
	@touch $@

install: $(VENV)/.synced ## install everything from uv.lock into .venv

run: install ## init ./data, start the server and the Dagster UI with demo data
	@echo "starting Mallard (mallard up): init, server, demo data, first pipeline pass, Dagster"
	@$(VENV)/bin/mallard up

# Browser tests drive Debian's chromium (Playwright's own browser download is unreachable here).
CHROMIUM := /usr/bin/chromium
$(CHROMIUM):
	@echo "installing Debian chromium for the browser tests"
	@if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium >/dev/null

# Node SDK tests (e.g. @segment/analytics-node) install from their package-lock.json.
NODE_DIR := tests/node
NODE_DEPS := $(if $(wildcard $(NODE_DIR)/package-lock.json),$(NODE_DIR)/node_modules/.installed)
$(NODE_DIR)/node_modules/.installed: $(NODE_DIR)/package-lock.json
	cd $(NODE_DIR) && npm ci --no-audit --no-fund --loglevel=error
	@touch $@

test-deps: install $(CHROMIUM) $(NODE_DEPS) ## install what the tests need beyond .venv (chromium, node SDKs)

# Two workers, each taking whole files (a file's module-scoped server and pass stay shared): the
# integration tests wait on subprocesses much of the time, so two share the 2 cores well. Files
# go to the workers in collection order (--no-loadscope-reorder; xdist's default puts files with
# the most tests first, leaving long files of one test to the end, where one worker runs them
# while the other idles): the longest files first (the whole-system test, 3 minutes of every role
# at once with kills, then its invariants; test_up: `mallard up` starting and stopping
# everything), then the unit tests, whose few long files build lakes (tests/conftest.py).
test: test-deps ## run the whole test suite; prints its 20 slowest tests
	$(VENV)/bin/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder -m 'not faults and not airgap and not reliability and not distributed' --durations=20
	@echo "NOTE: make test-promises runs the fault-injection and reliability suites' short variants (.ci/run runs it after make test)"
	@echo "NOTE: the air-gapped run (pytest -m airgap, root) is not part of make test: run make test-airgap"
	@echo "NOTE: the distributed topology (pytest -m distributed: PostgreSQL, S3, 2 collectors, 2 replicas) is not part of make test: run make test-distributed"

# The short variants of the promises make test leaves out: kills at each step of a regulation,
# of the dispatcher and of journeys (faults), and the reliability suite (isolation matrix,
# revocation, Retry-After, hostile bodies, XSS in Chromium, disk full, the burst). One worker:
# the reliability suite times other clients while it attacks the server.
test-promises: test-deps ## the short fault-injection and reliability variants (.ci/run runs them)
	$(VENV)/bin/python -m pytest -m 'faults or reliability' tests/integration tests/reliability -p no:cacheprovider -q --durations=10

test-faults: test-deps ## the fault-injection variants: runs SIGKILLed mid-step, then run again
	$(VENV)/bin/python -m pytest -m faults

# About a minute and a half: init, serve, ingestion, a pass, reads, dbt docs and every page in
# Chromium inside `unshare --net`; fails (never skips) without root and unshare.
test-airgap: test-deps ## the product with no network but loopback; fails if a packet leaves (root)
	scripts/airgap.sh --durations=5

test-fast: install ## unit tests only
	$(VENV)/bin/python -m pytest tests/unit

lint: install ## ruff, mypy, sqlfluff
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	cd dbt_project && $(VENV)/bin/sqlfluff lint models

format: install ## apply ruff formatting and fixes
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

bench: install ## quick benchmarks (minutes); report in bench/results/
	$(VENV)/bin/python -m bench --quick $(BENCH_ARGS)

bench-full: install ## full benchmarks (10M events)
	$(VENV)/bin/python -m bench --full $(BENCH_ARGS)

clean-data: ## delete ./data (asks first)
	@read -p "Delete $(MALLARD_DATA_DIR)? [y/N] " a && [ "$$a" = y ] && rm -rf $(MALLARD_DATA_DIR)/* || true

# A few minutes: a real PostgreSQL (initdb in a temp dir, loopback, as mallard-pg when root) and
# moto's S3 server, 2 collectors (one SIGKILLed mid-load), 2 API replicas, passes and a Delete,
# compared with the embedded default on the same messages (docs/deploy.md).
test-distributed: install ## the distributed topology against the embedded default (PostgreSQL)
	@ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || { echo "installing Debian postgresql"; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; $$SUDO apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq postgresql >/dev/null; }
	$(VENV)/bin/python -m pytest -m distributed tests/distributed -p no:cacheprovider --durations=5

# About 15 minutes: hostile input, crashes (5 kills each), resources, isolation, the page in
# Chromium; real servers on loopback ports, figures printed at the end (docs/reliability.md).
test-reliability: test-deps ## hostile input, crashes, resources, isolation (docs/reliability.md)
	$(VENV)/bin/python -m pytest -m reliability tests/reliability -p no:cacheprovider -s -q

# Longer (over an hour and a half): 100 schemathesis examples per operation (valid regulations
# filed too), 2,000 bodies, 20 kills of the collector and of the pipeline, an hour of load with no
# pipeline; then the whole-system test for 30 minutes (MALLARD_SYSTEM_SEED replays a schedule).
soak: test-deps ## the long variants of the reliability suite and of the whole-system test
	MALLARD_FUZZ_EXAMPLES=100 MALLARD_FUZZ_FILE_REGULATIONS=1 MALLARD_RELIABILITY_EXAMPLES=2000 \
	  MALLARD_CRASH_KILLS=20 MALLARD_LOAD_DOWN_S=3600 \
	  $(VENV)/bin/python -m pytest -m reliability tests/reliability -p no:cacheprovider -s -q
	MALLARD_SYSTEM_S=1800 $(VENV)/bin/python -m pytest -m system tests/system -p no:cacheprovider -s -q
