# The two commands a newcomer needs; each sets itself up on a fresh machine.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
BENCH_VENV := .venv-bench
BENCH_STAMP := $(BENCH_VENV)/.installed

.PHONY: demo test test-stress bench lint mutation

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
# pyproject.toml [tool.mutmut], runs the tests that cover each mutant, prints the
# survivors and the score.
mutation: $(STAMP)
	$(PY) -m pip install -q -e '.[mutation]'
	rm -rf mutants
	$(VENV)/bin/mutmut run --max-children 2 > mutants.log 2>&1 || (tail -20 mutants.log; exit 1)
	$(VENV)/bin/mutmut results
	$(VENV)/bin/mutmut export-cicd-stats
	$(PY) -c "import json; s = json.load(open('mutants/mutmut-cicd-stats.json')); \
	  k, n = s['killed'], s['killed'] + s['survived']; \
	  print(f'mutation score: {k}/{n} killed ({100 * k / max(n, 1):.1f}%), ' \
	        f'{s[\"no_tests\"]} without covering tests, {s[\"timeout\"]} timed out')"
