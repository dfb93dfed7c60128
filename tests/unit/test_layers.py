"""The layers of ARCHITECTURE.md, read from the folders: imports point down, no cycles.

Every import counts: module level, inside functions and under ``TYPE_CHECKING``
(a cycle that only the type checker sees is still a cycle for the reader). A
module may import its own layer or a lower one; nothing imports a front end
but the front ends; private modules and names (``_x``) stay inside the package
that owns them; ``importlib`` is used only where the module to load is named at
run time (a store's optional driver, the user's ``TARGET``).
"""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "delayq"

# Top to bottom; a module may import modules of its own layer or of any layer below.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("package facade", ("delayq", "delayq.__main__")),
    ("integrations front end", ("delayq.integrations",)),
    ("cli front end", ("delayq.cli",)),
    ("web front end", ("delayq.web",)),
    ("plug-ins", ("delayq.observe", "delayq.metrics", "delayq.otel")),
    ("testing", ("delayq.testing", "delayq.pytest_plugin")),
    ("worker", ("delayq.worker",)),
    (
        "app",
        (
            "delayq.app",
            "delayq.aio",
            "delayq._build",
            "delayq._limits",
            "delayq._recurring_app",
            "delayq._results_app",
            "delayq._commit_app",
            "delayq.results",
            "delayq._loader",
            "delayq.task",
            "delayq._present",
            "delayq._bulk",
        ),
    ),
    ("recurring", ("delayq.recurring",)),
    ("stores", ("delayq.backends",)),
    ("timers", ("delayq.timers",)),
    (
        "core",
        (
            "delayq.job",
            "delayq.flow",
            "delayq.keyed",
            "delayq.errors",
            "delayq.clock",
            "delayq.backoff",
            "delayq.codec",
            "delayq._validate",
        ),
    ),
]
CORE_LAYERS = {"timers", "core"}  # the standard library only
IMPORTLIB_ALLOWED = {
    "delayq.backends",  # a store's driver is optional: imported by URL scheme
    "delayq._loader",  # `delayq worker TARGET` (and a pool's child) import the user's module
}


@dataclass(frozen=True, slots=True)
class Edge:
    """One import: ``source`` imports ``target`` (``names`` from it) at ``line``."""

    source: str
    target: str
    names: tuple[str, ...]
    line: int


def _module_name(root: Path, package: str, path: Path) -> str:
    parts = [package, *path.relative_to(root).with_suffix("").parts]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules(root: Path = SRC, package: str = "delayq") -> dict[str, Path]:
    """Every module of the package under ``root``, by dotted name."""
    return {_module_name(root, package, p): p for p in sorted(root.rglob("*.py"))}


