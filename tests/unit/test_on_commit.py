"""schedule(on_commit=True): checked and named at once, stored when the transaction commits."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Callable

import pytest

from delayq import DelayQ
from delayq.errors import ConfigurationError, InvalidOption, InvalidPayload


def test_the_job_is_stored_only_when_the_commit_hook_runs_it() -> None:
    app = DelayQ("memory://")
    pending: list[Callable[[], None]] = []
    app.set_commit_hook(pending.append)

    @app.task(name="t")
    def t(n: int) -> None: ...

    job_id = app.schedule("x", {"n": 1}, job_id="j1", on_commit=True)
    handle = t.options(delay=5, on_commit=True).schedule(2)
    assert job_id == "j1" and app.get("j1") is None and app.get(handle) is None
    with pytest.raises(InvalidPayload):  # bad input fails at the call, not at commit
        app.schedule("x", {1, 2}, on_commit=True)  # type: ignore[arg-type]
    for run in pending:  # the transaction commits
        run()
    assert app.get("j1") is not None and app.get(handle) is not None
    app.close()


def test_on_commit_needs_a_hook_and_is_not_for_keyed_calls_or_a_connection() -> None:
    app = DelayQ("memory://")
    with pytest.raises(ConfigurationError, match="needs a commit hook"):
        app.schedule("x", on_commit=True)
    app.set_commit_hook(lambda fn: fn())
    with pytest.raises(InvalidOption, match="do not apply to keyed calls"):
        app.schedule("x", job_id="k", on_conflict="debounce", max_wait=5, on_commit=True)
    with pytest.raises(InvalidOption, match="not both"):
        app.schedule("x", on_commit=True, connection=object())
    with pytest.raises(ConfigurationError, match="callable"):
        app.set_commit_hook(42)  # type: ignore[arg-type]
    app.close()


def test_the_django_integration_reads_its_settings_and_uses_transaction_on_commit() -> None:
    pytest.importorskip("django")
    code = textwrap.dedent(
        """
        import django
        from django.conf import settings
        settings.configure(
            INSTALLED_APPS=["delayq.integrations.django"],
            DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
            DELAYQ={"URL": "memory://", "OPTIONS": {"max_attempts": 2}},
        )
        django.setup()
        from django.db import transaction
        from delayq.errors import ConfigurationError
        from delayq.integrations import django as dq

        app = dq.get_app()
        assert app is dq.get_app() and app.url == "memory://"
        with transaction.atomic():
            app.schedule("x", job_id="kept", on_commit=True)
            assert app.get("kept") is None  # not yet: the transaction is open
        assert app.get("kept").max_attempts == 2
        try:
            with transaction.atomic():
                app.schedule("x", job_id="dropped", on_commit=True)
                raise KeyError("rollback")
        except KeyError:
            pass
        assert app.get("dropped") is None
        app.schedule("x", job_id="now", on_commit=True)  # no transaction: at once
        assert app.get("now") is not None

        dq.reset()
        settings.DELAYQ = {"URL": "memory://", "APP": "x:y"}
        try:
            dq.get_app()
        except ConfigurationError as exc:
            print("refused:", exc)
        settings.DELAYQ = {"URLS": "memory://"}
        try:
            dq.get_app()
        except ConfigurationError as exc:
            print("refused:", exc)
        """
    )
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert run.returncode == 0, run.stderr
    assert "refused: settings.DELAYQ: give APP" in run.stdout
    assert "refused: settings.DELAYQ has unknown keys ['URLS']" in run.stdout


def test_without_django_the_import_says_what_to_install() -> None:
    code = (
        "import sys; sys.modules['django'] = None; sys.modules['django.conf'] = None\n"
        "try:\n    import delayq.integrations.django\n"
        "except ImportError as exc:\n    print(type(exc).__name__, exc)\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert "MissingDependency" in run.stdout and "pip install 'delayq[django]'" in run.stdout
