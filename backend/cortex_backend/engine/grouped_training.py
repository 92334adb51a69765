"""forward_backward of several adapter-host slots in one pass (slot_batching.py, `--batch-across-slots`).

The slots' batches (of one sequence length) are stacked and run through one forward of the driver slot's
module tree, each slot's rows through its own LoRA layers (grouped_lora.py); each slot's trainer then takes
the logits of its rows and computes its own loss as it does alone (its own loss function and config), and
one backward of the losses' sum gives each slot the gradients of its own loss: the slots' adapters are
distinct tensors and rows never mix (the base is frozen, so nothing of it accumulates a gradient). A NaN or a
failing loss in one slot stays in that slot's rows and result.

Only slots whose forward draws nothing at random group: LoRA dropout would draw the slots' masks from one
stream in another order than alone. Nor gradient checkpointing, sharded ranks or MoE route replays.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from .data_parallel import share_of
from .grouped_lora import SlotRows, grouped, lora_layers
from .memory import reset_peak
from .scoring import model_logits
from .trainer import Trainer

# The most tokens (rows x length, all slots together) one grouped pass takes: each slot's activations are
# held until the one backward, so a pass of many slots needs their memory at once.
TOKENS_PER_PASS = 16384


def trains_together(trainer: Trainer) -> bool:
    """Whether this slot's forward_backward may share a pass with other slots' (see the module docstring)."""
    if trainer.gradient_checkpointing:
        return False
    for layer in lora_layers(trainer.state.model.get_base_model()).values():
        for dropout in layer.lora_dropout.values():
            if not isinstance(dropout, torch.nn.Identity) and getattr(dropout, "p", 0.0) > 0:
                return False
    return True


Batch = tuple[Trainer, dict[str, np.ndarray], str, dict[str, Any]]  # trainer, tensors, loss_fn, its config


def forward_backward_together(
    driver: Trainer, batches: list[Batch]
) -> list[tuple[dict[str, Any], dict[str, np.ndarray]] | Exception]:
    """Each batch's forward_backward result (or the exception its loss raised), from one pass. If the pass
    itself fails (out of memory, say), every slot's gradients are put back as they were before it, so each
    request can run again alone."""
    before = [
        (parameter, None if parameter.grad is None else parameter.grad.clone())
        for trainer in {id(trainer): trainer for trainer, _, _, _ in batches}.values()
        for parameter in trainer.parameters
    ]
    try:
        return _together(driver, batches)
    except Exception:
        for parameter, grad in before:
            parameter.grad = grad
        raise


def _together(
    driver: Trainer, batches: list[Batch]
) -> list[tuple[dict[str, Any], dict[str, np.ndarray]] | Exception]:
    started = time.perf_counter()
    reset_peak(driver.state.device)
    rows = [tensors["input_ids"].shape[0] for _, tensors, _, _ in batches]
    stacked = {"input_ids": np.concatenate([tensors["input_ids"] for _, tensors, _, _ in batches])}
    if any("attention_mask" in tensors for _, tensors, _, _ in batches):
        stacked["attention_mask"] = np.concatenate(
            [
                tensors.get("attention_mask", np.ones_like(tensors["input_ids"]))
                for _, tensors, _, _ in batches
            ]
        )
    groups = [
        SlotRows(trainer.state.model.get_base_model(), count, count)
        for (trainer, _, _, _), count in zip(batches, rows, strict=True)
    ]
    with grouped(driver.state.model.get_base_model(), groups):
        logits = model_logits(driver.state, stacked)
    outcomes: list[Any] = []
    losses = []
    # split, not slices: one backward node for all the slots' logits (grouped_lora.py says why).
    for (trainer, tensors, loss_fn, config), rows_logits in zip(batches, logits.split(rows), strict=True):
        share = share_of(tensors)
        try:
            loss, logprobs, metrics = trainer.loss_of(
                rows_logits, share.local(tensors), share, loss_fn, config
            )
            losses.append(loss)
            outcomes.append((share, loss, logprobs, metrics))
        except Exception as exc:  # this slot's loss failed: the others still train
            outcomes.append(exc)
    # A slot whose loss failed is still in the pass's graph: its adapter would get zero gradients where,
    # alone, it got none. Put back what it had (accumulated gradients gain exactly zero).
    untouched = [
        parameter
        for (trainer, _, _, _), outcome in zip(batches, outcomes, strict=True)
        if isinstance(outcome, Exception)
        for parameter in trainer.parameters
        if parameter.grad is None
    ]
    if losses:
        sum(losses).backward()
    for parameter in untouched:
        parameter.grad = None
    results: list[tuple[dict[str, Any], dict[str, np.ndarray]] | Exception] = []
    for (trainer, tensors, loss_fn, _), outcome in zip(batches, outcomes, strict=True):
        if isinstance(outcome, Exception):
            results.append(outcome)
            continue
        share, loss, logprobs, metrics = outcome
        results.append(trainer.account(tensors, share, loss_fn, loss, logprobs, metrics, {}, None, started))
    return results
