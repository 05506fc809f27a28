# tracr: `make run` sets up .venv and runs the default experiment; `make test` runs the test suite.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.tracr-installed

.PHONY: run test lint bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade --quiet pip
	$(PY) -m pip install --quiet -e '.[dev,yolo]'
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/tracr experiment run alexnet-sweep

test: $(STAMP)
	$(PY) -m pytest tests

lint: $(STAMP)
	$(VENV)/bin/ruff check .

bench: $(STAMP)
	$(VENV)/bin/tracr bench overhead
	$(VENV)/bin/tracr bench transport

clean:
	rm -rf $(VENV) build *.egg-info
