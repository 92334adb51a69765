"""generate and forward with a saved adapter: a checkpoint's (or none: the bare base model) instead of the live one,
on any sub-job of the same base model and LoRA shape. A checkpoint never changes, so this is a snapshot."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cortex_nb import Client
from cortex_nb.errors import BadRequestError, NotFoundError

from .reference import random_batch, reference_base, reference_logprobs
from .tokens import create_token

GREEDY = {"max_tokens": 12, "temperature": 0.0}
PROMPTS = [[256, 72, 105], [256, 49, 43, 50, 61]]


def _train(job, rng, steps: int) -> None:
    for _ in range(steps):
        job.forward_backward(random_batch(rng, 259, batch=2, length=12))
        job.step()


def test_sampling_a_saved_adapter_is_a_snapshot_on_any_sub_job_of_its_shape(client: Client, backend):
    rng = np.random.default_rng(3)
    trainer = client.create_training_job("tiny", lora={"r": 4}, optimizer={"lr": 5e-2}, seed=9)
    sampler = client.create_sampler("tiny", lora={"r": 4})
    other_shape = client.create_sampler("tiny", lora={"r": 8})
    try:
        _train(trainer, rng, 2)
        saved = trainer.save("snap", checkpoint_type="weights-only").result()
        assert saved["checkpoint_id"] == "snap"
        probe = random_batch(rng, 259, batch=2, length=10, pad_tail=False)
        at_save = trainer.forward(probe).result()["tensors"]["logprobs"]
        snapshot_tokens = (
            trainer.generate(PROMPTS, adapter={"checkpoint_id": "snap"}, **GREEDY).result().tokens
        )
        assert snapshot_tokens == trainer.generate(PROMPTS, **GREEDY).result().tokens

        _train(trainer, rng, 3)
        later = trainer.forward(probe).result()["tensors"]["logprobs"]
        assert np.abs(later - at_save).max() > 1e-3, "training on must have moved the live adapter"
        # The checkpoint still samples and scores as it did when saved, on the trainer and on another job.
        assert (
            trainer.generate(PROMPTS, adapter={"checkpoint_id": "snap"}, **GREEDY).result().tokens
            == snapshot_tokens
        )
        on_sampler = sampler.generate(
            PROMPTS, adapter={"job_id": trainer.job_id, "checkpoint_id": "snap"}, **GREEDY
        )
        assert on_sampler.result().tokens == snapshot_tokens
        scored = trainer.forward(probe, adapter={"checkpoint_id": "snap"}).result()["tensors"]["logprobs"]
        np.testing.assert_allclose(scored, at_save, rtol=0, atol=1e-6)
        # ...and the live adapter is back in place after each such request.
        np.testing.assert_allclose(
            trainer.forward(probe).result()["tensors"]["logprobs"], later, rtol=0, atol=1e-6
        )

        # "base": the model without any adapter, equal to transformers on the base model.
        base = trainer.forward(probe, adapter="base").result()["tensors"]["logprobs"]
        with torch.no_grad():
            expected = reference_logprobs(reference_base("tiny"), probe).numpy()
        np.testing.assert_allclose(base, expected, rtol=0, atol=1e-5)

        # Another owner never reaches this checkpoint; a checkpoint that does not exist is named.
        with Client(
            backend.url, create_token(backend.data_dir, "mallory", "jobs:read", "jobs:write")
        ) as mallory:
            own = mallory.create_sampler("tiny", lora={"r": 4})
            try:
                with pytest.raises(NotFoundError) as caught:
                    own.generate(
                        PROMPTS, adapter={"job_id": trainer.job_id, "checkpoint_id": "snap"}, **GREEDY
                    )
                assert caught.value.code == "checkpoint_not_found"
            finally:
                own.cancel()
        with pytest.raises(NotFoundError):
            trainer.generate(PROMPTS, adapter={"checkpoint_id": "nope"}, **GREEDY)
        # An adapter of another shape (rank 8 here) does not fit; a malformed selector is named.
        other_shape.wait_ready()
        with pytest.raises(BadRequestError) as caught:
            other_shape.generate(
                PROMPTS, adapter={"job_id": trainer.job_id, "checkpoint_id": "snap"}, **GREEDY
            )
        assert caught.value.code == "incompatible_adapter" and "r" in caught.value.detail
        with pytest.raises(BadRequestError) as caught:
            trainer.generate(PROMPTS, adapter={"step": 3}, **GREEDY)
        assert caught.value.code == "invalid_field" and caught.value.detail["field"] == "adapter"

        # forward with a loss reports what forward_backward would, without accumulating anything.
        batch = random_batch(rng, 259, batch=2, length=10)
        scored = trainer.forward(batch, loss_fn="cross_entropy").result()
        trained = trainer.forward_backward(batch).result()
        assert scored["loss"] == pytest.approx(trained["loss"], rel=1e-6)
        assert scored["metrics"]["loss:sum"] == pytest.approx(trained["metrics"]["loss:sum"], rel=1e-6)
        np.testing.assert_allclose(
            scored["tensors"]["logprobs"], trained["tensors"]["logprobs"], rtol=0, atol=1e-6
        )
    finally:
        trainer.cancel()
        sampler.cancel()
        other_shape.cancel()
