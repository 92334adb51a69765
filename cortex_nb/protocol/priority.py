"""Queue priority: the bands a job, training run or source run may ask for, and how waiting
raises a holder's band (aging), so a low band is never starved.

The rule (docs/api.md, "Priorities"): the queue is ordered by effective priority, highest first, then by
submission time, oldest first. A holder's effective priority is its priority plus one band for every
`aging_s` seconds it has waited, at most `MAX_PRIORITY`. So after `(MAX_PRIORITY - p) * aging_s` seconds a
holder of priority `p` is in the top band, ahead of everything submitted after it.
"""

from __future__ import annotations

MIN_PRIORITY = 0
MAX_PRIORITY = 9
DEFAULT_PRIORITY = 5
# Seconds of waiting that raise a holder by one band (the backend's --queue-aging-s; 0 turns aging off).
DEFAULT_AGING_S = 300.0


def effective_priority(priority: int, waited_s: float, aging_s: float) -> int:
    """`priority` raised one band per `aging_s` seconds waited, capped at the top band."""
    if aging_s <= 0 or waited_s <= 0:
        return priority
    return min(MAX_PRIORITY, priority + int(waited_s // aging_s))


def aging_bound_s(priority: int, aging_s: float) -> float:
    """How long a holder of `priority` waits at most before it is in the top band."""
    return max(0, MAX_PRIORITY - priority) * aging_s
