"""The hot paths' twins (``schedule_after``, ``put_after``) are generated from their ``*_at``."""

from __future__ import annotations

from pathlib import Path

import pytest

from delayq.timers import _gen_hotpaths
from delayq.timers._gen_hotpaths import TWINS, generate, main

_TIMERS = Path(_gen_hotpaths.__file__).parent


def test_generated_hot_paths_are_up_to_date(capsys: pytest.CaptureFixture[str]) -> None:
    # Fails after an edit of schedule_at / put_at until the generator is run again.
    assert main(["--test"]) == 0, capsys.readouterr().out


@pytest.mark.parametrize(("module", "cls", "source", "target"), TWINS)
def test_an_edit_of_the_source_shows_in_its_twin_once_regenerated(
    module: str, cls: str, source: str, target: str
) -> None:
    text = (_TIMERS / module).read_text(encoding="utf-8")
    source_start = text.index(f"    def {source}(")
    source_end = text.index("\n    def ", source_start + 1)
    body = text[source_start:source_end]
    assert "        lock = self._lock\n" in body
    changed = (
        text[:source_start]
        + body.replace("        lock = self._lock\n", "        lock = self._lock  # edited\n")
        + text[source_end:]
    )
    # Only the source is edited: its twin is out of date...
    assert generate(changed, cls, source, target) != changed
    # ... and regenerating copies the edit into the twin, after which it is up to date.
    regenerated = generate(changed, cls, source, target)
    assert regenerated.count("        lock = self._lock  # edited\n") == 2
    assert generate(regenerated, cls, source, target) == regenerated
    assert generate(text, cls, source, target) == text


def test_a_twin_without_its_markers_is_refused() -> None:
    text = (_TIMERS / "delay_queue.py").read_text(encoding="utf-8")
    broken = text.replace("        # END GENERATED\n", "")
    with pytest.raises(ValueError, match="needs one"):
        generate(broken, "DelayQueue", "put_at", "put_after")
