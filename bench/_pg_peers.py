"""PostgreSQL peers for ``bench.postgres``: procrastinate and pgqueuer, default settings.

Each peer gets its own schema in the benchmark's database (``BENCH_PG_PEER_URL``):
procrastinate through the connection's ``search_path``, pgqueuer through
``PGQUEUER_SCHEMA``. Every handler only records its lateness
(:func:`bench._peer_common.record`: ``time.time()`` minus the absolute due time
passed as an argument).

Worker processes: ``python -m bench._pg_peers procrastinate`` (``App.run_worker()``,
its defaults) and ``python -m bench._pg_peers pgqueuer`` (``PgQueuer.run()``, the
defaults of its ``pgq run`` command, whose 1.6.0 CLI fails to parse its own
default log level).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote

from bench._peer_common import record

URL_ENV = "BENCH_PG_PEER_URL"
PROCRASTINATE_SCHEMA = "procrastinate_bench"
PGQUEUER_SCHEMA = "pgqueuer_bench"


def _url() -> str:
    return os.environ.get(URL_ENV, "postgresql://postgres@127.0.0.1:5432/delayq_bench")


# -- procrastinate ------------------------------------------------------------------------


def procrastinate_app() -> Any:
    import procrastinate  # noqa: PLC0415 - only in the benchmark's environment

    search_path = quote(f"-csearch_path={PROCRASTINATE_SCHEMA}")
    app = procrastinate.App(
        connector=procrastinate.PsycopgConnector(conninfo=f"{_url()}?options={search_path}")
    )

    @app.task(name="noop")
    def noop(index: int, due: float) -> None:
        record(index, due)

    return app


def procrastinate_install(url: str) -> None:
    import psycopg  # noqa: PLC0415

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{PROCRASTINATE_SCHEMA}"')
    os.environ[URL_ENV] = url
    app = procrastinate_app()
    with app.open():
        app.schema_manager.apply_schema()


def procrastinate_enqueue(url: str, jobs: Iterable[tuple[int, float]]) -> None:
    os.environ[URL_ENV] = url
    app = procrastinate_app()
    task = app.tasks["noop"]
    with app.open():
        for index, due in jobs:
            task.configure(schedule_at=datetime.fromtimestamp(due, UTC)).defer(index=index, due=due)


def procrastinate_fill(url: str, n: int, due: float) -> None:
    """``n`` jobs due at ``due``, in batches (for the drain measurement)."""
    os.environ[URL_ENV] = url
    app = procrastinate_app()
    with app.open():
        task = app.tasks["noop"].configure(schedule_at=datetime.fromtimestamp(due, UTC))
        for start in range(0, n, 1000):
            task.batch_defer(
                *({"index": i, "due": due} for i in range(start, min(n, start + 1000)))
            )


# -- pgqueuer ---------------------------------------------------------------------------


async def pgqueuer_factory() -> Any:
    import psycopg  # noqa: PLC0415
    from pgqueuer import PgQueuer  # noqa: PLC0415

    conn = await psycopg.AsyncConnection.connect(_url(), autocommit=True)
    pgq = PgQueuer.from_psycopg_connection(conn)

    @pgq.entrypoint("noop")
    async def noop(job: Any) -> None:
        data = json.loads(job.payload)
        record(data["index"], data["due"])

    return pgq


def pgqueuer_install(url: str) -> None:
    import psycopg  # noqa: PLC0415
    from pgqueuer.adapters.drivers.psycopg import PsycopgDriver  # noqa: PLC0415
    from pgqueuer.queries import Queries  # noqa: PLC0415

    os.environ["PGQUEUER_SCHEMA"] = PGQUEUER_SCHEMA

    async def install() -> None:
        conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
        try:
            queries = Queries(PsycopgDriver(conn))
            if not await queries.schema_is_installed():
                await queries.install()
        finally:
            await conn.close()

    asyncio.run(install())


def pgqueuer_enqueue(url: str, jobs: Iterable[tuple[int, float]]) -> None:
    import psycopg  # noqa: PLC0415
    from pgqueuer.adapters.drivers.psycopg import SyncPsycopgDriver  # noqa: PLC0415
    from pgqueuer.queries import SyncQueries  # noqa: PLC0415

    os.environ["PGQUEUER_SCHEMA"] = PGQUEUER_SCHEMA
    with psycopg.connect(url, autocommit=True) as conn:
        queries = SyncQueries(SyncPsycopgDriver(conn))
        for index, due in jobs:
            payload = json.dumps({"index": index, "due": due}).encode()
            after = timedelta(seconds=max(0.0, due - time.time()))
            queries.enqueue("noop", payload, execute_after=after)


async def _run_pgqueuer() -> None:
    pgq = await pgqueuer_factory()
    await pgq.run()  # the defaults ``pgq run`` uses


def pgqueuer_fill(url: str, n: int, due: float) -> None:
    """``n`` jobs due at ``due``, in batches (for the drain measurement)."""
    import psycopg  # noqa: PLC0415
    from pgqueuer.adapters.drivers.psycopg import SyncPsycopgDriver  # noqa: PLC0415
    from pgqueuer.queries import SyncQueries  # noqa: PLC0415

    os.environ["PGQUEUER_SCHEMA"] = PGQUEUER_SCHEMA
    with psycopg.connect(url, autocommit=True) as conn:
        queries = SyncQueries(SyncPsycopgDriver(conn))
        for start in range(0, n, 1000):
            count = min(n, start + 1000) - start
            after = timedelta(seconds=max(0.0, due - time.time()))
            queries.enqueue(
                ["noop"] * count,
                [
                    json.dumps({"index": i, "due": due}).encode()
                    for i in range(start, start + count)
                ],
                [0] * count,
                [after] * count,
            )


def delayq_fill(url: str, n: int, due: float) -> None:
    """``n`` jobs due at ``due``, 1,000 per ``schedule_many`` (for the drain measurement)."""
    from delayq import DelayQ  # noqa: PLC0415

    with DelayQ(url) as app:
        for start in range(0, n, 1000):
            app.schedule_many(
                [
                    {"name": "noop", "payload": {"index": i, "due": due}, "at": due}
                    for i in range(start, min(n, start + 1000))
                ]
            )


def main() -> None:
    if sys.argv[1:] == ["procrastinate"]:
        procrastinate_app().run_worker()
    elif sys.argv[1:] == ["pgqueuer"]:
        os.environ.setdefault("PGQUEUER_SCHEMA", PGQUEUER_SCHEMA)
        asyncio.run(_run_pgqueuer())
    else:
        raise SystemExit("usage: python -m bench._pg_peers procrastinate|pgqueuer")


if __name__ == "__main__":
    main()
