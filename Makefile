# The two commands of the README: `make demo` and `make test`. Each creates .venv and
# installs tightrope with its pinned dependencies when needed.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.tightrope-installed
# One thread per rank: two ranks share this machine's cores.
export OMP_NUM_THREADS ?= 1

.PHONY: demo test lint bench clean

$(STAMP): pyproject.toml constraints.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check \
		-c constraints.txt -e '.[dev]'
	@touch $(STAMP)

## demo: train the tiny preset on 2 ranks under torchrun, then summarize its journal
demo: $(STAMP)
	rm -rf runs/demo
	$(BIN)/torchrun --nproc-per-node 2 -m reference_trainer \
		--preset tiny --steps 60 --run-dir runs/demo
	$(BIN)/tightrope summary runs/demo

## lint: ruff and mypy (strict on harness/ and faults/)
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

## test: lint, then every test tier that can run on this machine
test: lint
	$(BIN)/python -m pytest

## bench: trainer throughput and checkpoint cost (benchmarks/results/*.json)
bench: $(STAMP)
	$(BIN)/python benchmarks/trainer_throughput.py
	$(BIN)/python benchmarks/checkpoint.py

clean:
	rm -rf runs .mypy_cache .ruff_cache .pytest_cache
