"""Gradient checkpointing on a training sub-job: the same losses and gradients, recomputed activations."""

from __future__ import annotations

import pytest

from cortex_nb import BadRequestError, Client
from cortex_nb.train_spec import parse_train_spec

from .training_data import random_batches

TINY_VOCAB = 259


def test_checkpointed_training_equals_plain_training(client: Client):
    spec = {"lora": {"r": 8, "alpha": 16}, "optimizer": {"lr": 1e-2}, "seed": 4}
    batches = random_batches(3, TINY_VOCAB, rows=2, length=32, seed=2)
    with (
        client.create_training_job("tiny", **spec) as plain,
        client.create_training_job("tiny", gradient_checkpointing=True, **spec) as checkpointed,
    ):
        assert checkpointed.info["sub_jobs"][0]["info"]["gradient_checkpointing"] is True
        assert plain.info["sub_jobs"][0]["info"]["gradient_checkpointing"] is False
        for batch in batches:
            expected = plain.forward_backward(batch).result(), plain.step().result()
            got = checkpointed.forward_backward(batch).result(), checkpointed.step().result()
            assert got[0]["loss"] == pytest.approx(expected[0]["loss"], rel=1e-6)
            assert got[1]["grad_norm"] == pytest.approx(expected[1]["grad_norm"], rel=1e-5)


def test_gradient_checkpointing_is_a_training_setting(client: Client):
    with pytest.raises(BadRequestError) as refused:
        client.api.create_job([{"type": "sampling", "base_model": "tiny", "gradient_checkpointing": True}])
    assert "only a training sub-job" in str(refused.value)
    spec = parse_train_spec("data: rows.jsonl\nsteps: 3\ngradient_checkpointing: true\n")
    assert spec.sub_job()["gradient_checkpointing"] is True
    assert "gradient_checkpointing" not in parse_train_spec("data: rows.jsonl\nsteps: 3\n").sub_job()
