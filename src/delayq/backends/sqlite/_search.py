"""``list_jobs``' payload search and preview, in SQL (SQLite's JSON functions).

A search filters the rows the other filters select, where SQLite reads them:
``instr`` on the payload's JSON text, ``json_type`` / ``json_extract`` at a
path (guarded by ``json_valid``: a broken record is skipped, never an error).
A preview selects the payload's first characters and its length, so a list of
big payloads never brings them into Python.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from delayq._validate import JsonScalar, PayloadPath
from delayq.backends.sqlite._schema import COLUMNS, to_job
from delayq.job import Job, PayloadPreview

__all__ = ["json_path", "listed_job", "payload_filters", "preview_select"]


def json_path(path: PayloadPath) -> str:
    """SQLite's path text for ``path`` (keys quoted: they may hold '-')."""
    return "$" + "".join(f"[{p}]" if isinstance(p, int) else f'."{p}"' for p in path)


def payload_filters(
    contains: str | None, at: tuple[PayloadPath, JsonScalar] | None
) -> tuple[list[str], list[Any]]:
    """WHERE clauses and their parameters for ``payload_contains`` / ``payload_at``."""
    clauses: list[str] = []
    params: list[Any] = []
    if contains is not None:
        clauses.append("instr(payload, ?) > 0")
        params.append(contains)
    if at is not None:
        path, value = json_path(at[0]), at[1]
        extra: list[Any]
        if isinstance(value, bool):
            test, extra = "json_type(payload, ?) = ?", [path, "true" if value else "false"]
        elif isinstance(value, str):
            test = "json_type(payload, ?) = 'text' AND json_extract(payload, ?) = ?"
            extra = [path, path, value]
        else:
            test = "json_type(payload, ?) IN ('integer', 'real') AND json_extract(payload, ?) = ?"
            extra = [path, path, value]
        clauses.append(f"(CASE WHEN json_valid(payload) THEN {test} ELSE 0 END)")
        params.extend(extra)
    return clauses, params


def preview_select() -> str:
    """``SELECT`` of the job columns with the payload cut to ``?`` characters, and
    the payload's length as one more column (the first parameter is the cut)."""
    columns = COLUMNS.split(", ")
    columns[columns.index("payload")] = "substr(payload, 1, ?)"
    return f"SELECT {', '.join(columns)}, length(payload) FROM delayq_jobs"


def listed_job(row: Any, preview: int | None) -> Job:
    """The job of a row of :func:`preview_select` (or of ``SELECT`` when ``preview``
    is None): a payload longer than ``preview`` as a PayloadPreview."""
    if preview is None or row[-1] <= preview:
        return to_job(row)
    return replace(to_job((*row[:3], "null", *row[4:])), payload=PayloadPreview(row[3], row[-1]))
