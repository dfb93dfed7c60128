"""``list_jobs``' payload search and preview, in SQL.

The listing statements (``list_by_state``, ``list_by_name`` in :mod:`._sql`)
carry these always, switched off by NULL parameters: ``strpos`` on the
payload's JSON text, jsonb equality at a path (``#>``: a string equals a
string only, numbers compare as numbers), and the payload's first characters
with its length instead of the whole text. Each test sits in a CASE, so a
switched-off one is never evaluated (a generic plan included).
"""

from __future__ import annotations

import json
from typing import Any

from delayq._validate import JsonScalar, PayloadPath

__all__ = ["SEARCH", "list_columns", "search_params"]


def list_columns(columns_text: str) -> str:
    """``columns_text`` (the job columns) with the payload cut to ``%(preview)s``
    characters when that is not NULL, and the payload's length after them."""
    columns = columns_text.split(", ")
    columns[columns.index("payload")] = (
        "CASE WHEN %(preview)s::int IS NULL THEN payload ELSE left(payload, %(preview)s::int) END"
    )
    return ", ".join(columns) + ", length(payload)"


SEARCH = """
                  AND (CASE WHEN %(contains)s::text IS NULL THEN true
                       ELSE strpos(payload, %(contains)s::text) > 0 END)
                  AND (CASE WHEN %(at_path)s::text[] IS NULL THEN true
                       ELSE payload::jsonb #> %(at_path)s::text[] = %(at_value)s::jsonb END)"""


def search_params(
    contains: str | None, at: tuple[PayloadPath, JsonScalar] | None, preview: int | None
) -> dict[str, Any]:
    return {
        "contains": contains,
        "at_path": None if at is None else [str(p) for p in at[0]],
        "at_value": None if at is None else json.dumps(at[1]),
        "preview": preview,
    }
