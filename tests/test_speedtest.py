"""The link speed test through a real backend on loopback: figures in line with what loopback carries,
refused without a token, bounded, rate-limited per token; and the upload ETA it gives the SDK."""

from __future__ import annotations

import socket
import threading
import time

import httpx
import pytest

from cortex_nb import Client
from cortex_nb.link_speed import upload_eta_s

from .backend_process import start_backend
from .tokens import create_token

PER_MINUTE = 12
MIB = 1024 * 1024


@pytest.fixture(scope="module")
def backend(tmp_path_factory):
    process = start_backend(
        tmp_path_factory.mktemp("speedtest"),
        "--devices",
        "cpu:1",
        "--warm-workers",
        "0",
        "--monitor-interval",
        "0",
        "--speedtest-per-minute",
        str(PER_MINUTE),
    )
    yield process
    process.stop()


def loopback_mb_s(size: int = 64 * MIB) -> float:
    """Raw TCP throughput over 127.0.0.1 on this machine now: the ceiling any HTTP figure must stay under."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    received = 0

    def drain() -> None:
        nonlocal received
        connection, _ = server.accept()
        with connection:
            while chunk := connection.recv(1 << 20):
                received += len(chunk)

    reader = threading.Thread(target=drain)
    reader.start()
    block = bytes(1 << 20)
    started = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port)) as sender:
        for _ in range(size // len(block)):
            sender.sendall(block)
    reader.join()
    elapsed = time.perf_counter() - started
    server.close()
    assert received == size
    return size / 1e6 / elapsed


def test_figures_are_within_a_factor_of_loopback(backend):
    ceiling = loopback_mb_s()
    with Client(backend.url, backend.token) as client:
        figures = client.speedtest(size_mb=8, pings=3)
        # The same 8 MB fetched by hand, timed here: the speed test's figure is of that order.
        started = time.perf_counter()
        response = httpx.get(
            backend.url + "/v1/speedtest",
            params={"bytes": 8_000_000},
            headers={"Authorization": f"Bearer {backend.token}"},
        )
        by_hand = 8.0 / (time.perf_counter() - started)
    assert response.status_code == 200 and len(response.content) == 8_000_000
    assert figures["bytes"] == 8_000_000 and figures["latency_ms"] > 0
    for rate in (figures["download_mb_s"], figures["upload_mb_s"]):
        assert ceiling / 1000 < rate < ceiling * 1.5, (rate, ceiling)
    assert by_hand / 10 < figures["download_mb_s"] < by_hand * 10
    assert client.api.measured_link == figures


def test_refused_without_a_token_and_bounded(backend):
    assert httpx.get(backend.url + "/v1/speedtest", params={"bytes": 10}).status_code == 401
    assert httpx.post(backend.url + "/v1/speedtest", content=b"x" * 10).status_code == 401
    token = create_token(backend.data_dir, "bounded", "jobs:read")
    headers = {"Authorization": f"Bearer {token}"}
    too_many = httpx.get(backend.url + "/v1/speedtest", params={"bytes": 32 * MIB + 1}, headers=headers)
    assert too_many.status_code == 400 and too_many.json()["error"]["detail"]["field"] == "bytes"
    too_big = httpx.post(backend.url + "/v1/speedtest", content=bytes(32 * MIB + 1), headers=headers)
    assert too_big.status_code == 413 and too_big.json()["error"]["code"] == "body_too_large"
    counted = httpx.post(backend.url + "/v1/speedtest", content=bytes(MIB), headers=headers)
    assert counted.status_code == 200 and counted.json()["bytes"] == MIB


def test_each_token_is_rate_limited_on_its_own(backend):
    first = create_token(backend.data_dir, "quick", "jobs:read")
    second = create_token(backend.data_dir, "patient", "jobs:read")
    answers = [
        httpx.get(
            backend.url + "/v1/speedtest", params={"bytes": 0}, headers={"Authorization": f"Bearer {first}"}
        )
        for _ in range(PER_MINUTE + 1)
    ]
    assert [answer.status_code for answer in answers] == [200] * PER_MINUTE + [429]
    error = answers[-1].json()["error"]
    assert error["code"] == "rate_limited" and 0 < error["detail"]["retry_after_s"] <= 60
    other = httpx.get(
        backend.url + "/v1/speedtest", params={"bytes": 0}, headers={"Authorization": f"Bearer {second}"}
    )
    assert other.status_code == 200


def test_a_large_upload_shows_an_eta_from_the_measured_link(backend, capsys):
    token = create_token(backend.data_dir, "uploader", "jobs:read", "jobs:write")
    lines = [b'{"text": "row %d of a dataset"}\n' % i for i in range(20_000)]
    rows = b"".join(lines)
    with Client(backend.url, token) as client:
        client.api.eta_threshold_bytes = 100_000
        client.upload_dataset(b"".join(lines[:10_000]))
        assert "client.speedtest() measures the link" in capsys.readouterr().err
        figures = client.speedtest(size_mb=2, pings=1)
        client.upload_dataset(rows)
        said = capsys.readouterr().err
        assert f"uploading a training dataset: {len(rows) / 1e6:.1f} MB, about" in said
        assert f"at the measured {figures['upload_mb_s']:.1f} MB/s" in said
        assert upload_eta_s(client.api, len(rows)) == pytest.approx(
            len(rows) / 1e6 / figures["upload_mb_s"] + figures["latency_ms"] / 1000
        )
        client.api.eta_threshold_bytes = 10 * len(rows)
        client.upload_dataset(rows + b'{"text": "one more"}\n')
        assert capsys.readouterr().err == ""
