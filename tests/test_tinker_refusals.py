"""A refused numbered request of a training client uses up its seq_id: the SDK numbers every request, and the
backend runs them in number order, so a refusal that kept its number would hold every later request forever
(the SDK would print "Retrying ... try_again" without end). Each refusal here is followed by a request that
must finish."""

from __future__ import annotations

import pytest

from .tinker_fixtures import NEEDS_SDK, TINKER_MODEL

pytestmark = [NEEDS_SDK, pytest.mark.filterwarnings("ignore:DEPRECATED:FutureWarning")]
# Long enough for a CPU step on a loaded machine; a wedged client never answers at all.
ANSWER_S = 120


def test_refused_load_state_leaves_the_next_request_running(service_client):
    import tinker
    from tinker import types

    training = service_client.create_lora_training_client(base_model=TINKER_MODEL, rank=4, seed=0).result()
    datum = types.Datum(
        model_input=types.ModelInput.from_ints([5, 6, 7]),
        loss_fn_inputs={"target_tokens": [6, 7, 8], "weights": [1.0] * 3},
    )
    sampler_path = training.save_weights_for_sampler("for-sampling").result().path
    model_id = training.model_id

    # a sampler-only checkpoint asked for its optimizer
    with pytest.raises(tinker.BadRequestError, match="holds no optimizer state"):
        training.load_state_with_optimizer(sampler_path).result()
    # a path that names no checkpoint
    with pytest.raises(tinker.NotFoundError):
        training.load_state(f"tinker://{model_id}/weights/never-saved").result()
    # a path that is no tinker path at all
    with pytest.raises(tinker.BadRequestError):
        training.load_state("s3://elsewhere/weights/x").result()

    forward_backward = training.forward_backward([datum], "cross_entropy")
    step = training.optim_step(types.AdamParams(learning_rate=1e-3))
    assert forward_backward.result(timeout=ANSWER_S).metrics["loss:sum"] > 0
    step.result(timeout=ANSWER_S)

    # the same for the other numbered calls: a refused optim_step, forward_backward and save
    with pytest.raises(tinker.BadRequestError):
        training.forward_backward([datum], "no_such_loss").result()
    with pytest.raises(tinker.BadRequestError):
        training.save_state("bad/name").result()
    # the weights-only load the refusals above never reached still runs, then training goes on
    training.load_state(sampler_path).result(timeout=ANSWER_S)
    assert training.forward([datum], "cross_entropy").result(timeout=ANSWER_S).loss_fn_outputs
