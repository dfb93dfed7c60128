"""Run a command several times while busy loops load every CPU (``make test-stress``).

``python -m tests.stress [--cpu N] [--runs R] -- COMMAND...`` starts ``N``
busy-loop processes (the load of ``stress --cpu N``, without root or a package),
runs ``COMMAND`` ``R`` times in a row under that load, then stops the busy
loops. It prints the exit status of every run and exits 1 unless all passed:
a test that only passes on an idle machine is found here, not in CI.
"""

from __future__ import annotations

import argparse
import multiprocessing
import subprocess
import sys
import time


def _spin() -> None:  # pragma: no cover - runs in the load processes
    while True:
        pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.stress", description=__doc__)
    parser.add_argument("--cpu", type=int, default=4, help="busy-loop processes (default 4)")
    parser.add_argument("--runs", type=int, default=5, help="runs of the command (default 5)")
    parser.add_argument("command", nargs="+", help="the command to run, after --")
    args = parser.parse_args(argv)
    if args.cpu < 0 or args.runs < 1:
        parser.error("--cpu must be >= 0 and --runs >= 1")

    context = multiprocessing.get_context("spawn")
    load = [context.Process(target=_spin, daemon=True) for _ in range(args.cpu)]
    for process in load:
        process.start()
    results: list[tuple[int, float]] = []
    try:
        for run in range(1, args.runs + 1):
            print(f"== stress run {run}/{args.runs} under {args.cpu} busy loops", flush=True)
            started = time.monotonic()
            code = subprocess.call(args.command)
            results.append((code, time.monotonic() - started))
    finally:
        for process in load:
            process.terminate()
        for process in load:
            process.join(timeout=10)
    for run, (code, seconds) in enumerate(results, 1):
        print(f"run {run}: {'passed' if code == 0 else f'FAILED (exit {code})'} in {seconds:.0f}s")
    return 0 if all(code == 0 for code, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
