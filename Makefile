# fedjax-semi: `make run` sets everything up and runs the default experiment; `make test` runs the tests.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# Every install comes from the lock (exact versions of everything, the extras dev, tfds and sweeps
# included); pyproject.toml keeps only floors, for those who install the package as a library.
LOCK   := requirements.lock

.PHONY: run test test-slow bench bench-revisions bench-sweeps bench-throughput bench-peers lint lock data setup clean

# uv installs the lock in about a quarter of pip's time; pip installs it where uv cannot (no
# uv wheel for the platform, an index uv cannot reach). Both install exactly the lock. Bytecode
# is compiled at install, as pip does: with PYTHONDONTWRITEBYTECODE set (as on CI) every process,
# the CLI subprocesses of the tests included, would otherwise compile jax, flax and tfds again.
UV_VERSION := $(shell sed -n 's/^uv==\([^ ;]*\).*/\1/p' $(LOCK))

$(STAMP): pyproject.toml $(LOCK)
	$(PYTHON) -m venv $(VENV)
	( $(PY) -m pip install -q uv==$(UV_VERSION) && \
	  $(VENV)/bin/uv pip install -q --compile-bytecode --python $(PY) -r $(LOCK) ) || \
	  $(PY) -m pip install -q -r $(LOCK)
	$(PY) -m pip install -q --no-deps -e .
	touch $(STAMP)

# Re-resolve the lock from pyproject.toml's floors (newest versions that satisfy them); to move
# one package only: make lock LOCK_ARGS="--upgrade-package jax".
lock: $(STAMP)
	$(VENV)/bin/uv pip compile pyproject.toml --extra dev --extra tfds --extra sweeps \
		--universal --python-version 3.11 $(LOCK_ARGS) -o $(LOCK)

setup: $(STAMP)

# Fashion-MNIST: found in $$FEDJAX_SEMI_DATA, the user cache or Debian's dataset-fashion-mnist;
# otherwise installed with apt where possible, else downloaded where the network allows.
data: $(STAMP)
	$(PY) -m fedjax_semi.data.fetch ensure fashion_mnist

run: data
	$(VENV)/bin/fedjax-semi $(ARGS)

test: $(STAMP)
	$(PY) -m pytest -q -m "not slow" -n 2 --dist worksteal $(PYTEST_ARGS)

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow $(PYTEST_ARGS)

bench: data
	$(PY) benchmarks/engine.py

# make bench of a base revision and the working tree side by side (alternating runs):
#   make bench-revisions BASE=ede4f6d
BASE ?= HEAD~1
bench-revisions: data
	$(PY) benchmarks/revisions.py --base $(BASE) $(BENCH_ARGS)

# A 4 lr x 3 seed sweep through hydra/launcher=vectorized, basic and joblib side by side, and the
# compilation cache off / cold / warm (docs/sweeps.md).
bench-sweeps: data
	$(PY) benchmarks/sweeps.py --cache $(BENCH_ARGS)

# torch comes from the default package registry; a CPU-only wheel index is an option:
#   make bench-throughput TORCH_INDEX=https://download.pytorch.org/whl/cpu
TORCH_SPEC ?= torch
TORCH_INDEX ?=
TORCH_PIP_ARGS = $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))

# The standard workloads W1-W4, every mapping side by side, plus the PyTorch per-client loop.
bench-throughput: data
	$(PY) -m pip install -q $(TORCH_SPEC) $(TORCH_PIP_ARGS)
	$(PY) benchmarks/throughput.py --torch $(BENCH_ARGS)

# The engine's FedAvg against an independent PyTorch FedAvg, 4 settings x 5 seeds x 100 rounds
# (77 min on 2 shared cores; docs/results/agreement.md); torch installed as for bench-throughput.
#   make agreement AGREEMENT_ARGS="--report --run 2026-11-27T09:27:43"   (a stored run's tables)
AGREEMENT_ARGS ?=
.PHONY: agreement
agreement: data
	$(PY) -m pip install -q $(TORCH_SPEC) $(TORCH_PIP_ARGS)
	$(PY) benchmarks/agreement.py $(AGREEMENT_ARGS)

# Optional peers (no test needs them): pfl-research on W1, Flower's simulation engine on W3.
# pfl and flwr would downgrade absl-py/attrs/protobuf/rich in $(VENV), so they get their own venv
# with jax/flax/optax pinned to $(VENV)'s versions (benchmarks/common.py records them).
PEERS_VENV ?= .venv-peers
PEERS_ARGS ?= --rounds 20

$(PEERS_VENV)/.installed: $(STAMP)
	$(PYTHON) -m venv $(PEERS_VENV)
	$(PEERS_VENV)/bin/pip install -q $(TORCH_SPEC) $(TORCH_PIP_ARGS)
	$(PEERS_VENV)/bin/pip install -q pfl "flwr[simulation]" \
		$$($(VENV)/bin/pip freeze | grep -E '^(jax|jaxlib|flax|optax)==')
	$(PEERS_VENV)/bin/pip install -q --no-deps -e .
	touch $@

bench-peers: $(PEERS_VENV)/.installed
	$(PEERS_VENV)/bin/python benchmarks/peers/pfl_w1.py $(PEERS_ARGS)
	$(PEERS_VENV)/bin/python benchmarks/peers/flower_w3.py $(PEERS_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/ruff format --check src tests benchmarks

clean:
	rm -rf $(VENV) outputs multirun .pytest_cache
