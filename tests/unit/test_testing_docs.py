"""docs/testing.md runs: its examples in order as one script, its fixture example as a test."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "testing.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)


def test_the_examples_of_docs_testing_run_in_order() -> None:
    script = [b for b in BLOCKS if not b.startswith("def test_")]
    assert len(script) >= 4
    namespace: dict[str, object] = {"__name__": "docs_testing"}
    exec(compile("\n".join(script), str(DOC), "exec"), namespace)


def test_the_fixture_example_passes_under_pytest(tmp_path: Path) -> None:
    [example] = [b for b in BLOCKS if b.startswith("def test_")]
    (tmp_path / "test_example.py").write_text(example)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, textwrap.indent(run.stdout + run.stderr, "  ")
    assert "1 passed" in run.stdout
