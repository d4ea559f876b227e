# `make demo` and `make test` work on a fresh clone: each creates .venv when missing.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The CPU build of torch 2.13.0 is what this project is tested with; ROCm/CUDA users
# install their own torch into the venv first (see README) and set TORCH_SPEC= to keep it.
TORCH_SPEC ?= torch==2.13.0

.PHONY: install demo test test-fast test-unit lint clean-venv

$(BIN)/scaletrain: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip >/dev/null
	if [ -n "$(TORCH_SPEC)" ]; then $(BIN)/pip install -q "$(TORCH_SPEC)"; fi
	$(BIN)/pip install -q -e ".[test]"
	touch $(BIN)/scaletrain

install: $(BIN)/scaletrain

demo: install
	$(BIN)/python -m scaletrain.demo_data examples/data
	$(BIN)/scaletrain train examples/classify.yaml scaling.num_workers=2

# -rs: every skipped test says why at the end of the run.
test: install
	$(BIN)/python -m pytest -q -rs tests

# The tiers (tests/README.md): pure functions (seconds); + the in-process loop, no Ray (a few minutes); all.
test-unit: install
	$(BIN)/python -m pytest -q -rs tests/unit -m "not loop"

test-fast: install
	$(BIN)/python -m pytest -q -rs tests/unit tests/loop

lint: install
	$(BIN)/ruff check .

clean-venv:
	rm -rf $(VENV)
