"""What the SDK reads back about a training client: get_weights_info names the LoRA targets it trains, and the
backend's own optim_step metrics carry a `cortex/` prefix, so a caller that merges them into its own metrics row
(every tinker-cookbook loop does) keeps its own `step` and `learning_rate` columns."""

from __future__ import annotations

import pytest

from .tinker_fixtures import NEEDS_SDK, TINKER_MODEL

pytestmark = [NEEDS_SDK, pytest.mark.filterwarnings("ignore:RestClient.search_sessions is experimental")]


def test_weights_info_names_the_trained_modules_and_step_metrics_are_prefixed(
    service_client, backend, tinker_key
):
    import tinker
    from tinker import types

    training = service_client.create_lora_training_client(
        base_model=TINKER_MODEL, rank=4, seed=0, train_mlp=False, train_attn=True, train_unembed=False
    ).result()
    datum = types.Datum(
        model_input=types.ModelInput.from_ints([5, 6, 7]),
        loss_fn_inputs={"target_tokens": [6, 7, 8], "weights": [1.0] * 3},
    )
    training.forward_backward([datum], "cross_entropy")
    stepped = training.optim_step(types.AdamParams(learning_rate=1e-3)).result()
    assert set(stepped.metrics) == {"cortex/step", "cortex/learning_rate", "cortex/grad_norm"}
    assert stepped.metrics["cortex/step"] == 1 and stepped.metrics["cortex/learning_rate"] == pytest.approx(
        1e-3
    )

    path = training.save_weights_for_sampler("flags").result().path
    rest = tinker.RestClient(base_url=backend.url, api_key=tinker_key)
    info = rest.get_weights_info_by_tinker_path(path).result()
    assert (info.train_attn, info.train_mlp, info.train_unembed) == (True, False, False)
    assert info.lora_rank == 4 and info.base_model == TINKER_MODEL

    # A sampler's handle (no credentials in it) makes a client for the same sampler in any process with a key.
    sampler = training.save_weights_and_get_sampling_client().result()
    clone = tinker.SamplingClient.from_sampler_handle(sampler.get_sampler_handle(), api_key=tinker_key)
    greedy = types.SamplingParams(max_tokens=6, temperature=0.0)
    prompt = types.ModelInput.from_ints([5, 6, 7, 8])
    assert (
        clone.sample(prompt, 1, greedy).result().sequences[0].tokens
        == sampler.sample(prompt, 1, greedy).result().sequences[0].tokens
    )

    # Storage usage: the bytes of this key's checkpoints, as listed one by one.
    usage = (
        tinker.AdminClient(base_url=backend.url, api_key=tinker_key)
        .get_current_checkpoint_storage_usage()
        .result()
    )
    listed = rest.list_user_checkpoints(limit=1000).result().checkpoints
    assert len(usage.data) == 1 and usage.data[0].checkpoint_count == len(listed)
    assert usage.data[0].size_bytes == sum(c.size_bytes for c in listed) > 0

    # Calls this backend does not serve are refused at once with their reason, never retried into a hang.
    with pytest.raises(tinker.BadRequestError, match="get_billing_usage is not offered"):
        tinker.AdminClient(base_url=backend.url, api_key=tinker_key).get_billing_usage(
            "2026-01-01", "2026-01-02"
        ).result()

    # A loss of the SDK's list this backend does not compute is refused at once, with the reason.
    with pytest.raises(tinker.BadRequestError, match="stable_reinforce.*not served"):
        training.forward_backward([datum], "stable_reinforce").result()
