"""Optimizer moments in host memory between steps, for an adapter-host slot that fits a GPU only without them.

Which slot is offloaded is a decision on bytes (host_budget.py `admit_slot`), checked here with the device's
free memory given as numbers, as a GPU would report it. The moving itself (engine/optimizer_offload.py) is a
GPU's: on a CPU the moments are in host memory already and nothing moves, so here a trainer told to offload
only has to train exactly as one that is not; `scripts/gpu-check` compares the two on a GPU, bitwise, with
the device bytes each holds.
"""

from __future__ import annotations

import numpy as np
import torch
from cortex_backend.engine.adapter import adapter_parameters
from cortex_backend.engine.model_state import ModelState
from cortex_backend.engine.trainer import Trainer
from cortex_backend.host_budget import admit_slot, check_slot, offloaded_slot
from cortex_backend.models import ModelCatalog

from .reference import random_batch

MIB = 2**20
ADAPTER = 40 * MIB
BASE = 600 * MIB
TOTAL = 1000 * MIB  # a device of 1000 MiB: 5 % (50 MiB) kept free


def gpu_check(free: int, others: int = 0):
    """`check_slot` for a slot adding some bytes on a GPU with `free` bytes free, its adapter allocated."""

    def check(slot_bytes: int, reserve: int = 0):
        return check_slot(
            slot_bytes, ADAPTER, BASE + reserve, others, 1 if others else 0, None, (free, TOTAL)
        )

    return check


def test_an_offloaded_slot_adds_its_adapter_and_gradients_and_the_host_room_for_one_slots_moments():
    assert offloaded_slot(ADAPTER, 0) == (4 * ADAPTER, 2 * ADAPTER)  # the first one saves nothing yet
    assert offloaded_slot(ADAPTER, 2 * ADAPTER) == (2 * ADAPTER, 2 * ADAPTER)
    assert offloaded_slot(ADAPTER, 3 * ADAPTER) == (2 * ADAPTER, 3 * ADAPTER)


def test_a_trainer_that_fits_only_without_its_moments_is_offloaded_on_a_gpu():
    # 50 MiB reserve: 150 MiB free leaves 100 to allocate; a slot still needs 3x40 with its moments, 1x40 without.
    check = gpu_check(free=150 * MIB, others=200 * MIB)
    reserve = 2 * ADAPTER  # another slot's moments already have their room
    refusal, offload = admit_slot(lambda b: check(b, reserve), 4 * ADAPTER, ADAPTER, True, True, reserve)
    assert refusal is None and offload

    # With room for its moments it keeps them on the device.
    roomy = gpu_check(free=400 * MIB)
    assert admit_slot(roomy, 4 * ADAPTER, ADAPTER, True, True, 0) == (None, False)


def test_nothing_is_offloaded_where_it_cannot_help():
    check = gpu_check(free=150 * MIB, others=200 * MIB)
    # The first offloaded slot would need its moments' room all the same: it waits, as it would have.
    refusal, offload = admit_slot(check, 4 * ADAPTER, ADAPTER, True, True, 0)
    assert not offload and refusal is not None and refusal.fits_later
    # A sampler holds no moments; on a CPU (no device to spare) the moments are host memory already.
    reserve = 2 * ADAPTER
    assert admit_slot(lambda b: check(b, reserve), ADAPTER * 4, ADAPTER, False, True, reserve)[1] is False
    assert admit_slot(lambda b: check(b, reserve), ADAPTER * 4, ADAPTER, True, False, reserve)[1] is False


def test_a_slot_that_could_never_fit_with_its_moments_waits_when_it_could_fit_without_them():
    huge = 110 * MIB  # 4x = 440 MiB never fits beside the 600 MiB base in 950; 2x + a 2x reserve... waits

    def check(slot_bytes: int):
        return check_slot(slot_bytes, huge, BASE, 300 * MIB, 2, None, (60 * MIB, TOTAL))

    plain = check(4 * huge)
    assert plain is not None and not plain.fits_later
    refusal, offload = admit_slot(check, 4 * huge, huge, True, True, 2 * huge)
    assert not offload and refusal is not None and refusal.fits_later, refusal


def test_a_trainer_told_to_offload_trains_as_one_that_is_not():
    info = ModelCatalog({}).get("tiny")
    spec = {"lora": {"r": 8, "alpha": 16}, "seed": 5}
    plain, offloaded = (
        Trainer(ModelState(info, spec), {"lr": 1e-2}),
        Trainer(ModelState(info, spec), {"lr": 1e-2}),
    )
    offloaded.offload_optimizer()
    rng = np.random.default_rng(0)
    for _ in range(3):
        batch = random_batch(rng, 259, batch=2, length=12)
        losses = [
            trainer.forward_backward(batch, "cross_entropy", {})[0]["loss"] for trainer in (plain, offloaded)
        ]
        assert losses[0] == losses[1]
        assert plain.step()["grad_norm"] == offloaded.step()["grad_norm"]
    ours, theirs = adapter_parameters(offloaded.state.model), adapter_parameters(plain.state.model)
    assert all(torch.equal(ours[name], theirs[name]) for name in theirs)
    moments = sum(2 * p.numel() * p.element_size() for p in theirs.values())
    assert offloaded.offload.host_bytes() == moments
