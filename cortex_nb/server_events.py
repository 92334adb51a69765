"""Reading a server-sent events stream (text/event-stream): the form a streamed generate answers in."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any


def server_events(lines: Iterable[str]) -> Iterator[tuple[str, Any]]:
    """(event name, its JSON data) for each event of the stream; comment lines (heartbeats) are skipped."""
    name, data = "message", []
    for line in lines:
        if not line:
            if data:
                yield name, json.loads("\n".join(data))
            name, data = "message", []
        elif line.startswith(":"):
            continue
        else:
            field, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if field == "event":
                name = value
            elif field == "data":
                data.append(value)
    if data:
        yield name, json.loads("\n".join(data))
