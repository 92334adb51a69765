"""Newest-first keyset pages for job and run listings: a cursor names the last row of the previous page.

A cursor is "<created_at>:<id>", so a page stays correct while rows are being added.
"""

from __future__ import annotations

from typing import Any

from cortex_nb.protocol.errors import ApiError


def parse_cursor(cursor: str | None) -> tuple[float, str] | None:
    if not cursor:
        return None
    created, _, last_id = cursor.partition(":")
    try:
        return float(created), last_id
    except ValueError:
        raise ApiError(
            "invalid_field", "cursor: not a cursor returned by this endpoint", {"field": "cursor"}
        ) from None


def split_page(rows: list[dict[str, Any]], limit: int) -> tuple[list[dict[str, Any]], str | None]:
    """Rows were fetched with `limit + 1`: the extra one only says whether another page follows."""
    page = rows[:limit]
    more = len(rows) > limit and page
    return page, (f"{page[-1]['created_at']!r}:{page[-1]['id']}" if more else None)


def newest_first_query(
    table: str, owner: str | None, status: str | None, before: tuple[float, str] | None
) -> tuple[str, list[Any]]:
    """`SELECT * FROM table WHERE ... ORDER BY created_at DESC, id DESC` (LIMIT is the caller's)."""
    clauses, params = [], []
    if owner is not None:
        clauses.append("owner = ?")
        params.append(owner)
    if status is not None:
        clauses.append("status = ?")
        params.append(status)
    if before is not None:
        clauses.append("(created_at < ? OR (created_at = ? AND id < ?))")
        params.extend([before[0], before[0], before[1]])
    where = ("WHERE " + " AND ".join(clauses)) if clauses else ""
    return f"SELECT * FROM {table} {where} ORDER BY created_at DESC, id DESC LIMIT ?", params
