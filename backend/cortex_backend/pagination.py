"""Newest-first keyset pages for job and run listings: a cursor names the last row of the previous page.

A cursor is "<created_at>:<id>", so a page stays correct while rows are being added.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cortex_nb.protocol.errors import ApiError


@dataclass(frozen=True)
class ListingFilter:
    """What a job or run listing keeps: `owner` (None: everyone's, for an admin), `status`, `name` (a
    part of the name), `since` <= created_at < `until`, `label` ("key" or "key=value")."""

    owner: str | None = None
    status: str | None = None
    name: str | None = None
    since: float | None = None
    until: float | None = None
    label: str | None = None

    def where(self) -> tuple[list[str], list[Any]]:
        """SQL conditions (for the jobs and runs tables: both keep labels in their spec) and parameters."""
        clauses: list[str] = []
        params: list[Any] = []
        if self.owner is not None:
            clauses.append("owner = ?")
            params.append(self.owner)
        if self.status is not None:
            clauses.append("status = ?")
            params.append(self.status)
        if self.name:
            clauses.append("instr(name, ?) > 0")
            params.append(self.name)
        if self.since is not None:
            clauses.append("created_at >= ?")
            params.append(self.since)
        if self.until is not None:
            clauses.append("created_at < ?")
            params.append(self.until)
        if self.label:
            key, has_value, value = self.label.partition("=")
            # Label names are [a-z0-9_.-] (checked by the query schema): quoted, they are one JSON path step.
            path = f'$.labels."{key}"'
            if has_value:
                clauses.append("json_extract(spec, ?) = ?")
                params.extend([path, value])
            else:
                clauses.append("json_extract(spec, ?) IS NOT NULL")
                params.append(path)
        return clauses, params


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
    table: str,
    owner: str | None,
    status: str | None,
    before: tuple[float, str] | None,
    filters: ListingFilter | None = None,
) -> tuple[str, list[Any]]:
    """`SELECT * FROM table WHERE ... ORDER BY created_at DESC, id DESC` (LIMIT is the caller's).
    `filters` replaces `owner` and `status` when given."""
    clauses, params = (filters or ListingFilter(owner=owner, status=status)).where()
    if before is not None:
        clauses.append("(created_at < ? OR (created_at = ? AND id < ?))")
        params.extend([before[0], before[0], before[1]])
    where = ("WHERE " + " AND ".join(clauses)) if clauses else ""
    return f"SELECT * FROM {table} {where} ORDER BY created_at DESC, id DESC LIMIT ?", params
