# `make demo` and `make test` work on a fresh clone: each creates .venv when missing.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The CPU build of torch 2.13.0 is what this project is tested with; ROCm/CUDA users
# install their own torch into the venv first (see README) and set TORCH_SPEC= to keep it.
TORCH_SPEC ?= torch==2.13.0

.PHONY: install demo test test-fast test-unit test-loop coverage lint docs reference clean-venv

$(BIN)/scaletrain: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip >/dev/null
	if [ -n "$(TORCH_SPEC)" ]; then $(BIN)/pip install -q "$(TORCH_SPEC)"; fi
	$(BIN)/pip install -q -e ".[test]"
	touch $(BIN)/scaletrain

install: $(BIN)/scaletrain

demo: install
	$(BIN)/python -m scaletrain.data.demo examples/data
	$(BIN)/scaletrain train examples/classify.yaml scaling.num_workers=2

# -rs: every skipped test says why at the end of the run; --durations=10: the slowest ten; the time at the end.
# Each tier's measured time, its tests and the date are in docs/development.md (the timing diary lives there).
# Bytecode caches are written even where the environment says not to (PYTHONDONTWRITEBYTECODE, set on this
# machine): without them every test process recompiles the package and re-rewrites every test module's asserts
# (pytest's cache: ~5 s of collection a process); they live in the ignored __pycache__ folders.
unexport PYTHONDONTWRITEBYTECODE
PYTEST = $(BIN)/python -m pytest -q -rs --durations=10
# make test: two pytest workers (-n 2 --dist loadgroup). Three kept the 2 cores 99% busy (85% with two) and ran ~5%
# faster, but twice in two runs Ray Train's placement-group cleaner, asking after a live controller on the loaded
# machine, removed a running job's placement group (docs/development.md): two it is. The tests on the suite's shared
# Ray keep to one worker, a module's tests that share a module-scoped fixture to one (tests/conftest.py); the rest,
# heads of their own (ray_head) included, run beside them. The suite is CPU-bound: commands run in the test's
# process (tests/cli.py), and the processes a test does start (the shared Ray's workers, torchrun's agents and
# workers) are forked pre-imported from a fork server (tests/conftest.py).
PARALLEL = -n 2 --dist loadgroup
timed = start=$$(date +%s); $(1); rc=$$?; echo "$(2): $$(( $$(date +%s) - start )) s"; exit $$rc

test: install
	@$(call timed,$(PYTEST) $(PARALLEL) tests,make test)

# Line coverage of src/scaletrain over the whole suite, as make test runs it (the test processes' own lines: a
# subprocess's are not counted). The figure and its date are in docs/development.md.
coverage: install
	@$(call timed,$(PYTEST) $(PARALLEL) --cov=scaletrain --cov-report=term:skip-covered tests,make coverage)

# The tiers (tests/README.md): pure functions (seconds); + the in-process loop without the tests marked slow (whole
# runs, several processes; its budget: 90 s, on two pytest workers); the whole loop tier; all.
test-unit: install
	@$(call timed,$(PYTEST) tests/unit -m "not loop",make test-unit)

test-fast: install
	@$(call timed,$(PYTEST) -n 2 tests/unit tests/loop -m "not slow",make test-fast)

test-loop: install
	@$(call timed,$(PYTEST) tests/loop,make test-loop)

lint: install
	$(BIN)/ruff check .

# The documentation site: the reference pages checked against the schema and the CLI (stale: `make reference`
# writes them), then MkDocs in strict mode (a broken link, a missing picture or a page left out of the navigation
# fails it). Output: site/.
docs: install
	$(BIN)/python docs/gen_reference.py --check
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict  # not --quiet: it hides the warnings strict counts

reference: install
	$(BIN)/python docs/gen_reference.py

clean-venv:
	rm -rf $(VENV)
