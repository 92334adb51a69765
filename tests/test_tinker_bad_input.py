"""Bad input through the tinker SDK fails fast, with the SDK's own exception naming the problem. The SDK retries
408, 409, 429 and 5xx for minutes, so a user error must never be one of those: each case below is answered by
exactly one refused request (read from the backend's request counters), never retried. How long the SDK takes
to give up is measured in bench/bench_tinker.py, not asserted as a time here."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections import Counter
from contextlib import contextmanager

import httpx
import pytest

from .backend_process import start_backend
from .tinker_fixtures import NEEDS_SDK, TINKER_MODEL
from .tokens import create_token

pytestmark = NEEDS_SDK
RETRIED_BY_THE_SDK = {408, 409, 429} | set(range(500, 600))


def refusals(backend) -> Counter:
    """(route, status) -> count of the Tinker routes' 4xx/5xx answers so far (GET /metrics, admin token)."""
    text = httpx.get(
        backend.url + "/metrics", headers={"Authorization": f"Bearer {backend.token}"}, timeout=30
    ).text
    found = re.findall(
        r'^cortex_http_requests_total\{[^}]*route="(tinker:[^"]+)"[^}]*status="([45]\d\d)"[^}]*\} (\S+)$',
        text,
        re.M,
    )
    return Counter({(route, int(status)): int(float(count)) for route, status, count in found})


@contextmanager
def refused_once(backend, exception: type[BaseException], route: str, status: int, *words: str):
    """The call raises `exception` naming `words`, after one request to `route` answered `status`: no retry."""
    before = refusals(backend)
    with pytest.raises(exception) as caught:
        yield caught
    new = refusals(backend) - before
    assert new == Counter({(f"tinker:{route}", status): 1}), (
        f"expected one {status} from {route}, got {dict(new)}"
    )
    assert status not in RETRIED_BY_THE_SDK
    for word in words:
        assert word in str(caught.value), f"{word!r} not in {caught.value}"


def test_user_errors_fail_fast_and_name_the_problem(service_client, backend):
    import tinker
    from tinker import types

    with refused_once(
        backend, tinker.BadRequestError, "create_model", 400, "Qwen/Qwen3-Nope", "unknown_model", TINKER_MODEL
    ):
        service_client.create_lora_training_client(base_model="Qwen/Qwen3-Nope", rank=4).result()

    training = service_client.create_lora_training_client(base_model=TINKER_MODEL, rank=4).result()
    good = types.Datum(
        model_input=types.ModelInput.from_ints([5, 6, 7]),
        loss_fn_inputs={"target_tokens": [6, 7, 8], "weights": [1.0] * 3},
    )
    lengths_disagree = types.Datum(
        model_input=types.ModelInput.from_ints([5, 6, 7, 8, 9]),
        loss_fn_inputs={"target_tokens": [6, 7, 8, 9], "weights": [1.0] * 5},
    )
    with refused_once(
        backend,
        tinker.BadRequestError,
        "forward_backward",
        400,
        "data[1].loss_fn_inputs.target_tokens has 4 values",
        "has 5 tokens",
    ):
        training.forward_backward([good, lengths_disagree], "cross_entropy").result()
    with refused_once(
        backend,
        tinker.BadRequestError,
        "forward_backward",
        400,
        "'stable_reinforce' is not served",
        "not published",
        "ppo, cispo or gspo",
    ):
        training.forward_backward([good], "stable_reinforce").result()
    with refused_once(backend, tinker.BadRequestError, "forward_backward", 400, "token ids outside"):
        training.forward_backward(
            [
                types.Datum(
                    model_input=types.ModelInput.from_ints([5, 10**6]),
                    loss_fn_inputs={"target_tokens": [6, 7], "weights": [1.0, 1.0]},
                )
            ],
            "cross_entropy",
        ).result()
    # A refused request uses up its place in the model's order: the next one runs, and so does the step after it.
    result = training.forward_backward([good], "cross_entropy").result()
    assert result.metrics["loss:sum"] > 0
    training.optim_step(types.AdamParams(learning_rate=1e-3)).result()
    # A step with nothing to apply fails as the request it is, category User (the SDK does not retry it).
    with pytest.raises(tinker.RequestFailedError) as caught:
        training.optim_step(types.AdamParams(learning_rate=1e-3)).result()
    assert "no_gradients" in str(caught.value) and caught.value.category == types.RequestErrorCategory.User


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
    with refused_once(
        backend,
        tinker.NotFoundError,
        "create_sampling_session",
        404,
        "checkpoint_not_found",
        "sampler.theirs",
    ):
        service_client.create_sampling_client(model_path=sampler_path).result()
    with refused_once(backend, tinker.NotFoundError, "load_weights", 404, "checkpoint_not_found"):
        service_client.create_training_client_from_state(state_path).result()
    rest = tinker.RestClient(base_url=backend.url, api_key=tinker_key)
    with refused_once(backend, tinker.NotFoundError, "list_checkpoints", 404, "model_not_found"):
        rest.list_checkpoints(theirs.model_id).result()
    with refused_once(backend, tinker.NotFoundError, "delete_checkpoint", 404, "model_not_found"):
        rest.delete_checkpoint_from_tinker_path(sampler_path).result()
    with refused_once(backend, tinker.AuthenticationError, "client_config", 401, "unauthenticated"):
        tinker.ServiceClient(base_url=backend.url, api_key="tml-not-a-key").create_lora_training_client(
            base_model=TINKER_MODEL
        ).result()


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

    backend = start_backend(
        tmp_path / "backend",
        "--model",
        f"{TINKER_MODEL}={llama_dir}",
        "--devices",
        "cpu:2",
        "--warm-workers",
        "0",
        "--tinker-session-timeout",
        "2",
    )
    try:
        key = create_token(backend.data_dir, "expiring", "jobs:read", "jobs:write", tinker=True)
        # The process exits right after printing (no close): its heartbeat thread dies with it.
        printed = subprocess.run(
            [sys.executable, "-c", EXPIRING_CLIENT, backend.url, key, TINKER_MODEL],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        sampler = tinker.SamplingClient.from_sampler_handle(
            printed.stdout.strip().splitlines()[-1], api_key=key
        )
        time.sleep(3)
        with refused_once(
            backend,
            tinker.APIStatusError,
            "asample",
            410,
            "has ended",
            "expired: no heartbeat for 2 s",
            "ServiceClient",
        ):
            sampler.sample(
                types.ModelInput.from_ints([5, 6, 7]), 1, types.SamplingParams(max_tokens=2)
            ).result()
    finally:
        backend.stop()
