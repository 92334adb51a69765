"""forward_backward + step over HTTP match the same peft model trained in-process (fp32, CPU)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cortex_nb import Client

from .reference import ReferenceTrainer, random_batch, reference_base, reference_logprobs, reference_lora

STEPS = 5
LR = 1e-2
TOLERANCE = 1e-5


@pytest.mark.parametrize("model", ["tiny", "small-gpt2"])
def test_lora_training_matches_in_process_reference(client: Client, gpt2_dir, model, tmp_path):
    vocab = next(m for m in client.list_models() if m["name"] == model)["vocab_size"]
    job = client.create_training_job(model, lora={"r": 8, "alpha": 16}, optimizer={"lr": LR}, seed=3)
    reference = ReferenceTrainer(
        reference_lora(reference_base(model, gpt2_dir), r=8, alpha=16, seed=3), lr=LR
    )
    rng = np.random.default_rng(11)
    try:
        for step in range(STEPS):
            batch = random_batch(rng, vocab, batch=3, length=24)
            remote = job.forward_backward(batch).result()
            remote_step = job.step().result()
            expected, expected_logprobs = reference.train_step(batch)
            assert remote["loss"] == pytest.approx(expected, rel=TOLERANCE, abs=TOLERANCE), f"step {step}"
            assert remote_step["step"] == step + 1
            assert np.isfinite(remote_step["grad_norm"]) and remote_step["grad_norm"] > 0
            # Per-token logprobs come back as a safetensors frame (not JSON floats) and match too.
            np.testing.assert_allclose(
                remote["tensors"]["logprobs"], expected_logprobs, rtol=0, atol=TOLERANCE
            )
        # After 5 steps the weights agree: per-token logprobs on a fresh batch match everywhere.
        probe = random_batch(rng, vocab, batch=2, length=16, pad_tail=False)
        remote_logprobs = job.forward(probe).result()["tensors"]["logprobs"]
        reference.model.eval()
        with torch.no_grad():
            expected_logprobs = reference_logprobs(reference.model, probe).numpy()
        np.testing.assert_allclose(remote_logprobs, expected_logprobs, rtol=0, atol=TOLERANCE)
        # And so do the adapter tensors themselves, exported as a PEFT adapter directory.
        from peft import get_peft_model_state_dict
        from safetensors.torch import load_file

        exported = load_file(str(job.export(tmp_path / "adapter") / "adapter_model.safetensors"))
        expected_adapter = get_peft_model_state_dict(reference.model)
        assert sorted(exported) == sorted(expected_adapter)
        for name, tensor in expected_adapter.items():
            torch.testing.assert_close(exported[name], tensor.detach(), rtol=0, atol=TOLERANCE, msg=name)
    finally:
        job.cancel()


def test_gradients_accumulate_until_step(client: Client):
    """Two forward_backward calls then one step equal one step on the concatenated batch (losses sum)."""
    rng = np.random.default_rng(5)
    first, second = (random_batch(rng, 259, batch=2, length=12, pad_tail=False) for _ in range(2))
    both = {name: np.concatenate([first[name], second[name]]) for name in first}
    split_job = client.create_training_job("tiny", optimizer={"lr": 1e-2}, seed=1)
    joined_job = client.create_training_job("tiny", optimizer={"lr": 1e-2}, seed=1)
    try:
        split_job.forward_backward(first)
        split_job.forward_backward(second)
        split_step = split_job.step().result()
        joined_step = joined_job.forward_backward(both), joined_job.step()
        joined = joined_step[1].result()
        assert split_step["batches"] == 2 and joined["batches"] == 1
        assert split_step["grad_norm"] == pytest.approx(joined["grad_norm"], rel=1e-5)
        probe = random_batch(rng, 259, batch=1, length=10, pad_tail=False)
        a = split_job.forward(probe).result()["tensors"]["logprobs"]
        b = joined_job.forward(probe).result()["tensors"]["logprobs"]
        np.testing.assert_allclose(a, b, atol=1e-5)
        # With weights, forward scores only the weighted positions and sums their NLL.
        weights = np.array([[1.0] * 4 + [0.0] * 6], np.float32)
        scored = split_job.forward({**probe, "weights": weights}).result()
        np.testing.assert_allclose(scored["tensors"]["logprobs"][0, :4], a[0, :4], atol=1e-6)
        assert (scored["tensors"]["logprobs"][0, 4:] == 0).all()
        assert (
            scored["loss:sum"] == pytest.approx(-float(a[0, :4].sum()), rel=1e-5)
            and scored["weights:sum"] == 4
        )
    finally:
        split_job.cancel()
        joined_job.cancel()


def test_per_step_adam_hyperparameters_match_torch_adamw(client: Client):
    """Every step may bring its own lr, betas, eps, weight decay and clip (the Tinker API sends them all each
    step): one optimizer state carries on, exactly as torch AdamW with its param groups changed between steps."""
    schedule = [
        {"learning_rate": 1e-2, "betas": (0.9, 0.95), "eps": 1e-12, "weight_decay": 0.0, "grad_clip": 0.0},
        {"learning_rate": 5e-3, "betas": (0.8, 0.99), "eps": 1e-8, "weight_decay": 0.1, "grad_clip": 0.5},
        {"learning_rate": 2e-2, "betas": (0.95, 0.9), "eps": 1e-6, "weight_decay": 0.01, "grad_clip": 0.0},
        {"learning_rate": 1e-3, "betas": (0.5, 0.999), "eps": 1e-10, "weight_decay": 0.0, "grad_clip": 0.05},
    ]
    job = client.create_training_job("tiny", lora={"r": 4, "alpha": 8}, optimizer={"lr": 1.0}, seed=4)
    reference = ReferenceTrainer(reference_lora(reference_base("tiny"), r=4, alpha=8, seed=4), lr=1.0)
    parameters = [p for p in reference.model.parameters() if p.requires_grad]
    rng = np.random.default_rng(21)
    try:
        for hyper in schedule:
            batch = random_batch(rng, 259, batch=2, length=16)
            job.forward_backward(batch)
            remote = job.step(**hyper).result()
            assert remote["learning_rate"] == pytest.approx(hyper["learning_rate"])
            logprobs = reference_logprobs(reference.model, batch)
            (-(torch.from_numpy(batch["weights"]) * logprobs).sum()).backward()
            norm = torch.nn.utils.get_total_norm([p.grad for p in parameters])
            if hyper["grad_clip"]:
                torch.nn.utils.clip_grad_norm_(parameters, hyper["grad_clip"])
            for group in reference.optimizer.param_groups:
                group.update(
                    lr=hyper["learning_rate"],
                    betas=hyper["betas"],
                    eps=hyper["eps"],
                    weight_decay=hyper["weight_decay"],
                )
            reference.optimizer.step()
            reference.optimizer.zero_grad()
            assert remote["grad_norm"] == pytest.approx(float(norm), rel=1e-5)
        probe = random_batch(rng, 259, batch=2, length=12, pad_tail=False)
        with torch.no_grad():
            expected = reference_logprobs(reference.model, probe).numpy()
        np.testing.assert_allclose(
            job.forward(probe).result()["tensors"]["logprobs"], expected, rtol=0, atol=TOLERANCE
        )
    finally:
        job.cancel()


def test_negative_cross_entropy_weights_are_accepted_and_flip_the_gradient(client: Client):
    """A client-side loss C trains through cross_entropy with weights = -dC/dlogprob (the Tinker SDK's
    forward_backward_custom): negative weights must be accepted, giving the negated loss and gradient. Here a batch
    and its negation accumulate to no gradient at all."""
    rng = np.random.default_rng(8)
    batch = random_batch(rng, 259, batch=2, length=10)
    negated = {**batch, "weights": -batch["weights"]}
    job = client.create_training_job("tiny", optimizer={"lr": 1e-2}, seed=2)
    try:
        positive = job.forward_backward(batch).result()
        negative = job.forward_backward(negated).result()
        assert positive["loss"] > 0 and negative["loss"] == pytest.approx(-positive["loss"], rel=1e-6)
        assert job.step().result()["grad_norm"] < 1e-4 * positive["loss"]
        one_sided = job.forward_backward(negated), job.step()
        assert one_sided[1].result()["grad_norm"] > 1e-2 * positive["loss"]
    finally:
        job.cancel()
