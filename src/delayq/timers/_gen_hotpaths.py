"""Write the hot paths' twins: each ``*_after`` body is generated from its ``*_at``.

    python -m delayq.timers._gen_hotpaths           # rewrite the generated regions
    python -m delayq.timers._gen_hotpaths --test    # exit 1 if one is out of date

``schedule_after`` costs one Python frame only because its body is written
out again instead of calling ``schedule_at``. The ``*_at`` method is the one
source: its first statement (after the docstring) checks ``deadline``, and
everything after that statement is copied into the ``*_after`` twin between
``# BEGIN GENERATED`` and ``# END GENERATED``, below the twin's own check of
``delay`` (which sets ``deadline``). Edit the ``*_at`` method, then run this.
``tests/unit/test_timers.py`` runs ``--test``.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Sequence
from pathlib import Path

_HERE = Path(__file__).resolve().parent

# (module, class, source method, generated method)
TWINS: tuple[tuple[str, str, str, str], ...] = (
    ("hashed_wheel.py", "HashedWheel", "schedule_at", "_schedule_after"),
    ("timing_wheel.py", "HierarchicalWheel", "schedule_at", "_schedule_after"),
    ("delay_queue.py", "DelayQueue", "put_at", "put_after"),
)

BEGIN = "# BEGIN GENERATED from {source} (python -m delayq.timers._gen_hotpaths)"
END = "# END GENERATED"


def _method(tree: ast.Module, cls: str, name: str) -> ast.FunctionDef:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == name:
                    return item
    raise LookupError(f"{cls}.{name} not found")


def _shared_body(lines: list[str], source: ast.FunctionDef) -> list[str]:
    """The source's lines after its docstring and its first (checking) statement."""
    body = source.body
    check = body[1] if isinstance(body[0], ast.Expr) else body[0]  # body[0]: the docstring
    assert check.end_lineno is not None and source.end_lineno is not None
    return lines[check.end_lineno : source.end_lineno]


def generate(text: str, cls: str, source_name: str, target_name: str) -> str:
    """``text`` with ``cls.target_name``'s generated region rewritten from ``source_name``."""
    tree = ast.parse(text)
    lines = text.splitlines(keepends=True)
    shared = _shared_body(lines, _method(tree, cls, source_name))
    target = _method(tree, cls, target_name)
    assert target.end_lineno is not None
    begin = BEGIN.format(source=source_name)
    region = range(target.lineno - 1, target.end_lineno + 1)  # END follows the last line
    starts = [i for i in region if lines[i].strip() == begin]
    ends = [i for i in region if i < len(lines) and lines[i].strip() == END]
    if len(starts) != 1 or len(ends) != 1 or ends[0] < starts[0]:
        raise ValueError(f"{cls}.{target_name} needs one '{begin}' ... '{END}' region")
    return "".join(lines[: starts[0] + 1] + shared + lines[ends[0] :])


def _outdated(write: bool) -> list[str]:
    outdated = []
    for module, cls, source, target in TWINS:
        path = _HERE / module
        text = path.read_text(encoding="utf-8")
        new = generate(text, cls, source, target)
        if new != text:
            outdated.append(f"{module}: {cls}.{target}")
            if write:
                path.write_text(new, encoding="utf-8")
    return outdated


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m delayq.timers._gen_hotpaths")
    parser.add_argument("--test", action="store_true", help="check only; exit 1 if outdated")
    args = parser.parse_args(argv)
    outdated = _outdated(write=not args.test)
    for name in outdated:
        print(f"{'outdated' if args.test else 'rewrote'}: {name}")
    if args.test and outdated:
        print("Generated sources are outdated: run python -m delayq.timers._gen_hotpaths")
        return 1
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
