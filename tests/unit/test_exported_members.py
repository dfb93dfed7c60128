"""The public API is chosen on purpose: everything in ``__all__`` exists, is sorted, is public."""

from __future__ import annotations

import delayq
import delayq.testing


def test_all_is_sorted_and_unique() -> None:
    assert list(delayq.__all__) == sorted(set(delayq.__all__))


def test_every_exported_name_exists_and_is_public() -> None:
    for name in delayq.__all__:
        assert not name.startswith("_"), name
        assert hasattr(delayq, name), f"delayq.{name} is in __all__ but missing"


def test_public_members_are_all_exported() -> None:
    public = {
        name
        for name, value in vars(delayq).items()
        if not name.startswith("_")
        and getattr(value, "__module__", "").startswith("delayq")
        and not isinstance(value, type(delayq))
    }
    assert public <= set(delayq.__all__), public - set(delayq.__all__)


def test_testing_module_exports_fake_clock() -> None:
    assert "FakeClock" in delayq.testing.__all__
    for name in delayq.testing.__all__:
        assert hasattr(delayq.testing, name)
