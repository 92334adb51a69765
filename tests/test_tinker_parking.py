"""Devices are held by work, not by clients: an idle Tinker training client is parked (its state saved, its slot
freed) and its next request brings it back, through the published SDK against a real backend with 4 CPU slots.
Numerics are checked against a second backend that never parks."""

from __future__ import annotations

import time

import httpx
import numpy as np
import pytest

from .backend_process import start_backend
from .tinker_fixtures import NEEDS_SDK, TINKER_MODEL
from .tokens import create_token

pytestmark = NEEDS_SDK

PARK_IDLE_S = "1"
# Generous bounds on waits (never asserted as speed; bench/bench_tinker_parking.py measures that).
WAIT_S = 120.0


def backend_args(llama_dir, park_idle_s: str) -> list[str]:
    return [
        "--model",
        f"{TINKER_MODEL}={llama_dir}",
        "--devices",
        "cpu:4",
        "--worker-threads",
        "1",
        "--park-idle-s",
        park_idle_s,
    ]


@pytest.fixture(scope="module")
def parking_backend(tmp_path_factory, llama_dir):
    backend = start_backend(tmp_path_factory.mktemp("parking"), *backend_args(llama_dir, PARK_IDLE_S))
    yield backend
    backend.stop()


@pytest.fixture(scope="module")
def parking_key(parking_backend) -> str:
    return create_token(parking_backend.data_dir, "parking-user", "jobs:read", "jobs:write", tinker=True)


def admin_get(backend, path: str) -> dict:
    reply = httpx.get(backend.url + path, headers={"Authorization": f"Bearer {backend.token}"}, timeout=30)
    reply.raise_for_status()
    return reply.json()


def job_of(backend, training_client) -> dict:
    return admin_get(backend, "/v1/jobs/" + training_client.model_id.replace(":", "."))


def parking_of(backend, training_client) -> dict:
    return job_of(backend, training_client)["sub_jobs"][0]["info"].get("parking") or {}


def wait_until(condition, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"{what} did not happen within {WAIT_S:g} s"
        time.sleep(0.2)


def datum(offset: int):
    from tinker import types

    tokens = [(offset + 3 * i) % 50 + 4 for i in range(12)]
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)},
    )


def train_step(training_client, offset: int) -> tuple[float, np.ndarray]:
    """One forward_backward + optim_step; the loss and the per-token logprobs of the forward_backward."""
    from tinker import types

    result = training_client.forward_backward([datum(offset)], "cross_entropy").result()
    training_client.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    logprobs = np.asarray(result.loss_fn_outputs[0]["logprobs"].tolist(), dtype=np.float32)
    return result.metrics["loss:sum"], logprobs


def test_eight_training_clients_train_interleaved_on_four_slots(parking_backend, parking_key):
    import tinker

    service = tinker.ServiceClient(base_url=parking_backend.url, api_key=parking_key)
    try:
        clients = [
            service.create_lora_training_client(base_model=TINKER_MODEL, rank=4, seed=index)
            for index in range(8)
        ]
        losses: dict[int, list[float]] = {index: [] for index in range(8)}
        for round_ in range(2):
            for index, client in enumerate(clients):
                loss, _ = train_step(client, index + round_)
                losses[index].append(loss)
        assert all(len(series) == 2 and all(np.isfinite(series)) for series in losses.values())
        # Never more than the 4 slots in use, yet every client trained: some were parked and brought back.
        parks = [parking_of(parking_backend, client).get("parks", 0) for client in clients]
        assert sum(parks) >= 4, parks
        restored = [parking_of(parking_backend, client) for client in clients]
        assert any(view.get("last_restore_s") is not None for view in restored), restored
        assert admin_get(parking_backend, "/v1/capacity")["slots_total"] == 4
    finally:
        service.close("success").result()
    # The session ended: every job it made ends with it, parked ones at once, and every slot is free.
    wait_until(
        lambda: all(job_of(parking_backend, client)["status"] == "done" for client in clients),
        "every training client of the closed session ending",
    )
    wait_until(
        lambda: admin_get(parking_backend, "/v1/capacity")["slots_in_use"] == 0, "the slots being freed"
    )


