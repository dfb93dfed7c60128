# The two commands a newcomer needs; each sets itself up on a fresh machine.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
BENCH_VENV := .venv-bench
BENCH_STAMP := $(BENCH_VENV)/.installed

.PHONY: demo test test-stress bench lint docs mutation mutation-clean

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
	$(BENCH_VENV)/bin/python -m pip install -q -e '.[redis,rabbitmq,postgres]' -r bench/requirements-peers.txt
	touch $(BENCH_STAMP)

demo: $(STAMP)
	$(VENV)/bin/delayq demo

test: $(STAMP)
	$(VENV)/bin/ruff check src tests bench
	$(VENV)/bin/mypy
	$(PY) -m pytest -n 2 --dist loadgroup

# The whole suite 5 times in a row while 4 busy loops load the CPUs (tests/stress.py,
# no root or package needed): every run must pass.
test-stress: $(STAMP)
	$(PY) -m tests.stress --cpu 4 --runs 5 -- $(PY) -m pytest -n 2 --dist loadgroup -q

bench: $(BENCH_STAMP)
	$(BENCH_VENV)/bin/python -m bench

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests bench
	$(VENV)/bin/ruff format --check src tests bench
	$(VENV)/bin/mypy

# Mutation testing (slow; not part of `make test`): mutates the modules listed in
# pyproject.toml [tool.mutmut] (or one: `make mutation MODULE=worker/_decide.py`,
# a folder: MODULE=worker/), runs the tests that cover each mutant at the lowest
# CPU priority, and prints each module's score and survivors (tests/mutation.py).
# Resumable: results stay in mutants/ and a new run goes on from them
# (`make mutation-clean` after changing tests).
MODULE ?=
mutation: $(STAMP)
	$(PY) -m pip install -q -e '.[mutation]'
	nice -n 19 $(PY) -m tests.mutation $(MODULE)

# The docs site (mkdocs-material, docs/ and mkdocs.yml) in site/; warnings fail it.
# Not part of `make test` (which runs the docs' examples: tests/unit/test_docs_*.py).
docs: $(STAMP)
	$(PY) -m pip install -q -e '.[docs]'
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict -q

mutation-clean:
	rm -rf mutants
