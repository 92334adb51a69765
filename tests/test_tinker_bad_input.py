"""Bad input through the tinker SDK fails fast, with the SDK's own exception naming the problem: the SDK retries
408, 409, 429 and 5xx for minutes, so a user error must never be one of those."""

from __future__ import annotations

import subprocess
import sys
import time
from contextlib import contextmanager

import pytest

from .backend_process import start_backend
from .tinker_fixtures import NEEDS_SDK, TINKER_MODEL
from .tokens import create_token

pytestmark = NEEDS_SDK

# "A user error must not be retried for more than a couple of seconds."
GIVES_UP_WITHIN_S = 3.0


@contextmanager
def fails_fast(exception: type[BaseException], *words: str):
    started = time.monotonic()
    with pytest.raises(exception) as caught:
        yield caught
    elapsed = time.monotonic() - started
    message = str(caught.value)
    assert elapsed < GIVES_UP_WITHIN_S, f"the SDK took {elapsed:.1f}s to give up on: {message}"
    for word in words:
        assert word in message, f"{word!r} not in {message!r}"


def test_user_errors_fail_fast_and_name_the_problem(service_client, backend):
    import tinker
    from tinker import types

    with fails_fast(tinker.BadRequestError, "Qwen/Qwen3-Nope", "unknown_model", TINKER_MODEL):
        service_client.create_lora_training_client(base_model="Qwen/Qwen3-Nope", rank=4).result()

    training = service_client.create_lora_training_client(base_model=TINKER_MODEL, rank=4).result()
    good = types.Datum(model_input=types.ModelInput.from_ints([5, 6, 7]), loss_fn_inputs={"target_tokens": [6, 7, 8], "weights": [1.0] * 3})
    lengths_disagree = types.Datum(model_input=types.ModelInput.from_ints([5, 6, 7, 8, 9]),
                                   loss_fn_inputs={"target_tokens": [6, 7, 8, 9], "weights": [1.0] * 5})
    with fails_fast(tinker.BadRequestError, "data[1].loss_fn_inputs.target_tokens has 4 values", "has 5 tokens"):
        training.forward_backward([good, lengths_disagree], "cross_entropy").result()
    with fails_fast(tinker.BadRequestError, "'cispo' is not supported", "cross_entropy", "importance_sampling", "ppo"):
        training.forward_backward([good], "cispo").result()
    with fails_fast(tinker.BadRequestError, "token ids outside"):
        training.forward_backward([types.Datum(model_input=types.ModelInput.from_ints([5, 10**6]),
                                               loss_fn_inputs={"target_tokens": [6, 7], "weights": [1.0, 1.0]})], "cross_entropy").result()
    # A refused request uses up its place in the model's order: the next one runs, and so does the step after it.
    result = training.forward_backward([good], "cross_entropy").result()
    assert result.metrics["loss:sum"] > 0
    training.optim_step(types.AdamParams(learning_rate=1e-3)).result()
    # A step with nothing to apply fails as the request it is, category User.
    with fails_fast(tinker.RequestFailedError, "no_gradients") as caught:
        training.optim_step(types.AdamParams(learning_rate=1e-3)).result()
    assert caught.value.category == types.RequestErrorCategory.User


def test_another_owners_paths_are_not_found(service_client, backend, tinker_key):
    import tinker

    other_key = create_token(backend.data_dir, "tinker-other", "jobs:read", "jobs:write", tinker=True)
    other = tinker.ServiceClient(base_url=backend.url, api_key=other_key)
    try:
        theirs = other.create_lora_training_client(base_model=TINKER_MODEL, rank=4).result()
        sampler_path = theirs.save_weights_for_sampler("theirs").result().path
        state_path = theirs.save_state("theirs").result().path
    finally:
        other.close("success").result()
    with fails_fast(tinker.NotFoundError, "checkpoint_not_found", "sampler.theirs"):
        service_client.create_sampling_client(model_path=sampler_path).result()
    with fails_fast(tinker.NotFoundError, "checkpoint_not_found"):
        service_client.create_training_client_from_state(state_path).result()
    rest = tinker.RestClient(base_url=backend.url, api_key=tinker_key)
    with fails_fast(tinker.NotFoundError, "model_not_found"):
        rest.list_checkpoints(theirs.model_id).result()
    with fails_fast(tinker.NotFoundError):
        rest.delete_checkpoint_from_tinker_path(sampler_path).result()
    with fails_fast(tinker.AuthenticationError, "unauthenticated"):
        tinker.ServiceClient(base_url=backend.url, api_key="tml-not-a-key").create_lora_training_client(base_model=TINKER_MODEL).result()


EXPIRING_CLIENT = """
import sys, tinker
client = tinker.ServiceClient(base_url=sys.argv[1], api_key=sys.argv[2])
sampler = client.create_sampling_client(base_model=sys.argv[3]).result()
print(sampler.get_sampler_handle(), flush=True)
"""


def test_a_session_whose_process_died_expires(tmp_path, llama_dir):
    """The SDK process dies without closing its session: once its heartbeats are overdue, the session has ended,
    and a client still holding its sampler (here, through a handle) is told so at once."""
    import tinker
    from tinker import types

    backend = start_backend(tmp_path / "backend", "--model", f"{TINKER_MODEL}={llama_dir}", "--devices", "cpu:2",
                            "--warm-workers", "0", "--tinker-session-timeout", "2")
    try:
        key = create_token(backend.data_dir, "expiring", "jobs:read", "jobs:write", tinker=True)
        # The process exits right after printing (no close): its heartbeat thread dies with it.
        printed = subprocess.run([sys.executable, "-c", EXPIRING_CLIENT, backend.url, key, TINKER_MODEL],
                                 capture_output=True, text=True, timeout=120, check=True)
        sampler = tinker.SamplingClient.from_sampler_handle(printed.stdout.strip().splitlines()[-1], api_key=key)
        time.sleep(3)
        with fails_fast(tinker.APIStatusError, "has ended", "expired: no heartbeat for 2 s", "ServiceClient") as caught:
            sampler.sample(types.ModelInput.from_ints([5, 6, 7]), 1, types.SamplingParams(max_tokens=2)).result()
        assert caught.value.status_code == 410
    finally:
        backend.stop()
