# The two commands a newcomer needs: `make demo` and `make test`. Each creates .venv and
# installs on first use. `make check` = lint + types + import contracts + tests.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
PYTEST_ARGS ?=
# Two pytest-xdist workers: one runs every test that runs Spark (the Spark lane), the other the
# rest (tests/conftest.py). TEST_WORKERS=0: one process, about 35 minutes on two cores.
TEST_WORKERS ?= 2
FUZZ_SECONDS ?= 60

.PHONY: install services ready demo test check lint types imports unit bench fuzz clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q --no-compile -e '.[dev]'
	@touch $(STAMP)

install: $(STAMP)

services:
	@bash scripts/services.sh

demo: install
	$(BIN)/sluice demo

lint: install
	$(BIN)/ruff check src tests bench fuzz
	$(BIN)/ruff format --check src tests bench fuzz

types: install
	$(BIN)/mypy

imports: install
	$(BIN)/lint-imports

# What `make test` needs before the tests, two at a time: the install beside the services (pip
# is mostly unpacking, the services' set-up mostly apt), then the three checks.
ready:
	@$(MAKE) --no-print-directory -j2 install services
	@$(MAKE) --no-print-directory -j2 lint types imports

test: ready
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

check: test

unit: install
	$(BIN)/python -m pytest tests/unit $(PYTEST_ARGS)

bench: install services
	@for b in bench/*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

# Each fuzz target for FUZZ_SECONDS in turn (fuzz/run.py); findings land in fuzz/.work/<target>/.
fuzz: install
	$(BIN)/python -m fuzz.run --all --seconds $(FUZZ_SECONDS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build dist
