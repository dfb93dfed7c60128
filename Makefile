# The two commands a newcomer needs; each sets itself up on a fresh machine.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
BENCH_VENV := .venv-bench
BENCH_STAMP := $(BENCH_VENV)/.installed

.PHONY: demo test bench lint

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

# The benchmark's own environment: delayq plus the peers it is compared with
# (never delayq dependencies).
$(BENCH_STAMP): pyproject.toml bench/requirements-peers.txt
	$(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/python -m pip install -q --upgrade pip
	$(BENCH_VENV)/bin/python -m pip install -q -e '.[redis,rabbitmq]' -r bench/requirements-peers.txt
	touch $(BENCH_STAMP)

demo: $(STAMP)
	$(VENV)/bin/delayq demo

test: $(STAMP)
	$(VENV)/bin/ruff check src tests bench
	$(VENV)/bin/mypy
	$(PY) -m pytest -n 2 --dist loadgroup

bench: $(BENCH_STAMP)
	$(BENCH_VENV)/bin/python -m bench

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests bench
	$(VENV)/bin/ruff format --check src tests bench
	$(VENV)/bin/mypy
