# `make test` is the one command a new user (and CI) runs: it builds .venv,
# installs leaseq with its dev extra, then runs lint, types and the test suite.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint types pytest install clean

test: install lint types pytest

# The main job: the report service, its workers and a burst of requests.
demo: install
	$(BIN)/leaseq demo

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,demo]'
	touch $(STAMP)

install: $(STAMP)

lint: install
	$(BIN)/ruff check src tests bench examples tools
	$(BIN)/ruff format --check src tests bench examples tools
	$(BIN)/python tools/async_to_sync.py --check

types: install
	$(BIN)/mypy --strict src

pytest: install
	$(BIN)/pytest -n 2 --dist loadgroup $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
