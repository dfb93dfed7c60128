"""``python -m bench``: run every benchmark module present, one after the other.

::

    python -m bench            # full runs
    python -m bench --quick    # smoke runs

Each module in ``MODULES`` is imported if it exists and its ``main(argv)`` called
with the same arguments; a module that is missing is listed as such, one that
fails does not stop the others. The exit code is the first non-zero one.
"""

from __future__ import annotations

import importlib
import sys
import traceback
from collections.abc import Sequence

MODULES = (
    "inprocess",
    "timers",
    "durable",
    "drain",
    "pools",
    "redis_delayq",
    "redis_costs",
    "redis_scale",
    "redis_peers",
    "load",
    "operate",
    "recurring",
    "postgres",
    "rabbitmq",
    "rabbitmq_cancel",
)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help") for a in args):
        print(__doc__)
        return 0
    results: list[tuple[str, str]] = []
    exit_code = 0
    for name in MODULES:
        try:
            module = importlib.import_module(f"bench.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"bench.{name}":
                results.append((name, f"cannot import: {exc}"))
                exit_code = exit_code or 1
            else:
                results.append((name, "not present"))
            continue
        print(f"\n# bench.{name}\n", flush=True)
        try:
            code = module.main(args)
        except Exception:
            traceback.print_exc()
            code = 1
        code = int(code or 0)
        results.append((name, "ok" if code == 0 else f"exit code {code}"))
        exit_code = exit_code or code
    print("\n# summary\n")
    for name, status in results:
        print(f"- bench.{name}: {status}")
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
