"""AsyncDelayQ's recurring methods: DelayQ's, awaited (same records, same errors)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from delayq import AsyncDelayQ, DelayQ
from delayq.errors import InvalidOption


def test_schedules_are_added_edited_and_removed_through_the_async_twin(tmp_path: Path) -> None:
    async def scenario() -> None:
        with DelayQ(f"sqlite:///{tmp_path / 'aio.db'}") as app:
            aq = AsyncDelayQ(app=app)
            added = await aq.recurring("poll", every=60, payload={"n": 1})
            assert added.every == 60.0 and not added.paused
            changed = await aq.update_recurring("poll", payload={"n": 2})
            assert changed.payload == '{"n":2}' and changed.version == 2
            assert await aq.pause_recurring("poll") is True
            listed = await aq.recurring_schedules()
            assert [(s.name, s.paused) for s in listed] == [("poll", True)]
            assert await aq.resume_recurring("poll") is True
            assert (await aq.get_recurring("poll")) == app.get_recurring("poll")
            assert await aq.remove_recurring("poll") is True
            assert await aq.get_recurring("poll") is None
            with pytest.raises(InvalidOption, match="not a valid cron expression"):
                await aq.recurring("bad", cron="every day")

    asyncio.run(scenario())
