"""The link speed test: `GET /v1/speedtest?bytes=N` sends N bytes, `POST /v1/speedtest` takes a body and
says how much arrived. Sizes are bounded and each token may test a few times a minute."""

from __future__ import annotations

from pydantic import Field

from .base import Query, Reply

MAX_SPEEDTEST_BYTES = 32 * 1024 * 1024
DEFAULT_SPEEDTEST_BYTES = 8 * 1024 * 1024


class SpeedtestQuery(Query):
    bytes: int = Field(
        default=DEFAULT_SPEEDTEST_BYTES,
        ge=0,
        le=MAX_SPEEDTEST_BYTES,
        description="how many bytes to send (0: an empty answer, to time a round trip)",
    )


class SpeedtestReceived(Reply):
    """`POST /v1/speedtest`: what arrived."""

    bytes: int
    receive_s: float = Field(description="seconds from the body's first byte to its last, as the backend saw")
