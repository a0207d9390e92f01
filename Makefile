# stowplan — one entry point for set-up, demo and every gate.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv demo test check fmt lint types docs bench bench-runtime fuzz e2e-llamacpp clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check "uv==0.13.9"
	# torch first, by pip: it takes the CPU build from the local wheel cache, which uv does
	# not see; uv then finds torch==2.13.0 installed and keeps it.
	$(BIN)/python -m pip install -q --disable-pip-version-check "torch==2.13.0"
	$(BIN)/uv pip install --python $(BIN)/python -q --compile-bytecode -c constraints.txt -e ".[dev]"
	touch $(STAMP)

venv: $(STAMP)

## Plan a real model on a shipped heterogeneous fleet and print the plan.
demo: $(STAMP)
	$(BIN)/stowplan plan llama3.1:70b --nodes examples/fleets/mixed-consumer.yaml

## The whole test suite (Ray tests included).
test: $(STAMP)
	$(BIN)/python -m pytest -q

## The fuzz suite at length: FUZZ_EXAMPLES examples per target (the normal run uses 25).
FUZZ_EXAMPLES ?= 2000
fuzz: $(STAMP)
	STOWPLAN_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(BIN)/python -m pytest tests/fuzz -q \
		-p no:cacheprovider --timeout 3600 --hypothesis-show-statistics

fmt: $(STAMP)
	$(BIN)/ruff format src tests benchmarks
	$(BIN)/ruff check --fix src tests benchmarks

lint: $(STAMP)
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/ruff check src tests benchmarks

types: $(STAMP)
	$(BIN)/mypy

## The documentation site (MkDocs, API reference from the docstrings) into site/; warnings fail.
docs: $(STAMP)
	$(BIN)/mkdocs build --strict -d site

## Every gate: format, lint, types, the docs build, tests.
check: lint types docs test

bench: $(STAMP)
	$(BIN)/python benchmarks/plan_speed.py

## The stage worker on this host: measured vs predicted TTFT and tokens/s, 1-4 stages, U = 1, 4, 16.
bench-runtime: $(STAMP)
	$(BIN)/python benchmarks/runtime.py --params 10M --new-tokens 16 --rounds 3

## Opt-in, not in CI: build llama.cpp with RPC from the pinned llama-cpp-python sdist
## (needs cmake and a C++ compiler; cached in ~/.cache/stowplan, the first build takes
## ~40 minutes on 2 cores), then run a 3-stage llama.cpp export on 127.0.0.1 and check
## its layer assignment and greedy tokens against one process.
e2e-llamacpp: $(STAMP)
	$(BIN)/python benchmarks/e2e_llamacpp.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache site
