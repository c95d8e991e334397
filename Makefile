# `make test` is the one command a new user (and CI) runs: it builds .venv,
# installs leaseq with its dev extra, then runs lint, types and the test suite.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint types pytest install clean bench bench-quick bench-soak

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

# Four test processes on two cores: the suite mostly waits (for leases, workers,
# the server), and four took a pass from ~480 s to ~320 s on these VMs.
pytest: install
	$(BIN)/pytest -n 4 --dist loadgroup --durations=15 $(PYTEST_ARGS)

# The side-by-side bench (bench/README.md): leaseq, procrastinate and pgqueuer on
# the PostgreSQL of DATABASE_URL (leaseq's embedded server if unset), in a
# database of its own (leaseq_bench); the peers' venvs are built under bench/.venvs.
SOAK_SECONDS ?= 600

bench: install
	$(BIN)/python bench/run.py --mode full

bench-quick: install
	$(BIN)/python bench/run.py --mode quick

bench-soak: install
	$(BIN)/python bench/run.py --mode soak --soak-seconds $(SOAK_SECONDS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
