# fedjax-semi: `make run` sets everything up and runs the default experiment; `make test` runs the tests.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: run test test-slow bench lint data setup clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[dev,tfds]"
	touch $(STAMP)

setup: $(STAMP)

# Fashion-MNIST: found in $$FEDJAX_SEMI_DATA, the user cache or Debian's dataset-fashion-mnist;
# otherwise installed with apt where possible, else downloaded where the network allows.
data: $(STAMP)
	$(PY) -m fedjax_semi.data.sources ensure fashion_mnist

run: data
	$(VENV)/bin/fedjax-semi $(ARGS)

test: $(STAMP)
	$(PY) -m pytest -q -m "not slow" -n 2 $(PYTEST_ARGS)

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow $(PYTEST_ARGS)

bench: data
	$(PY) benchmarks/engine.py

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/ruff format --check src tests benchmarks

clean:
	rm -rf $(VENV) outputs multirun .pytest_cache
