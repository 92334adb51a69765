"""What one Tinker owner can cost the backend and the other owners: a zstd bomb does not stall other clients'
requests, live sessions per owner are capped (the `tinker` SDK hears a clear refusal) and their metadata is
bounded and freed when they expire, and one owner's flood of futures never forgets another owner's."""

from __future__ import annotations

import statistics
import threading
import time

import httpx
import pytest
import zstandard

from .backend_process import start_backend
from .tinker_fixtures import NEEDS_SDK
from .tokens import create_token

PROTOBUF_ZSTD = {"Content-Type": "application/x-protobuf", "Content-Encoding": "zstd"}


def zstd_bomb(size: int = 15 * 1024 * 1024) -> bytes:
    """About a kilobyte that expands into `size` bytes of two-byte protobuf fields (seq_id = 0, again and
    again): millions of fields to read, and a frame that does not declare its size."""
    return zstandard.ZstdCompressor(level=19, write_content_size=False).compress(b"\x10\x00" * (size // 2))


def healthz_latencies(client: httpx.Client, seconds: float) -> list[float]:
    """The round-trip time of each GET /api/v1/healthz one client sends, one after the other, for `seconds`."""
    latencies, end = [], time.monotonic() + seconds
    while time.monotonic() < end:
        began = time.monotonic()
        assert client.get("/api/v1/healthz").status_code == 200
        latencies.append(time.monotonic() - began)
    return latencies


@pytest.fixture(scope="module")
def limited(tmp_path_factory):
    """A backend of this module's own: its sessions end 2 s after their last heartbeat."""
    process = start_backend(
        tmp_path_factory.mktemp("tinker-limits"),
        "--devices",
        "cpu:1",
        "--warm-workers",
        "0",
        "--tinker-session-timeout",
        "2",
    )
    yield process
    process.stop()


def test_a_zstd_bomb_flood_leaves_other_clients_answered(limited):
    bomb = zstd_bomb()
    assert len(bomb) < 4096
    attacker = create_token(limited.data_dir, "bomber", "jobs:read", "jobs:write", tinker=True)
    victim = httpx.Client(base_url=limited.url, timeout=60)
    flooding, refusals = threading.Event(), []

    def flood() -> None:
        with httpx.Client(base_url=limited.url, timeout=120) as client:
            while not flooding.is_set():
                answer = client.post(
                    "/api/v1/forward_backward", content=bomb, headers={"X-API-Key": attacker, **PROTOBUF_ZSTD}
                )
                refusals.append((answer.status_code, answer.json()["error"]["code"]))

    try:
        victim.get("/api/v1/healthz")
        # One bomb alone, start to refusal: what a request waits at worst when the IO loop decodes bombs itself.
        began = time.monotonic()
        alone = victim.post(
            "/api/v1/forward_backward", content=bomb, headers={"X-API-Key": attacker, **PROTOBUF_ZSTD}
        )
        one_bomb = time.monotonic() - began
        assert alone.status_code == 400, alone.text
        threads = [threading.Thread(target=flood) for _ in range(2)]
        for thread in threads:
            thread.start()
        time.sleep(0.5)  # the bombs are being read
        during = healthz_latencies(victim, max(3.0, 4 * one_bomb))
        flooding.set()
        for thread in threads:
            thread.join(timeout=120)
    finally:
        flooding.set()
        victim.close()
    # The bombs were read to the end and refused for what they hold (no model id), each a clean 4xx.
    assert refusals and {status for status, _ in refusals} == {400}, refusals[:5]
    # Compared with the time one bomb takes, not with the clock: when the IO loop decoded bombs itself, a request
    # sent during the flood waited for the bomb being decoded (half of one bomb's time, typically, and often all of
    # it); decoded off the loop, a request waits for the loop's turn only.
    median = statistics.median(during)
    assert median < one_bomb / 4, (median, one_bomb, len(during))


def sessions_until_refused(api: httpx.Client, body: dict) -> tuple[list[str], httpx.Response | None]:
    """create_session until the backend refuses one (at most 100 tries)."""
    made = []
    for _ in range(100):
        answer = api.post("/create_session", json=body)
        if answer.status_code != 200:
            return made, answer
        made.append(answer.json()["session_id"])
    return made, None


def test_live_sessions_are_capped_per_owner_and_freed_when_they_expire(limited):
    key = create_token(limited.data_dir, "many-sessions", "jobs:read", "jobs:write", tinker=True)
    other = create_token(limited.data_dir, "one-session", "jobs:read", "jobs:write", tinker=True)
    api = httpx.Client(base_url=limited.url + "/api/v1", timeout=60, headers={"X-API-Key": key})
    metadata = {"notes": "x" * 16_000}
    try:
        too_big = api.post("/create_session", json={"user_metadata": {"notes": "x" * 64 * 1024}})
        assert too_big.status_code == 400 and too_big.json()["error"]["code"] == "invalid_field", too_big.text
        made, refused = sessions_until_refused(api, {"user_metadata": metadata})
        assert refused is not None, f"{len(made)} live sessions of one owner, none refused"
        assert refused.status_code == 400 and refused.headers["x-should-retry"] == "false"
        error = refused.json()["error"]
        assert error["code"] == "too_many_sessions" and error["detail"]["limit"] == len(made), error
        # Another owner is not counted against this one.
        assert (
            httpx.post(
                limited.url + "/api/v1/create_session", json={}, headers={"X-API-Key": other}, timeout=60
            ).status_code
            == 200
        )
        # Heartbeats stop: the sessions expire, their metadata goes, and there is room again.
        time.sleep(3.5)
        ended = api.get(f"/sessions/{made[-1]}").json()
        assert ended["user_metadata"] is None
        assert api.post("/session_heartbeat", json={"session_id": made[-1]}).status_code == 410
        assert api.post("/create_session", json={"user_metadata": metadata}).status_code == 200
    finally:
        api.close()


@NEEDS_SDK
def test_the_sdk_hears_the_session_cap_as_a_clear_refusal(limited):
    tinker = pytest.importorskip("tinker")

    key = create_token(limited.data_dir, "sdk-sessions", "jobs:read", "jobs:write", tinker=True)
    api = httpx.Client(base_url=limited.url + "/api/v1", timeout=60, headers={"X-API-Key": key})
    try:
        made, refused = sessions_until_refused(api, {})
        assert refused is not None, f"{len(made)} live sessions of one owner, none refused"
        client = tinker.ServiceClient(base_url=limited.url, api_key=key)
        started = time.monotonic()
        with pytest.raises(Exception) as caught:
            client.create_lora_training_client(base_model="tiny", rank=4)  # the session is made first
        assert "too_many_sessions" in str(caught.value), caught.value
        assert time.monotonic() - started < 30  # refused, not retried for minutes
    finally:
        api.close()


def test_one_owners_futures_never_evict_anothers():
    from cortex_backend.auth import Principal
    from cortex_backend.compat.tinker.futures import FUTURES_KEPT, Future, Futures

    futures = Futures()
    victim = Principal(token_id="t-victim", owner="victim", scopes=frozenset({"jobs:read"}))
    futures.add(Future("pending-result", "victim", "forward_backward", "job-v", "req-v"))
    for index in range(FUTURES_KEPT + 1000):
        futures.add(Future(f"flood-{index}", "flooder", "optim_step", "job-f", f"req-{index}"))
    assert futures.get(victim, "pending-result").request_id == "req-v"
    # The flooder's own cache stays bounded: its oldest futures went, its newest are there.
    assert futures.known("flood-999") is None and futures.known(f"flood-{FUTURES_KEPT + 999}") is not None