def test_a_parked_clients_losses_equal_an_unparked_clients(parking_backend, parking_key, tmp_path, llama_dir):
    import tinker

    never_parks = start_backend(tmp_path / "never-parks", *backend_args(llama_dir, "0"))
    try:
        reference_key = create_token(
            never_parks.data_dir, "reference", "jobs:read", "jobs:write", tinker=True
        )
        reference_service = tinker.ServiceClient(base_url=never_parks.url, api_key=reference_key)
        reference = reference_service.create_lora_training_client(base_model=TINKER_MODEL, rank=4, seed=7)
        expected = [train_step(reference, offset) for offset in range(3)]
        assert parking_of(never_parks, reference) == {}
        reference_service.close("success").result()
    finally:
        never_parks.stop()

    service = tinker.ServiceClient(base_url=parking_backend.url, api_key=parking_key)
    try:
        client = service.create_lora_training_client(base_model=TINKER_MODEL, rank=4, seed=7)
        got = [train_step(client, 0)]
        wait_until(lambda: parking_of(parking_backend, client).get("parked"), "the idle client being parked")
        assert job_of(parking_backend, client)["status"] == "pending"
        got.append(train_step(client, 1))
        wait_until(lambda: parking_of(parking_backend, client).get("parks") == 2, "a second park")
        got.append(train_step(client, 2))
        view = parking_of(parking_backend, client)
        assert view["parked"] is False and view["last_restore_s"] > 0
        logs = admin_get(parking_backend, f"/v1/jobs/{job_of(parking_backend, client)['job_id']}/logs")
        assert any("restored from parking in" in line["line"] for line in logs["lines"]), logs
        # Its device-seconds count every span it held a slot, not only the one since its last restore.
        job = job_of(parking_backend, client)
        assert job["device_seconds"] > time.time() - job["started_at"] + 0.5, job
    finally:
        service.close("success").result()
    for (want_loss, want_logprobs), (loss, logprobs) in zip(expected, got, strict=True):
        assert loss == want_loss
        np.testing.assert_array_equal(logprobs, want_logprobs)


def test_a_client_that_never_closes_frees_its_slot_once_idle(parking_backend, parking_key):
    import tinker

    service = tinker.ServiceClient(base_url=parking_backend.url, api_key=parking_key)
    client = service.create_lora_training_client(base_model=TINKER_MODEL, rank=4, seed=1)
    train_step(client, 0)
    # No close(): the session stays live (its heartbeats go on), yet the idle client gives its slot back.
    wait_until(lambda: parking_of(parking_backend, client).get("parked"), "the idle client being parked")
    wait_until(
        lambda: admin_get(parking_backend, "/v1/capacity")["slots_available"] == 4,
        "every slot showing free",
    )
    assert job_of(parking_backend, client)["sub_jobs"][0]["device"] is None


def test_a_parked_client_whose_state_is_gone_ends_restore_failed(parking_backend, parking_key):
    import tinker

    service = tinker.ServiceClient(base_url=parking_backend.url, api_key=parking_key)
    try:
        client = service.create_lora_training_client(base_model=TINKER_MODEL, rank=4, seed=2)
        train_step(client, 0)
        wait_until(lambda: parking_of(parking_backend, client).get("parked"), "the idle client being parked")
        job_id = job_of(parking_backend, client)["job_id"]
        deleted = httpx.delete(
            f"{parking_backend.url}/v1/jobs/{job_id}/checkpoints/parked",
            headers={"Authorization": f"Bearer {parking_backend.token}"},
            timeout=30,
        )
        assert deleted.status_code == 200, deleted.text
        with pytest.raises(tinker.RequestFailedError, match="could not be brought back"):
            client.forward_backward([datum(1)], "cross_entropy").result()
        job = job_of(parking_backend, client)
        assert (job["status"], job["failure_code"]) == ("failed", "restore_failed")
        assert admin_get(parking_backend, "/v1/capacity")["slots_in_use"] == 0
    finally:
        service.close("success").result()
