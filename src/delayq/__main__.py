"""``python -m delayq``: the same as the ``delayq`` command."""

from delayq.cli import main

if __name__ == "__main__":
    main()
