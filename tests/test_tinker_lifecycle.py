"""Checkpoint lifecycle through the published SDK and our own /v1: TTLs (on save and later) end in the backend's
expiry sweep, which deletes an expired checkpoint but never one a running job loaded or a live sampling client
samples; a published checkpoint is sampled by another owner's key, which can neither change nor delete it, and
unpublishing takes that back. One backend for the module, accepting TTLs of 1 s so expiry is seen now."""

from __future__ import annotations

import time

import httpx
import pytest

from .backend_process import start_backend
from .tinker_fixtures import NEEDS_SDK, TINKER_MODEL
from .tokens import create_token

pytestmark = NEEDS_SDK

WAIT_S = 60.0


@pytest.fixture(scope="module")
def lifecycle_backend(tmp_path_factory, llama_dir):
    backend = start_backend(
        tmp_path_factory.mktemp("lifecycle-backend"),
        "--model",
        f"{TINKER_MODEL}={llama_dir}",
        "--devices",
        "cpu:4",
        "--worker-threads",
        "1",
        "--checkpoint-min-ttl",
        "1",
    )
    yield backend
    backend.stop()


@pytest.fixture(scope="module")
def keys(lifecycle_backend) -> dict[str, str]:
    data_dir = lifecycle_backend.data_dir
    return {
        name: create_token(data_dir, name, "jobs:read", "jobs:write", tinker=True)
        for name in ("alice", "bob")
    }


@pytest.fixture
def clients(lifecycle_backend, keys):
    import tinker

    made = {
        name: tinker.ServiceClient(base_url=lifecycle_backend.url, api_key=key) for name, key in keys.items()
    }
    yield made
    for client in made.values():
        client.close("success").result()


def checkpoint_paths(rest, run_id: str) -> dict[str, object]:
    return {c.tinker_path: c for c in rest.list_checkpoints(run_id).result().checkpoints}


