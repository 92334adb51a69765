"""How long ago, in words ("2 min ago"), and when those words next change, so a view can refresh
exactly then instead of on a fixed tick."""

from __future__ import annotations

JUST_NOW_S = 5
# (below this many seconds, counted in steps of, unit word); seconds count in fives, so a view that
# refreshes on change redraws every 5 s at most, then once a minute, then once an hour.
_SCALES = ((60, 5, "s", 1), (3600, 60, "min", 60), (86400, 3600, "h", 3600))


def ago(seconds: float) -> tuple[str, float]:
    """("15 s ago", 3.0): the words for `seconds` in the past and the seconds until they change.
    A moment slightly in the future (another host's clock) reads "just now"."""
    seconds = max(seconds, 0.0)
    if seconds < JUST_NOW_S:
        return "just now", JUST_NOW_S - seconds
    for limit, step, word, per_unit in _SCALES:
        if seconds < limit:
            stepped = int(seconds // step) * step
            return f"{stepped // per_unit} {word} ago", step - seconds % step
    days = int(seconds // 86400)
    return f"{days} d ago", 86400 - seconds % 86400
