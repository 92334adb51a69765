"""Which queue priority a caller gets: what it asked (or the default band), within what its token may ask.

Anyone may ask the default band or lower; above it a token is capped by its own maximum (`token create
--max-priority`) or else the backend's `--token-max-priority`; an admin token may ask any band.
"""

from __future__ import annotations

from typing import Any

from cortex_nb.protocol.errors import ApiError
from cortex_nb.protocol.priority import DEFAULT_PRIORITY, MAX_PRIORITY

from .auth import Principal


def priority_cap(principal: Principal, backend_cap: int) -> int:
    if principal.is_admin:
        return MAX_PRIORITY
    return principal.max_priority if principal.max_priority is not None else backend_cap


def granted_priority(principal: Principal, requested: int | None, backend_cap: int, field: str) -> int:
    """The band to queue at, or `priority_not_allowed` naming the field and the token's maximum."""
    if requested is None:
        return DEFAULT_PRIORITY
    cap = priority_cap(principal, backend_cap)
    if requested > cap:
        raise ApiError(
            "priority_not_allowed",
            f"{field}: this token may ask priority {cap} at most, not {requested}; ask an operator for a"
            " token with a higher --max-priority",
            {"field": field, "max_priority": cap},
        )
    return requested


def job_priority_validator(backend_cap: int):
    """A `JobManager.validators` entry: the job spec's `priority` checked and filled in."""

    def validate(principal: Principal, spec: dict[str, Any]) -> dict[str, Any]:
        return {
            **spec,
            "priority": granted_priority(principal, spec.get("priority"), backend_cap, "priority"),
        }

    return validate
