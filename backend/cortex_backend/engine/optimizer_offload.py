"""Optimizer moments kept in host memory between steps, on the device only while a step runs.

AdamW's two moments are twice a LoRA adapter's bytes. On an adapter host the slots take turns, so only
the slot stepping needs its moments on the device: with the others' in host memory, the device holds the
base, each slot's adapter and gradients, and one slot's moments at a time. The step itself runs on the
device with the same kernels (the moments only change where they are stored between steps), so an
offloaded slot trains exactly as one that is not. Host copies are pinned where CUDA can pin them.

The adapter host turns this on for a slot that would not fit in device memory with its moments and fits
without them (adapter_host.py, host_budget.py `offload_fits`). On a CPU the moments are in host memory
already, and nothing is moved.
"""

from __future__ import annotations

import torch

# AdamW's per-parameter tensors that scale with the adapter (its `step` counter stays where it is).
MOMENTS = ("exp_avg", "exp_avg_sq")


class MomentOffload:
    def __init__(self, optimizer: torch.optim.Optimizer, device: torch.device) -> None:
        self.optimizer = optimizer
        self.device = device
        self.pin = device.type == "cuda" and torch.cuda.is_available()

    def to_device(self) -> None:
        """Before a step: each moment back beside its parameter."""
        for parameter, state in self.optimizer.state.items():
            for key in MOMENTS:
                value = state.get(key)
                if isinstance(value, torch.Tensor) and value.device != parameter.device:
                    state[key] = value.to(parameter.device, non_blocking=self.pin)

    def to_host(self) -> None:
        """After a step (or a checkpoint's load): each moment into host memory, its device copy freed."""
        for state in self.optimizer.state.values():
            for key in MOMENTS:
                value = state.get(key)
                if isinstance(value, torch.Tensor) and value.device.type != "cpu":
                    host = torch.empty(value.shape, dtype=value.dtype, pin_memory=self.pin)
                    host.copy_(value)
                    state[key] = host

    def host_bytes(self) -> int:
        """Bytes of moments now held in host memory."""
        return sum(
            value.numel() * value.element_size()
            for state in self.optimizer.state.values()
            for key in MOMENTS
            if isinstance(value := state.get(key), torch.Tensor) and value.device.type == "cpu"
        )
