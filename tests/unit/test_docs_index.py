"""docs/index.md runs: each example of the tutorial as a script of its own."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "index.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)


def test_the_tutorial_has_its_examples() -> None:
    assert len(BLOCKS) >= 2


@pytest.mark.parametrize("n", range(len(BLOCKS)))
def test_each_example_of_the_tutorial_runs(n: int) -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(BLOCKS[n], f"{DOC}:block{n}", "exec"), {"__name__": f"docs_index_{n}"})
    if n == 0:
        assert out.getvalue().strip() == "cancelled"  # what the comment says it prints
