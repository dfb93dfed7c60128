"""The layers of ARCHITECTURE.md: imports point down, the core needs no third-party package."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "delayq"
FRONT_ENDS = {"delayq.worker", "delayq.app", "delayq.cli", "delayq.cli.demo", "delayq.web"}
CORE_MODULES = ["job.py", "backoff.py", "clock.py", "errors.py", "codec.py", "_validate.py"]


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _files(*parts: str) -> list[Path]:
    return sorted(SRC.joinpath(*parts).rglob("*.py"))


@pytest.mark.parametrize("path", _files("timers") + _files("backends"), ids=lambda p: p.name)
def test_timers_and_backends_do_not_import_front_ends(path: Path) -> None:
    bad = {m for m in _imports(path) if any(m == f or m.startswith(f + ".") for f in FRONT_ENDS)}
    assert not bad, f"{path.relative_to(SRC)} imports {bad}"


@pytest.mark.parametrize(
    "path", _files("timers") + [SRC / name for name in CORE_MODULES], ids=lambda p: p.name
)
def test_core_uses_only_the_standard_library(path: Path) -> None:
    third_party = {
        m
        for m in _imports(path)
        if m.split(".")[0] not in sys.stdlib_module_names and m.split(".")[0] != "delayq"
    }
    assert not third_party, f"{path.relative_to(SRC)} imports {third_party}"


def test_no_pickle_anywhere_in_the_package() -> None:
    for path in _files():
        assert not {"pickle", "dill", "cloudpickle"} & _imports(path), path