def _known(name: str, known: Mapping[str, Path]) -> str | None:
    """``name`` or its longest prefix that is a module of the package."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in known:
            return candidate
        parts.pop()
    return None


def imports(known: Mapping[str, Path]) -> list[Edge]:
    """Every import between the modules in ``known``, wherever it is written."""
    edges: list[Edge] = []
    for source, path in known.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    target = _known(alias.name, known)
                    if target is not None:
                        edges.append(Edge(source, target, (), node.lineno))
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = source.split(".")
                    drop = node.level - 1 if is_package else node.level
                    anchor = anchor[: len(anchor) - drop]
                    base = ".".join([*anchor, base] if base else anchor)
                for alias in node.names:
                    target = _known(f"{base}.{alias.name}", known)
                    if target == f"{base}.{alias.name}":  # a submodule
                        edges.append(Edge(source, target, (), node.lineno))
                        continue
                    target = _known(base, known)
                    if target is not None:
                        edges.append(Edge(source, target, (alias.name,), node.lineno))
    return edges


def cycles(edges: Iterable[Edge]) -> list[list[str]]:
    """The import cycles (strongly connected components of more than one module,
    or a module importing itself), each sorted, found by Tarjan's algorithm."""
    graph: dict[str, set[str]] = {}
    for e in edges:
        graph.setdefault(e.source, set()).add(e.target)
        graph.setdefault(e.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in graph[node]:
                found.append(sorted(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(graph) + 100))
    try:
        for node in sorted(graph):
            if node not in index:
                visit(node)
    finally:
        sys.setrecursionlimit(limit)
    return found


def _owner(name: str) -> str | None:
    """The package that owns the private module ``name`` (``delayq.backends`` for
    ``delayq.backends._common``), or None when no part of it is private."""
    parts = name.split(".")
    for i, part in enumerate(parts):
        if part.startswith("_") and not part.startswith("__"):
            return ".".join(parts[:i])
    return None


def _inside(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def private_reaches(edges: Iterable[Edge], known: Mapping[str, Path]) -> list[str]:
    """Imports of a private module, or of a private name, from outside its package."""
    bad = []
    for e in edges:
        owner = _owner(e.target)
        if owner is not None and not _inside(e.source, owner):
            bad.append(f"{e.source}:{e.line} imports the private module {e.target}")
        is_package = known[e.target].name == "__init__.py"
        home = e.target if is_package else e.target.rpartition(".")[0]
        for name in e.names:
            if name.startswith("_") and not name.startswith("__") and not _inside(e.source, home):
                bad.append(f"{e.source}:{e.line} imports the private name {e.target}.{name}")
    return bad


def layer_of(module: str) -> int:
    for rank, (_, prefixes) in enumerate(LAYERS):
        if any(module == p or (p != "delayq" and _inside(module, p)) for p in prefixes):
            return rank
    raise AssertionError(f"{module} is in no layer: add it to LAYERS")


# -- the package ---------------------------------------------------------------------
MODULES = modules()
EDGES = imports(MODULES)


def test_every_module_belongs_to_a_layer() -> None:
    for name in MODULES:
        layer_of(name)


def test_there_is_no_import_cycle_not_even_a_type_only_or_deferred_one() -> None:
    assert cycles(EDGES) == []


def test_imports_point_down_the_layers() -> None:
    upward = [
        f"{e.source} ({LAYERS[layer_of(e.source)][0]}) imports {e.target} "
        f"({LAYERS[layer_of(e.target)][0]}) at line {e.line}"
        for e in EDGES
        if layer_of(e.target) < layer_of(e.source)
    ]
    assert upward == []


def test_no_private_module_or_name_is_imported_from_outside_its_package() -> None:
    assert private_reaches(EDGES, MODULES) == []


def _loads_by_name(path: Path) -> bool:
    """True when the module calls ``import_module`` or ``__import__`` (an import the
    graph above cannot see)."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call):
            fn = node.func
            name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", None)
            if name in ("import_module", "__import__"):
                return True
    return False


def test_modules_are_loaded_by_name_only_where_the_name_comes_at_run_time() -> None:
    users = {name for name, path in MODULES.items() if _loads_by_name(path)}
    assert users <= IMPORTLIB_ALLOWED, users - IMPORTLIB_ALLOWED


def _third_party_and_stdlib(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


@pytest.mark.parametrize(
    "name",
    [n for n in MODULES if LAYERS[layer_of(n)][0] in CORE_LAYERS],
)
def test_core_uses_only_the_standard_library(name: str) -> None:
    third_party = {
        m
        for m in _third_party_and_stdlib(MODULES[name])
        if m.split(".")[0] not in sys.stdlib_module_names and m.split(".")[0] != "delayq"
    }
    assert not third_party, f"{name} imports {third_party}"


def test_no_pickle_anywhere_in_the_package() -> None:
    for path in MODULES.values():
        assert not {"pickle", "dill", "cloudpickle"} & _third_party_and_stdlib(path), path


# Each module in an interpreter of its own, as ``python -c "import delayq.X"``.
# ``import delayq.X`` always runs ``delayq/__init__`` first, so a fork of an
# interpreter that has imported exactly the package root (and the third-party
# packages) is in the very state a fresh one reaches before it imports X: the
# check stays exact and takes seconds. The root itself is imported in a fork
# taken before it.
_IMPORT_EACH = textwrap.dedent(
    """
    import importlib, os, sys, traceback

    def start(name):
        pid = os.fork()
        if pid == 0:
            try:
                importlib.import_module(name)
            except BaseException:
                traceback.print_exc()
                os._exit(1)
            os._exit(0)
        return pid

    def alone(names, at_once=os.cpu_count() or 2):
        running, failed = {}, []
        for name in [*names, None]:
            while running and (name is None or len(running) >= at_once):
                pid, status = os.wait()
                if status != 0:
                    failed.append(running[pid])
                del running[pid]
            if name is not None:
                running[start(name)] = name
        for name in failed:
            print(f"FAILED: import {name}", flush=True)
        return not failed

    for name in sys.argv[1].split(","):
        try:
            importlib.import_module(name)
        except ImportError:
            pass  # an optional extra: the module that needs it fails below
    assert not [m for m in sys.modules if m == "delayq" or m.startswith("delayq.")]
    ok = alone(["delayq"])
    import delayq
    ok = alone([name for name in sys.argv[2:] if name != "delayq"]) and ok
    sys.exit(0 if ok else 1)
    """
)


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs os.fork")
def test_every_module_imports_alone_in_a_fresh_interpreter() -> None:
    names = sorted(n for n in MODULES if not n.endswith("__main__"))
    third_party = sorted(
        {
            m
            for path in MODULES.values()
            for m in _third_party_and_stdlib(path)
            if m.split(".")[0] not in sys.stdlib_module_names and m.split(".")[0] != "delayq"
        }
    )
    result = subprocess.run(
        [sys.executable, "-c", _IMPORT_EACH, ",".join(third_party), *names],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


# -- the checker itself ------------------------------------------------------------------
def _tree(tmp_path: Path, files: Mapping[str, str]) -> dict[str, Path]:
    root = tmp_path / "pkg"
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return modules(root, "pkg")


def test_the_checker_finds_a_cycle_hidden_under_type_checking(tmp_path: Path) -> None:
    known = _tree(
        tmp_path,
        {
            "__init__.py": "",
            "a.py": "from pkg.b import B\n",
            "b.py": """
                from typing import TYPE_CHECKING
                if TYPE_CHECKING:
                    from pkg.a import A
            """,
            "c.py": "from pkg import a\n",
        },
    )
    assert cycles(imports(known)) == [["pkg.a", "pkg.b"]]


def test_the_checker_finds_a_cycle_through_a_function_level_and_relative_import(
    tmp_path: Path,
) -> None:
    known = _tree(
        tmp_path,
        {
            "__init__.py": "",
            "sub/__init__.py": "from .x import X\n",
            "sub/x.py": """
                def f():
                    from pkg.y import Y
            """,
            "y.py": "import pkg.sub\n",
        },
    )
    assert cycles(imports(known)) == [["pkg.sub", "pkg.sub.x", "pkg.y"]]


def test_the_checker_finds_private_reaches_across_packages(tmp_path: Path) -> None:
    known = _tree(
        tmp_path,
        {
            "__init__.py": "",
            "_core.py": "X = 1\n",
            "store/__init__.py": "",
            "store/_common.py": "_helper = 1\nPUBLIC = 2\n",
            "store/mem.py": "from pkg.store._common import _helper\n",
            "front/__init__.py": "",
            "front/cmd.py": "from pkg.store._common import PUBLIC\nfrom pkg._core import X\n",
            "front/other.py": "from pkg.store.mem import _private\n",
        },
    )
    assert private_reaches(imports(known), known) == [
        "pkg.front.cmd:1 imports the private module pkg.store._common",
        "pkg.front.other:1 imports the private name pkg.store.mem._private",
    ]
