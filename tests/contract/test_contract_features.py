"""Every store declares its promises, and the suite skips exactly what the table says.

See ``_declared_gaps.py``. The check reads the ``backend_features`` marks of every
contract test module, so a new test that needs a feature is counted too.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest

from delayq.backends.base import FEATURES, Backend
from tests.contract._declared_gaps import SKIPPED, SKIPPED_AT_RUN_TIME, run_time_gap_error
from tests.contract._registry import BACKEND_FACTORIES, BackendFactory


def _needed_features() -> dict[str, frozenset[str]]:
    """contract test name -> the features its ``backend_features`` marks ask for."""
    needs: dict[str, frozenset[str]] = {}
    here = Path(__file__).parent
    for info in pkgutil.iter_modules([str(here)]):
        if not info.name.startswith("test_"):
            continue
        module = importlib.import_module(f"tests.contract.{info.name}")
        module_marks = getattr(module, "pytestmark", [])
        if not isinstance(module_marks, list):
            module_marks = [module_marks]
        for name, fn in inspect.getmembers(module, inspect.isfunction):
            if not name.startswith("test_"):
                continue
            marks = [
                m
                for m in [*module_marks, *getattr(fn, "pytestmark", [])]
                if m.name == "backend_features"
            ]
            needs[name] = frozenset(f for m in marks for f in m.args)
    return needs


def test_every_registered_store_has_a_row_in_the_table() -> None:
    assert set(SKIPPED) == set(BACKEND_FACTORIES)


def test_the_contract_tests_ask_only_for_known_features() -> None:
    asked = {f for needed in _needed_features().values() for f in needed}
    assert asked <= set(FEATURES), sorted(asked - set(FEATURES))
    assert len(_needed_features()) > 50  # the collection really read the suite


@pytest.mark.parametrize("name", sorted(BACKEND_FACTORIES))
def test_a_store_skips_exactly_the_tests_its_declared_gaps_explain(name: str) -> None:
    factory = BACKEND_FACTORIES[name]
    skipped = {
        test for test, needed in _needed_features().items() if not needed <= factory.features
    }
    assert skipped == SKIPPED[name], (
        f"{name} now skips {sorted(skipped - SKIPPED[name])} and runs "
        f"{sorted(SKIPPED[name] - skipped)}: update tests/contract/_declared_gaps.py"
    )


def test_the_suite_declares_what_the_store_class_declares(
    backend: Backend, factory: BackendFactory
) -> None:
    declared = backend.features
    assert declared <= set(FEATURES), sorted(declared - set(FEATURES))
    assert factory.features == declared


def test_a_run_time_skip_must_be_declared_and_a_declared_one_must_still_skip() -> None:
    declared = sorted(SKIPPED_AT_RUN_TIME["rabbitmq"])[0]
    assert run_time_gap_error("rabbitmq", declared, skipped_at_run_time=True, ran=False) is None
    assert run_time_gap_error("redis", declared, skipped_at_run_time=False, ran=True) is None
    undeclared = run_time_gap_error("redis", declared, skipped_at_run_time=True, ran=False)
    assert undeclared is not None and "does not say so" in undeclared
    now_runs = run_time_gap_error("rabbitmq", declared, skipped_at_run_time=False, ran=True)
    assert now_runs is not None and "now runs on rabbitmq" in now_runs
    names = set(_needed_features())
    assert SKIPPED_AT_RUN_TIME["rabbitmq"] <= names  # every entry names a contract test
