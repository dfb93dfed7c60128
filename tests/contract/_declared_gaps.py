"""What each store does not promise, and the contract tests it therefore skips.

A store declares its promises in its class attribute ``features`` (names from
``delayq.backends.base.FEATURES``); every contract test that needs a feature a
store lacks is skipped for it. This table writes those skips down, and
``test_contract_features.py`` checks it against what the suite would skip: a
store that stops declaring a feature (or a test that starts needing one) fails
that check until the table says so, so no store drops tests silently.
"""

from __future__ import annotations

SKIPPED: dict[str, frozenset[str]] = {
    "memory": frozenset(
        {
            # one process's memory: no second handle, nothing survives close()
            "test_two_handles_never_hold_one_job_under_two_live_leases",
            "test_a_reopened_store_keeps_its_jobs",
        }
    ),
    "sqlite": frozenset(),
    "redis": frozenset(),
}
"""store name -> names of the contract tests skipped for it (missing features)."""
