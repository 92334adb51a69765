"""The link to the backend, measured (`client.speedtest()`, `%cortex speedtest`), and the upload ETA it
gives: before an upload larger than `Api.eta_threshold_bytes` (a dataset, a run's source archive), the
SDK says how long it should take at the measured upload rate.

Figures are the client's own wall clock around whole requests (HTTP overhead included), in MB/s
(10^6 bytes per second); latency is the median of small round trips.
"""

from __future__ import annotations

import statistics
import sys
import time
from typing import Any

from .api import Api, HasApi, api_of

DEFAULT_SIZE_BYTES = 8 * 1024 * 1024
DEFAULT_PINGS = 5
MB = 1e6


def measure(
    client: Api | HasApi, size_bytes: int = DEFAULT_SIZE_BYTES, pings: int = DEFAULT_PINGS
) -> dict[str, float]:
    """Time `pings` empty round trips, a download and an upload of `size_bytes` (at most 32 MiB each);
    the figures are kept on the Api for upload ETAs. Costs `pings + 2` speed-test calls of the token's
    per-minute allowance."""
    api = api_of(client)
    round_trips = []
    for _ in range(max(1, pings)):
        started = time.perf_counter()
        api.speedtest_download(0)
        round_trips.append(time.perf_counter() - started)
    started = time.perf_counter()
    received = api.speedtest_download(size_bytes)
    download_s = time.perf_counter() - started
    payload = bytes(size_bytes)
    started = time.perf_counter()
    answer = api.speedtest_upload(payload)
    upload_s = time.perf_counter() - started
    figures = {
        "latency_ms": round(statistics.median(round_trips) * 1000, 3),
        "download_mb_s": round(received / MB / max(download_s, 1e-9), 3),
        "upload_mb_s": round(answer["bytes"] / MB / max(upload_s, 1e-9), 3),
        "bytes": float(size_bytes),
        "measured_at": time.time(),
    }
    api.measured_link = figures
    return figures


def upload_eta_s(api: Api, size_bytes: int) -> float | None:
    """Seconds an upload of `size_bytes` should take at the measured rate (None: not measured)."""
    link = api.measured_link
    if not link or not link.get("upload_mb_s"):
        return None
    return size_bytes / MB / link["upload_mb_s"] + link.get("latency_ms", 0.0) / 1000


def announce_upload(client: Api | HasApi, size_bytes: int, what: str) -> None:
    """Before a large upload: its size and, once the link was measured, its ETA (on stderr)."""
    api = api_of(client)
    if size_bytes < api.eta_threshold_bytes:
        return
    eta = upload_eta_s(api, size_bytes)
    if eta is None:
        line = f"uploading {what}: {size_bytes / MB:.1f} MB (client.speedtest() measures the link for an ETA)"
    else:
        line = (
            f"uploading {what}: {size_bytes / MB:.1f} MB, about {_duration(eta)} at the measured"
            f" {api.measured_link['upload_mb_s']:.1f} MB/s"
        )
    print(line, file=sys.stderr, flush=True)


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.0f} s" if seconds >= 1 else "under a second"
    return f"{seconds / 60:.1f} min"


def describe(figures: dict[str, Any]) -> str:
    return (
        f"upload {figures['upload_mb_s']:.1f} MB/s, download {figures['download_mb_s']:.1f} MB/s,"
        f" latency {figures['latency_ms']:.1f} ms ({figures['bytes'] / MB:.1f} MB each way)"
    )
