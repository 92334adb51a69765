"""Whose work a listing or the statistics cover: an admin's token names anyone (or no one: everyone);
any other token sees only its own, and naming another owner is refused, not silently narrowed."""

from __future__ import annotations

from typing import Any

from cortex_nb.protocol.errors import ApiError

from .auth import Principal
from .pagination import ListingFilter


def owner_scope(principal: Principal, requested: str | None) -> str | None:
    """The owner to filter on (None: everyone's, only for an admin)."""
    if principal.is_admin:
        return requested
    if requested is not None and requested != principal.owner:
        raise ApiError(
            "forbidden",
            f"owner: this token sees only its own work ({principal.owner!r}); an admin token may name others",
            {"field": "owner", "missing_scopes": ["admin"]},
        )
    return principal.owner


def listing_filter(principal: Principal, query: Any) -> ListingFilter:
    """A `ListJobsQuery` or `ListRunsQuery` as the store's filter."""
    if query.since is not None and query.until is not None and query.until < query.since:
        raise ApiError("invalid_field", "until: must not be before since", {"field": "until"})
    return ListingFilter(
        owner=owner_scope(principal, query.owner),
        status=query.status,
        name=query.name,
        since=query.since,
        until=query.until,
        label=query.label,
    )
