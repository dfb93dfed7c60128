"""Shared test configuration.

Service-backed tests skip with a clear reason when their server is absent, but
fail when ``DELAYQ_REQUIRE_SERVICES=1`` (CI sets it).
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, Phase, settings

# Property tests judge behaviour, not speed: on a loaded 2-core CI machine a slow
# example must not fail a run (speed targets live in bench/).
settings.register_profile(
    "delayq", deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True
)
# Mutation runs only need to know that a test fails, not the smallest failing example.
settings.register_profile(
    "mutation",
    parent=settings.get_profile("delayq"),
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    database=None,
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "delayq"))

REQUIRE_SERVICES = os.environ.get("DELAYQ_REQUIRE_SERVICES") == "1"


def service_missing(name: str, reason: str) -> None:
    """Skip (or fail, under DELAYQ_REQUIRE_SERVICES=1) because ``name`` is unreachable."""
    message = f"{name} is not reachable: {reason}"
    if REQUIRE_SERVICES:
        pytest.fail(f"{message} (DELAYQ_REQUIRE_SERVICES=1 requires it)", pytrace=False)
    pytest.skip(message)
