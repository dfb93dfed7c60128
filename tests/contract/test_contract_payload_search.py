"""Contract: ``list_jobs`` lists big payloads as previews, and searches payloads
(substring, JSON path) on the stores that can do it where they read."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from delayq.backends.base import Backend
from delayq.errors import InvalidOption
from delayq.job import JobSpec, PayloadPreview
from delayq.testing import FakeClock
from tests.contract._support import spec as loose_spec


def spec(job_id: str, run_at: float, *, payload: Any, name: str = "test.job") -> JobSpec:
    """A job whose payload is stored as the codec writes it (compact JSON)."""
    text = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    return replace(loose_spec(job_id, run_at, name=name), payload=text)


pytestmark = pytest.mark.backend_features("inspect")


def test_a_payload_longer_than_the_preview_is_listed_cut_and_get_has_it_whole(
    backend: Backend, clock: FakeClock
) -> None:
    t0 = clock.time()
    big = {"blob": "x" * 5000, "n": 1}
    backend.enqueue([spec("big", t0 + 1, payload=big), spec("small", t0 + 2, payload={"n": 2})])
    listed = {j.id: j for j in backend.list_jobs(preview=100)}  # type: ignore[call-arg]
    cut = listed["big"].payload
    assert isinstance(cut, PayloadPreview)
    text = json.dumps(big, separators=(",", ":"))
    assert cut.text == text[:100] and cut.chars == len(text)
    assert listed["small"].payload == {"n": 2}  # short enough: decoded as usual
    whole = backend.get("big")
    assert whole is not None and whole.payload == big


def test_a_preview_applies_to_a_named_and_paged_listing_too(
    backend: Backend, clock: FakeClock
) -> None:
    t0 = clock.time()
    backend.enqueue([spec(f"j{i}", t0 + i, payload={"blob": "y" * 500}) for i in range(3)])
    first = backend.list_jobs(name="test.job", limit=1)
    rest = backend.list_jobs(  # type: ignore[call-arg]
        name="test.job", after=(first[0].run_at, first[0].id), preview=50
    )
    assert [j.id for j in rest] == ["j1", "j2"]
    assert all(isinstance(j.payload, PayloadPreview) for j in rest)


@pytest.mark.backend_features("payload_search")
def test_payload_contains_matches_a_substring_of_the_payloads_json(
    backend: Backend, clock: FakeClock
) -> None:
    t0 = clock.time()
    backend.enqueue(
        [
            spec("a", t0 + 1, payload={"to": "ann@example.com", "n": 1}),
            spec("b", t0 + 2, payload={"to": "bob@example.com", "n": 2}),
            spec("c", t0 + 3, payload={"to": "ann@example.org", "n": 3}, name="sms"),
        ]
    )
    search = backend.list_jobs  # type: ignore[call-arg]
    assert [j.id for j in search(payload_contains="ann@")] == ["a", "c"]
    assert [j.id for j in search(payload_contains="ann@", name="sms")] == ["c"]
    assert [j.id for j in search(payload_contains='"n":2')] == ["b"]
    assert search(payload_contains="nobody") == []


@pytest.mark.backend_features("payload_search")
def test_payload_at_matches_a_value_at_a_json_path_by_type(
    backend: Backend, clock: FakeClock
) -> None:
    t0 = clock.time()
    backend.enqueue(
        [
            spec("int", t0 + 1, payload={"customer": {"id": 42}, "items": [{"sku": "A-1"}]}),
            spec("str", t0 + 2, payload={"customer": {"id": "42"}, "items": []}),
            spec("flag", t0 + 3, payload={"customer": {"id": 7, "vip": True}}),
            spec("list", t0 + 4, payload=[1, 2]),
        ]
    )
    search = backend.list_jobs  # type: ignore[call-arg]
    assert [j.id for j in search(payload_at=("$.customer.id", 42))] == ["int"]
    assert [j.id for j in search(payload_at=("$.customer.id", 42.0))] == ["int"]
    assert [j.id for j in search(payload_at=("customer.id", "42"))] == ["str"]
    assert [j.id for j in search(payload_at=("$.items[0].sku", "A-1"))] == ["int"]
    assert [j.id for j in search(payload_at=("$.customer.vip", True))] == ["flag"]
    assert search(payload_at=("$.customer.vip", 1)) == []  # a number is not a boolean
    assert [j.id for j in search(payload_at=("$[1]", 2))] == ["list"]
    assert search(payload_at=("$.missing", 1)) == []
    both = search(payload_at=("$.customer.id", 42), payload_contains="A-1", limit=5)
    assert [j.id for j in both] == ["int"]


@pytest.mark.backend_features("payload_search")
def test_a_bad_payload_search_is_refused(backend: Backend) -> None:
    search = backend.list_jobs  # type: ignore[call-arg]
    for bad in (
        {"payload_contains": ""},
        {"payload_at": ("a..b", 1)},
        {"payload_at": ("$.a", None)},
        {"payload_at": ("$.a", {"x": 1})},
        {"preview": 0},
    ):
        with pytest.raises(InvalidOption):
            search(**bad)


def test_dead_letters_list_big_payloads_cut_too(backend: Backend, clock: FakeClock) -> None:
    big = {"blob": "z" * 3000}
    backend.enqueue([spec("dead", clock.time(), payload=big)])
    (claim,) = backend.claim(limit=1, lease=30.0)
    backend.bury(claim, "ValueError: no")
    (listed,) = backend.dead_letters(preview=10)  # type: ignore[call-arg]
    assert listed.payload == PayloadPreview(
        '{"blob":"z', len(json.dumps(big, separators=(",", ":")))
    )
    (whole,) = backend.dead_letters()
    assert whole.payload == big
