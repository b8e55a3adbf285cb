# Mallard: `make run` to try it, `make test` to check it. `make help` lists every target.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
# uv from PATH, else bootstrapped with pip into .uv/ (nothing else is installed by hand)
UV := $(shell command -v uv 2>/dev/null || echo $(CURDIR)/.uv/bin/uv)
VENV := $(CURDIR)/.venv
export UV_PYTHON_DOWNLOADS := never
export DO_NOT_TRACK := 1
export DAGSTER_DISABLE_TELEMETRY := 1
export MALLARD_DATA_DIR ?= $(CURDIR)/data

.PHONY: help install run test test-fast lint format bench bench-full clean-data

help: ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

$(CURDIR)/.uv/bin/uv:
	$(PYTHON) -m venv $(CURDIR)/.uv
	$(CURDIR)/.uv/bin/pip install --quiet uv

$(VENV)/.synced: uv.lock pyproject.toml | $(UV)
	$(UV) sync --frozen --all-groups --quiet
	@touch $@

install: $(VENV)/.synced ## install everything from uv.lock into .venv

run: install ## init ./data, start the server and the Dagster UI with demo data
	$(VENV)/bin/mallard up

test: install ## run the whole test suite
	$(VENV)/bin/python -m pytest

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
	$(VENV)/bin/python -m bench --quick

bench-full: install ## full benchmarks (10M events)
	$(VENV)/bin/python -m bench --full

clean-data: ## delete ./data (asks first)
	@read -p "Delete $(MALLARD_DATA_DIR)? [y/N] " a && [ "$$a" = y ] && rm -rf $(MALLARD_DATA_DIR)/* || true