def wait_until_gone(rest, run_id: str, path: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while path in checkpoint_paths(rest, run_id):
        assert time.monotonic() < deadline, f"{path} never expired"
        time.sleep(0.25)


def test_expiry_deletes_an_expired_checkpoint_but_not_one_a_running_job_loaded(clients):
    import tinker

    alice = clients["alice"]
    rest = alice.create_rest_client()
    training = alice.create_lora_training_client(base_model=TINKER_MODEL, rank=4, seed=0).result()
    run_id = training.model_id
    doomed = training.save_weights_for_sampler("doomed", ttl_seconds=2).result().path
    loaded = training.save_state("loaded", ttl_seconds=2).result().path
    kept = training.save_state("kept", ttl_seconds=3600).result().path
    shortened = training.save_state("shortened").result().path
    listed = checkpoint_paths(rest, run_id)
    assert listed[doomed].expires_at is not None and listed[kept].expires_at is not None
    assert listed[shortened].expires_at is None
    rest.set_checkpoint_ttl_from_tinker_path(kept, None).result()  # never expires now
    rest.set_checkpoint_ttl_from_tinker_path(shortened, 1).result()  # expires in a second now
    assert checkpoint_paths(rest, run_id)[kept].expires_at is None

    # loaded into a running job (a second training client of this session): it stays past its expiry
    resumed = alice.create_training_client_from_state(loaded).result()
    assert resumed.get_info().model_data.model_name == TINKER_MODEL

    wait_until_gone(rest, run_id, doomed)
    wait_until_gone(rest, run_id, shortened)
    listed = checkpoint_paths(rest, run_id)
    assert loaded in listed and kept in listed
    with pytest.raises(tinker.NotFoundError):
        alice.create_sampling_client(model_path=doomed).result().sample(
            tinker.types.ModelInput.from_ints([1, 2, 3]), 1, tinker.types.SamplingParams(max_tokens=1)
        ).result()
    for bad in (0, 10 * 366 * 24 * 3600):
        with pytest.raises(tinker.BadRequestError, match="ttl_seconds"):
            rest.set_checkpoint_ttl_from_tinker_path(kept, bad).result()


def test_a_loaded_checkpoint_goes_once_its_job_ends(lifecycle_backend, keys):
    import tinker

    first = tinker.ServiceClient(base_url=lifecycle_backend.url, api_key=keys["alice"])
    rest = first.create_rest_client()
    training = first.create_lora_training_client(base_model=TINKER_MODEL, rank=4, seed=1).result()
    path = training.save_state("held", ttl_seconds=1).result().path
    second = tinker.ServiceClient(base_url=lifecycle_backend.url, api_key=keys["alice"])
    second.create_training_client_from_state(path).result()
    time.sleep(3)  # several sweeps past its expiry: held by the running job that loaded it
    assert path in checkpoint_paths(rest, training.model_id)
    second.close("success").result()  # its job completes; the next sweep deletes the checkpoint
    wait_until_gone(rest, training.model_id, path)
    first.close("success").result()


def test_a_published_checkpoint_is_sampled_by_another_owner_who_cannot_change_it(clients):
    import tinker
    from tinker import types

    alice, bob = clients["alice"], clients["bob"]
    alice_rest, bob_rest = alice.create_rest_client(), bob.create_rest_client()
    training = alice.create_lora_training_client(base_model=TINKER_MODEL, rank=4, seed=2).result()
    path = training.save_weights_for_sampler("shared").result().path
    prompt, greedy = (
        types.ModelInput.from_ints([5, 6, 7, 8]),
        types.SamplingParams(max_tokens=6, temperature=0),
    )

    with pytest.raises(tinker.NotFoundError):
        bob.create_sampling_client(model_path=path).result().sample(prompt, 1, greedy).result()
    alice_rest.publish_checkpoint_from_tinker_path(path).result()
    assert checkpoint_paths(alice_rest, training.model_id)[path].public
    with pytest.raises(tinker.BadRequestError, match="already public"):
        alice_rest.publish_checkpoint_from_tinker_path(path).result()

    own = (
        alice.create_sampling_client(model_path=path).result().sample(prompt, 1, greedy).result().sequences[0]
    )
    bobs_sampler = bob.create_sampling_client(model_path=path).result()
    theirs = bobs_sampler.sample(prompt, 1, greedy).result().sequences[0]
    assert theirs.tokens == own.tokens
    assert theirs.logprobs == pytest.approx(own.logprobs, abs=1e-5)
    info = bob_rest.get_weights_info_by_tinker_path(path).result()
    assert info.lora_rank == 4

    for change in (
        lambda: bob_rest.delete_checkpoint_from_tinker_path(path).result(),
        lambda: bob_rest.unpublish_checkpoint_from_tinker_path(path).result(),
        lambda: bob_rest.set_checkpoint_ttl_from_tinker_path(path, 3600).result(),
    ):
        with pytest.raises(tinker.NotFoundError):
            change()

    # bob keeps a copy of his own (in a run of his that cannot be trained on); it outlives the original
    copy = bob_rest.copy_weights(path, "archive", ttl_seconds=7200).result()
    assert copy != path and copy.endswith("/sampler_weights/shared")
    copy_run = copy.removeprefix("tinker://").split("/")[0]
    assert checkpoint_paths(bob_rest, copy_run)[copy].expires_at is not None
    with pytest.raises(tinker.NotFoundError):  # not alice's to see
        alice_rest.list_checkpoints(copy_run).result()

    alice_rest.unpublish_checkpoint_from_tinker_path(path).result()
    assert not checkpoint_paths(alice_rest, training.model_id)[path].public
    with pytest.raises(tinker.BadRequestError, match="already private"):
        alice_rest.unpublish_checkpoint_from_tinker_path(path).result()
    with pytest.raises(tinker.NotFoundError):  # the sampling client bob made before is refused too
        bobs_sampler.sample(prompt, 1, greedy).result()
    with pytest.raises(tinker.NotFoundError):
        bob.create_sampling_client(model_path=path).result().sample(prompt, 1, greedy).result()
    alice_rest.delete_checkpoint_from_tinker_path(path).result()
    from_copy = bob.create_sampling_client(model_path=copy).result().sample(prompt, 1, greedy).result()
    assert from_copy.sequences[0].tokens == own.tokens


def test_our_own_api_sets_ttls_and_publishes(lifecycle_backend, keys):
    url = lifecycle_backend.url
    alice = {"Authorization": f"Bearer {keys['alice']}"}
    bob = {"Authorization": f"Bearer {keys['bob']}"}
    with httpx.Client(base_url=url, timeout=60) as http:
        job = http.post(
            "/v1/jobs",
            headers=alice,
            json={"sub_jobs": [{"type": "training", "base_model": "tiny", "lora": {"r": 2}}]},
        ).json()
        saved = http.post(
            f"/v1/jobs/{job['job_id']}/save",
            headers=alice,
            json={"checkpoint_id": "mine", "ttl_seconds": 7200},
        )
        assert saved.status_code == 202, saved.text
        request = f"/v1/jobs/{job['job_id']}/requests/{saved.json()['request_id']}"
        deadline = time.monotonic() + WAIT_S
        while (status := http.get(request, headers=alice).json())["status"] not in ("succeeded", "failed"):
            assert time.monotonic() < deadline
            time.sleep(0.2)
        assert status["status"] == "succeeded", status
        checkpoint = f"/v1/jobs/{job['job_id']}/checkpoints/mine"
        view = http.get(checkpoint, headers=alice).json()
        assert 7100 < view["expires_at"] - view["created_at"] <= 7200 and view["public"] is False

        cleared = http.patch(checkpoint, headers=alice, json={"ttl_seconds": None, "public": True})
        assert cleared.status_code == 200, cleared.text
        assert cleared.json()["expires_at"] is None and cleared.json()["public"] is True
        again = http.patch(checkpoint, headers=alice, json={"public": True})
        assert (
            again.status_code == 409 and again.json()["error"]["code"] == "checkpoint_publication_unchanged"
        )
        short = http.patch(checkpoint, headers=alice, json={"ttl_seconds": 0})
        assert short.status_code == 400 and short.json()["error"]["code"] == "invalid_field"
        assert http.patch(checkpoint, headers=bob, json={"public": False}).status_code == 404
        assert http.delete(checkpoint, headers=bob).status_code == 404
        # bob copies the published checkpoint into a job of his: the same files, hard-linked, no bytes doubled
        copied = http.post(f"{checkpoint}/copy", headers=bob, json={"ttl_seconds": 3600})
        assert copied.status_code == 201, copied.text
        copy = copied.json()
        assert copy["job_id"] != job["job_id"] and copy["checkpoint_id"] == "mine" and copy["public"] is False
        assert copy["state_hash"] == view["state_hash"] and copy["expires_at"] is not None
        copy_job = http.get(f"/v1/jobs/{copy['job_id']}", headers=bob).json()
        assert copy_job["status"] == "done"
        refused = http.post(f"/v1/jobs/{copy['job_id']}/step", headers=bob, json={})
        assert refused.status_code == 409 and refused.json()["error"]["code"] == "job_finished"
        files = lifecycle_backend.data_dir / "checkpoints"
        original = next(files.glob(f"*/{job['job_id']}/mine/adapter_model.safetensors"))
        duplicate = next(files.glob(f"*/{copy['job_id']}/mine/adapter_model.safetensors"))
        assert original.stat().st_ino == duplicate.stat().st_ino
        http.patch(checkpoint, headers=alice, json={"public": False})
        assert http.post(f"{checkpoint}/copy", headers=bob, json={}).status_code == 404
        http.post(f"/v1/jobs/{job['job_id']}/cancel", headers=alice)


def test_the_kernel_client_sets_ttls_publishes_copies_and_shows_them(lifecycle_backend, keys):
    from cortex_nb import Client
    from cortex_nb.training import TrainingJob

    with (
        Client(lifecycle_backend.url, keys["alice"]) as alice,
        Client(lifecycle_backend.url, keys["bob"]) as bob,
    ):
        job = TrainingJob.create(alice, "tiny", lora={"r": 2})
        alice.poll_request(job.job_id, alice.save(job.job_id, "kept", ttl_seconds=5000), timeout_s=120)
        assert alice.get_checkpoint(job.job_id, "kept")["expires_at"] is not None
        assert alice.set_checkpoint_ttl(job.job_id, "kept", None)["expires_at"] is None
        assert alice.publish_checkpoint(job.job_id, "kept")["public"] is True
        copy = bob.copy_checkpoint(job.job_id, "kept", ttl_seconds=3600)
        table = TrainingJob(bob, bob.get_job(copy["job_id"])).checkpoints()
        assert list(table["checkpoint_id"]) == ["kept"] and table["expires_at"].notna().all()
        assert list(job.checkpoints()["public"]) == [True]
        alice.cancel_job(job.job_id)
