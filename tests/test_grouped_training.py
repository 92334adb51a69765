"""forward_backward of several adapter-host slots in one pass (engine/grouped_training.py), in-process: each
slot (its own rank, alpha, targets and loss function) gets the loss, logprobs and gradients it gets alone to
float rounding, and steps to the same adapter; a NaN or a failing loss in one slot leaves the others as they
would be alone; a slot whose forward draws at random (LoRA dropout) never groups."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from cortex_backend.adapter_host import BaseModels
from cortex_backend.engine.adapter import adapter_parameters
from cortex_backend.engine.grouped_training import forward_backward_together, trains_together
from cortex_backend.engine.model_state import ModelState
from cortex_backend.engine.trainer import Trainer
from cortex_backend.models import ModelCatalog

from .reference import random_batch

VOCAB = 259
LENGTH = 14
# (rank, alpha, targets, learning rate, loss function)
SLOTS = [
    (4, 8, "all-linear", 2e-2, "cross_entropy"),
    (8, 16, ["q_proj", "v_proj"], 1e-2, "importance_sampling"),
    (2, 4, ["o_proj", "down_proj", "k_proj"], 5e-2, "cross_entropy"),
    (16, 8, "all-linear", 3e-2, "importance_sampling"),
]
TOLERANCE = {"rtol": 1e-5, "atol": 1e-6}


def trainers(bases: BaseModels) -> list[Trainer]:
    info = ModelCatalog({}).get("tiny")
    made = []
    for index, (r, alpha, targets, lr, _) in enumerate(SLOTS):
        spec = {"lora": {"r": r, "alpha": alpha, "target_modules": targets}, "seed": index}
        made.append(Trainer(ModelState(info, spec, base=bases.share(info)), {"lr": lr}))
    return made


def batch_of(index: int, loss_fn: str) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(40 + index)
    batch = random_batch(rng, VOCAB, batch=1 + index % 3, length=LENGTH)
    if loss_fn == "importance_sampling":
        batch["logprobs"] = rng.uniform(-6, -4, size=batch["weights"].shape).astype(np.float32)
        batch["advantages"] = rng.normal(size=batch["weights"].shape).astype(np.float32)
    return batch


def gradients(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {name: p.grad.clone() for name, p in adapter_parameters(trainer.state.model).items()}


def batches_for(group: list[Trainer]):
    return [
        (trainer, batch_of(index, slot[4]), slot[4], {})
        for index, (trainer, slot) in enumerate(zip(group, SLOTS, strict=True))
    ]


@pytest.fixture(scope="module")
def twins():
    """Two sets of the same four slots over one base: one trains each slot alone, the other in one pass."""
    bases = BaseModels()
    return trainers(bases), trainers(bases)


def test_four_slots_in_one_pass_equal_each_alone(twins):
    alone, together = twins
    for _ in range(2):
        expected = [t.forward_backward(tensors, fn, cfg) for t, tensors, fn, cfg in batches_for(alone)]
        got = forward_backward_together(together[0], batches_for(together))
        for (result, out), (mine, my_out), a, b in zip(expected, got, alone, together, strict=True):
            np.testing.assert_allclose(mine["loss"], result["loss"], **TOLERANCE)
            np.testing.assert_allclose(my_out["logprobs"], out["logprobs"], **TOLERANCE)
            assert mine["loss_fn"] == result["loss_fn"] and mine["accumulated_batches"] == 1
            grads, reference = gradients(b), gradients(a)
            assert grads.keys() == reference.keys() and len(grads) > 0
            for name in grads:
                torch.testing.assert_close(grads[name], reference[name], rtol=1e-4, atol=1e-7)
        for a, b in zip(alone, together, strict=True):
            a.step()
            b.step()
    for a, b in zip(alone, together, strict=True):
        for name, parameter in adapter_parameters(b.state.model).items():
            torch.testing.assert_close(
                parameter, adapter_parameters(a.state.model)[name], rtol=1e-4, atol=1e-6
            )


def test_a_nan_or_a_failing_loss_stays_in_its_slot():
    bases = BaseModels()
    alone, together = trainers(bases), trainers(bases)
    together[1].nan_loss = True
    batches = batches_for(together)
    trainer, tensors, _, _ = batches[2]
    batches[2] = (trainer, tensors, "ppo", {"clip_low_threshold": 0.8})  # no clip_high_threshold
    got = forward_backward_together(together[0], batches)
    assert np.isnan(got[1][0]["loss"])
    # Its own gradients are not finite (its step will refuse them), as they are when it runs alone.
    assert not all(torch.isfinite(g).all() for g in gradients(together[1]).values())
    assert isinstance(got[2], KeyError), got[2]  # its loss raised; the pass went on
    assert all(p.grad is None for p in adapter_parameters(together[2].state.model).values())
    for index in (0, 3):
        trainer, tensors, fn, cfg = batches_for(alone)[index]
        result, _ = trainer.forward_backward(tensors, fn, cfg)
        np.testing.assert_allclose(got[index][0]["loss"], result["loss"], **TOLERANCE)
        for name, grad in gradients(together[index]).items():
            torch.testing.assert_close(grad, gradients(alone[index])[name], rtol=1e-4, atol=1e-7)


def test_a_slot_with_lora_dropout_or_checkpointing_never_trains_in_a_shared_pass():
    info = ModelCatalog({}).get("tiny")
    bases = BaseModels()
    plain = Trainer(ModelState(info, {"lora": {"r": 4}}, base=bases.share(info)), {})
    dropout = Trainer(ModelState(info, {"lora": {"r": 4, "dropout": 0.1}}, base=bases.share(info)), {})
    checkpointed = Trainer(ModelState(info, {"lora": {"r": 4}}, base=bases.share(info)), {}, True)
    assert trains_together(plain)
    assert not trains_together(dropout) and not trains_together(checkpointed)


def test_a_failed_pass_leaves_every_slots_gradients_as_they_were():
    """A pass that fails as a whole in the middle of its backward (here a hook raising, as an allocation
    running out of memory would; gradients reached before it are already accumulated) raises with each
    slot's gradients as before it, so each request can run again alone."""
    bases = BaseModels()
    group = trainers(bases)
    batches = batches_for(group)
    trainer, tensors, fn, cfg = batches[0]
    trainer.forward_backward(tensors, fn, cfg)
    before = gradients(trainer)
    reached = []

    def out_of_memory(grad: torch.Tensor) -> None:
        reached.append(any(p.grad is not None for t in group[1:] for p in t.parameters))
        raise RuntimeError("CUDA out of memory (raised by the test)")

    # The first LoRA layer's A is among the last tensors backward reaches (the layers run in reverse).
    first_lora_a = next(p for name, p in adapter_parameters(group[3].state.model).items() if "lora_A" in name)
    first_lora_a.register_hook(out_of_memory)
    with pytest.raises(RuntimeError, match="out of memory"):
        forward_backward_together(group[0], batches)
    assert reached == [True]  # other slots' gradients had been accumulated when it failed
    after = gradients(trainer)
    assert all(torch.equal(after[name], before[name]) for name in before)
    for other in group[1:]:
        assert all(p.grad is None for p in adapter_parameters(other.state.model).values())
