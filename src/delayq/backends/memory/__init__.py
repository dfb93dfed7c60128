"""The in-memory reference store (``memory://``): the contract, held in a dict and three heaps.

Layout: ``_store`` (the contract methods), ``_schedules`` (recurring schedule records).
"""

from delayq.backends.memory._store import MemoryBackend

__all__ = ["MemoryBackend"]
