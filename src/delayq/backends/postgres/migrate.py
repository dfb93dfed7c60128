"""``delayq migrate``: create or upgrade a PostgreSQL store's schema by hand.

Stores migrate themselves when opened (``migrate=True``, the default; every
migration is additive and keeps the previous delayq version working, so a
rolling deploy can mix them); run this before deploying a new delayq version
when the application's database user may not create tables (open the stores
with ``migrate=False`` then). ``--sql`` prints the statements instead of
running them.
"""

from __future__ import annotations

from urllib.parse import urlsplit

import psycopg

import delayq.backends.postgres._schema as schemas
from delayq.backends.postgres._connection import mapped, mask, split_url
from delayq.errors import ConfigurationError

__all__ = ["migrate_url"]


def migrate_url(url: str | None, *, sql: bool = False) -> str:
    """Migrate the schema named by ``url`` (``?schema=``, default ``delayq``); a report
    line. With ``sql``, change nothing and return the statements it would run."""
    if url is None or urlsplit(url).scheme not in ("postgresql", "postgres"):
        raise ConfigurationError(
            f"delayq migrate is for postgresql:// stores (got {url and mask(url)!r}); "
            f"the other stores create their schema when they are opened"
        )
    conninfo, options = split_url(url)
    schema = schemas.check_schema_name(options.get("schema", schemas.DEFAULT_SCHEMA))
    with (
        mapped(mask(url), "migrating"),
        psycopg.connect(conninfo, autocommit=True, application_name="delayq-migrate") as conn,
    ):
        if sql:
            statements = schemas.pending_sql(conn, schema)
            if not statements:
                return f"-- schema {schema!r} is at version {schemas.SCHEMA_VERSION}: nothing to do"
            return "\n".join(f"{statement.strip()};" for statement in statements)
        before, after = schemas.migrate(conn, schema)
    if before == after:
        return f"schema {schema!r} is at version {after}: nothing to do"
    return f"schema {schema!r} migrated from version {before} to {after}"
