"""Mutation testing, resumable and per module (``make mutation [MODULE=worker/_decide.py]``).

``python -m tests.mutation [MODULE]`` runs mutmut (configured in pyproject.toml
``[tool.mutmut]``) on ``MODULE`` (a file or folder under ``src/delayq/``, e.g.
``worker/_decide.py``, ``worker/``; all configured modules when omitted), then
prints a score per module. Results stay in ``mutants/``: a run that stops goes on
where it stopped, and only the mutants without a result run again (delete
``mutants/`` after changing the tests, so that their coverage is read again).

``python -m tests.mutation --report [MODULE]`` prints the scores and survivors
without running anything.

The score of a module is ``killed / (killed + survived + timeouts)`` over its
mutants that are not listed as equivalent in ``tests/mutation_equivalent.txt``
(one line per mutant: ``<mutant name>  <why it behaves as the original>``);
mutants no test covers count as survived.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MUTANTS = ROOT / "mutants"
EQUIVALENT = Path(__file__).with_name("mutation_equivalent.txt")
PACKAGE = "delayq"

KILLED = {1, 3, 36, -24, 24, 152, 255}  # a failing test, or a timeout (an endless loop)
SURVIVED = {0, 5, 33}  # no test failed, or no test covers the mutant


def module_prefix(module: str) -> str:
    """``worker/_decide.py`` -> ``delayq.worker._decide.``; ``worker/`` -> ``delayq.worker.``."""
    path = module.strip().removeprefix("src/").removeprefix(f"{PACKAGE}/").strip("/")
    dotted = path.removesuffix(".py").replace("/", ".")
    return f"{PACKAGE}.{dotted}." if dotted else f"{PACKAGE}."


def results() -> dict[str, int | None]:
    """Every generated mutant's name and mutmut's exit code for it (None: not run yet)."""
    found: dict[str, int | None] = {}
    for meta in sorted(MUTANTS.glob("src/**/*.py.meta")):
        data = json.loads(meta.read_text(encoding="utf-8"))
        found.update(data.get("exit_code_by_key", {}))
    return found


def equivalent() -> dict[str, str]:
    """The mutants checked to behave as the original: name -> why."""
    listed: dict[str, str] = {}
    for line in EQUIVALENT.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, why = line.partition(" ")
            listed[name] = why.strip()
    return listed


def module_of(mutant: str) -> str:
    """``delayq.worker._decide.x_decide__mutmut_3`` -> ``delayq.worker._decide``."""
    return mutant.rsplit(".", 1)[0]


def report(prefix: str) -> int:
    """Print each module's score and survivors; 1 if a module is below 95%."""
    codes = {k: v for k, v in results().items() if k.startswith(prefix)}
    if not codes:
        print(f"no mutants of {prefix}* yet")
        return 1
    same = equivalent()
    stale = sorted(name for name in same if name.startswith(prefix) and name not in codes)
    low = False
    for module in sorted({module_of(k) for k in codes}):
        mine = {k: v for k, v in codes.items() if module_of(k) == module}
        counts = Counter(
            "equivalent"
            if k in same
            else "killed"
            if v in KILLED
            else "survived"
            if v in SURVIVED
            else "not run"
            if v is None
            else f"exit {v}"
            for k, v in mine.items()
        )
        judged = counts["killed"] + counts["survived"]
        score = 100 * counts["killed"] / judged if judged else 0.0
        low = low or score < 95
        rest = ", ".join(f"{n} {what}" for what, n in sorted(counts.items()) if what != "killed")
        shown = f"{score:.1f}%" if judged else "not scored yet"
        print(f"{module}: {counts['killed']}/{judged} killed ({shown}); {rest or 'no others'}")
        for name in sorted(k for k, v in mine.items() if k not in same and v in SURVIVED):
            print(f"    survived: {name}")
    for name in stale:
        print(f"    listed as equivalent but not generated (stale line?): {name}")
    return 1 if low else 0


def run(prefix: str, max_children: int) -> int:
    """Run the mutants of ``prefix`` that have no result yet (all of them on a first run)."""
    mutmut = [sys.executable, "-m", "mutmut", "run", "--max-children", str(max_children)]
    pending = sorted(k for k, v in results().items() if k.startswith(prefix) and v is None)
    if prefix == f"{PACKAGE}.":
        names = []  # mutmut itself goes on with the mutants that have no result
    elif not MUTANTS.exists() or not results():
        names = [f"{prefix}*"]
    elif pending:
        names = pending
    else:
        print(f"every mutant of {prefix}* has a result")
        return 0
    return subprocess.call([*mutmut, *names], cwd=ROOT)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.mutation", description=__doc__)
    parser.add_argument("module", nargs="?", default="", help="e.g. worker/_decide.py, worker/")
    parser.add_argument("--report", action="store_true", help="only print the scores")
    parser.add_argument("--max-children", type=int, default=2)
    args = parser.parse_args(argv)
    prefix = module_prefix(args.module)
    if not args.report:
        code = run(prefix, args.max_children)
        if code != 0:
            print(f"mutmut exited {code}", file=sys.stderr)
    return report(prefix)


if __name__ == "__main__":
    sys.exit(main())
