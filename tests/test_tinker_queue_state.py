"""A training client that waits for a device: the SDK's retrieve_future answers carry `paused_capacity` with the
scheduler's own queue reason, and the SDK's own warning ("... is paused. Reason: ...") prints it. The SDK reports a
pause only after 15 minutes (its PAUSE_GRACE_PERIOD); the test sets that to 0 to see the warning now."""

from __future__ import annotations

import concurrent.futures
import logging
import time

import pytest

from .backend_process import start_backend
from .tinker_fixtures import NEEDS_SDK, TINKER_MODEL
from .tokens import create_token

pytestmark = NEEDS_SDK


@pytest.fixture
def one_slot_backend(tmp_path, llama_dir):
    backend = start_backend(
        tmp_path / "backend",
        "--model",
        f"{TINKER_MODEL}={llama_dir}",
        "--devices",
        "cpu:1",
        "--worker-threads",
        "1",
        "--warm-workers",
        "0",
        # The holder stays on its slot however long it idles: this test is about waiting, not parking.
        "--park-idle-s",
        "0",
    )
    yield backend
    backend.stop()


def test_a_waiting_client_hears_our_queue_reason_in_the_sdks_warning(one_slot_backend, monkeypatch, caplog):
    import tinker
    from tinker.lib import queue_state_logger

    monkeypatch.setattr(queue_state_logger, "PAUSE_GRACE_PERIOD", 0)
    key = create_token(one_slot_backend.data_dir, "queued-user", "jobs:read", "jobs:write", tinker=True)
    holder = tinker.ServiceClient(base_url=one_slot_backend.url, api_key=key)
    waiter = tinker.ServiceClient(base_url=one_slot_backend.url, api_key=key)
    with concurrent.futures.ThreadPoolExecutor(1) as pool, caplog.at_level(logging.WARNING):
        first = holder.create_lora_training_client(base_model=TINKER_MODEL, rank=4).result()
        second = pool.submit(
            lambda: waiter.create_lora_training_client(base_model=TINKER_MODEL, rank=4).result()
        )
        deadline = time.monotonic() + 120
        while not any("is paused" in record.getMessage() for record in caplog.records):
            assert time.monotonic() < deadline, "the SDK never reported the pause"
            assert not second.done(), "the second client came up on a one-slot backend"
            time.sleep(0.5)
        warning = next(record.getMessage() for record in caplog.records if "is paused" in record.getMessage())
        assert "Reason: job " in warning and "waiting for a cpu slot: 1/1 held by" in warning, warning
        # The holder's session ends; its job completes and frees the slot; the waiting client comes up.
        holder.close("success").result()
        assert second.result(timeout=120).model_id != first.model_id
        waiter.close("success").result()
