# The two commands of the README: `make demo` and `make test`. Each creates .venv and
# installs tightrope with its pinned dependencies when needed.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.tightrope-installed
# One thread per rank: two ranks share this machine's cores.
export OMP_NUM_THREADS ?= 1
# Python's default: each module compiled once, its bytecode kept beside it (and pytest's
# assertion-rewritten copies of this project's modules, which its plugin entry point marks
# for rewriting). Where the environment turns that off, every test process compiled and
# rewrote the project anew: make check took 135 s from a clean clone with it off, 130 s on.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: demo test check lint browser bench fuzz clean install

$(STAMP): pyproject.toml constraints.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check \
		-c constraints.txt -e '.[dev,docker,semantic,chaos,frameworks,ray]'
	@touch $(STAMP)

## install: only the install that the other targets start with (the CI templates' set-up)
install: $(STAMP)

## demo: the smoke suite against the reference trainer, then against the fragile preset;
## both scorecards written, the scores printed side by side. Succeeds when the reference
## trainer passes every scenario and the fragile one fails (tightrope exits 1 for it).
demo: $(STAMP)
	rm -rf runs/demo
	$(BIN)/tightrope run scenarios/smoke.yaml --scorecard runs/demo/reference
	$(BIN)/tightrope run scenarios/smoke.yaml --preset fragile --scorecard runs/demo/fragile \
		|| test $$? -eq 1
	$(BIN)/tightrope compare runs/demo/reference runs/demo/fragile || test $$? -eq 1
	@echo "scorecards: runs/demo/reference/scorecard.html runs/demo/fragile/scorecard.html"

## lint: ruff and mypy (strict on harness/ and faults/)
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

## browser: headless Chromium for the HTML scorecard test (Debian's package, when missing)
browser:
	@command -v chromium >/dev/null 2>&1 || apt-get install -y -q chromium >/dev/null \
		|| (apt-get update -q && apt-get install -y -q chromium >/dev/null) \
		|| echo "tightrope: could not install chromium; the browser test will be skipped"

## test: lint, then every test tier that can run on this machine, in two pytest-xdist
## workers: the distributed, docker and timed tests one at a time, first, in one of them
## (tests/lanes.py); the 25 slowest are listed at the end, to show where the time goes. A
## worker that crashes ends the run at once, naming its test: xdist replacing it under
## loadgroup left the controller waiting forever once every test had run
test: lint browser
	$(BIN)/python -m pytest -n 2 --dist loadgroup --no-loadscope-reorder --max-worker-restart=0 \
		--durations=25

## check: the edit loop: lint, then the tests outside the slow, distributed and docker
## tiers (the few timed ones among them take seconds), in the two workers of make test
check: lint
	$(BIN)/python -m pytest -n 2 --dist loadgroup --no-loadscope-reorder --max-worker-restart=0 \
		-m "not slow and not distributed and not docker"

## bench: trainer throughput, checkpoint cost, suite wall time, recovery time, agent and
## mechanism overhead, loss-spike detector precision, duplicate filter speed and F1,
## toxicity filter, optimizer memory and step/all-reduce time (benchmarks/results/*.json)
bench: $(STAMP)
	$(BIN)/python benchmarks/trainer_throughput.py
	$(BIN)/python benchmarks/checkpoint.py
	$(BIN)/python benchmarks/suite_time.py
	$(BIN)/python benchmarks/recovery.py
	$(BIN)/python benchmarks/agent_overhead.py
	$(BIN)/python benchmarks/agent_hook_time.py
	$(BIN)/python benchmarks/metrics_overhead.py
	$(BIN)/python benchmarks/mechanisms.py
	$(BIN)/python benchmarks/diagnosis.py
	$(BIN)/python benchmarks/spike_detectors.py
	$(BIN)/python benchmarks/semantic_dedup.py
	$(BIN)/python benchmarks/dedup.py
	$(BIN)/python benchmarks/toxicity.py
	$(BIN)/python benchmarks/optimizer_memory.py
	$(BIN)/python benchmarks/optimizers.py

## fuzz: 1,000 damaged copies of a real run's checkpoints, each resumed (docs/checkpoint-fuzzer.md)
fuzz: $(STAMP)
	$(BIN)/python -m tests.checkpoint_fuzzer --cases 1000 --seed 0 --cli-every 20

clean:
	rm -rf runs .tightrope-cache .mypy_cache .ruff_cache .pytest_cache
