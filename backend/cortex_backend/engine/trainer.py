"""forward_backward and step: gradients accumulate across forward_backward calls until `step`."""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
import torch

from .data_parallel import Share, rank_memory, rank_shares, share_of
from .errors import OperationError
from .losses import compute_loss, target_logprobs
from .memory import peak_memory, reset_peak
from .model_state import ModelState
from .optimizer_offload import MomentOffload
from .router_replay import recording_experts, replaying_experts, routed_experts
from .scoring import model_logits
from .sharding import full, is_sharded


def set_training_mode(model: torch.nn.Module) -> None:
    """Base-model dropout off, LoRA dropout (the sub-job's `lora.dropout`) on.

    A pretrained model's own dropout (GPT-2 ships 0.1) would make every step random and differ from
    run to run; fine-tuning regularisation is the adapter's dropout, which the user sets.
    """
    model.eval()
    for name, module in model.named_modules():
        if name.endswith("lora_dropout") or ".lora_dropout." in name:
            module.train()


DEFAULT_OPTIMIZER: dict[str, Any] = {
    "lr": 1e-4,
    "betas": (0.9, 0.999),
    "eps": 1e-8,
    "weight_decay": 0.0,
    "grad_clip": None,
}


class Trainer:
    def __init__(
        self, state: ModelState, optimizer_spec: dict[str, Any] | None, gradient_checkpointing: bool = False
    ) -> None:
        self.state = state
        self.gradient_checkpointing = gradient_checkpointing
        if gradient_checkpointing:
            # Non-reentrant: it needs no input that requires grad (the embeddings are frozen under LoRA) and
            # recomputes with the same RNG, so gradients equal those of the plain backward pass.
            state.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.settings = {**DEFAULT_OPTIMIZER, **(optimizer_spec or {})}
        self.parameters = [p for p in state.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            self.parameters,
            lr=float(self.settings["lr"]),
            betas=tuple(float(b) for b in self.settings["betas"]),
            eps=float(self.settings["eps"]),
            weight_decay=float(self.settings["weight_decay"]),
        )
        # Set by an adapter host for a slot that fits in device memory only without its moments.
        self.offload: MomentOffload | None = None
        self.step_count = 0
        self.pending_batches = 0
        self.pending_tokens = 0
        # Test-only fault `nan_loss` (faults.py): every loss is NaN, as a bad batch makes it.
        self.nan_loss = False
        # The sampler-vs-trainer gap over this step's batches so far: (sum, max, sampled tokens).
        self.pending_mismatch = (0.0, 0.0, 0)
        set_training_mode(state.model)

    def offload_optimizer(self) -> None:
        """Keep the optimizer's moments in host memory between steps (engine/optimizer_offload.py)."""
        if self.offload is None:
            self.offload = MomentOffload(self.optimizer, self.state.device)
            self.offload.to_host()

    def forward_backward(
        self,
        tensors: dict[str, np.ndarray],
        loss_fn: str,
        loss_fn_config: dict[str, Any],
        replay: np.ndarray | None = None,
        record_routes: bool = False,
    ) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """One batch's loss and gradients. `replay`: an MoE base's routers use these recorded experts
        (engine/router_replay.py), backward included; `record_routes`: return the experts the forward used."""
        started = time.perf_counter()
        reset_peak(self.state.device)
        model = self.state.model
        share = share_of(tensors)
        local = share.local(tensors)
        with replaying_experts(model, share.local_replay(replay)):
            with recording_experts(model, record_routes) as calls:
                logits = model_logits(self.state, local)
            loss, logprobs, metrics = self.loss_of(logits, local, share, loss_fn, loss_fn_config)
            (loss * share.gradient_scale if share.split else loss).backward()
        routed = routed_experts(calls)
        if share.split:
            logprobs, routed, loss, metrics = self._whole_batch(
                share, tensors, logprobs, routed, loss_fn, loss_fn_config
            )
        return self.account(tensors, share, loss_fn, loss, logprobs, metrics, routed, replay, started)

    def loss_of(
        self,
        logits: torch.Tensor,
        local: dict[str, np.ndarray],
        share: Share,
        loss_fn: str,
        loss_fn_config: dict[str, Any],
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
        """This rank's loss (not yet backpropagated), target logprobs and metrics from its rows' logits."""
        targets = self.state.as_tensor(local["target_tokens"], torch.long)
        logprobs = target_logprobs(logits, targets)
        loss_inputs = {name: self.state.as_tensor(value) for name, value in local.items()}
        failure = None
        loss, metrics = None, {}
        if share.empty:  # a stand-in pass: it joins every collective and adds no gradient
            loss = logits.float().sum() * 0.0
        else:
            try:
                loss, metrics = compute_loss(loss_fn, logprobs, loss_inputs, loss_fn_config)
            except Exception as exc:  # a custom loss can fail on one rank's datums only
                failure = exc
        share.agree(failure, self.state.device)
        if self.nan_loss:
            loss = loss * float("nan")
        return loss, logprobs, metrics

    def account(
        self,
        tensors: dict[str, np.ndarray],
        share: Share,
        loss_fn: str,
        loss: torch.Tensor,
        logprobs: torch.Tensor,
        metrics: dict[str, float],
        routed: dict[str, np.ndarray],
        replay: np.ndarray | None,
        started: float,
    ) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """A backpropagated batch counted towards the next step, and its result."""
        elapsed = time.perf_counter() - started
        tokens = int(np.prod(tensors["input_ids"].shape))
        self.pending_batches += 1
        self.pending_tokens += tokens
        counted = int(metrics.get("sampler_mismatch_tokens:sum", 0))
        if counted:
            total, largest, seen = self.pending_mismatch
            self.pending_mismatch = (
                total + metrics["sampler_mismatch:mean"] * counted,
                max(largest, metrics["sampler_mismatch:max"]),
                seen + counted,
            )
        result = {
            "loss": float(loss.item()),
            "loss_fn": loss_fn,
            "metrics": {**metrics, "tokens:sum": tokens},
            "tokens_per_second": tokens / elapsed if elapsed > 0 else None,
            "accumulated_batches": self.pending_batches,
            **peak_memory(self.state.device),
        }
        if share.split:
            result["ranks"] = rank_shares(share, tensors, self.state.device)
        if replay is not None:
            result["router_replay"] = {"layers": int(replay.shape[0]), "rows": int(replay.shape[1])}
        return result, {"logprobs": logprobs.detach().float().cpu().numpy(), **routed}

    def _whole_batch(
        self,
        share: Share,
        tensors: dict[str, np.ndarray],
        logprobs: torch.Tensor,
        routed: dict[str, np.ndarray],
        loss_fn: str,
        loss_fn_config: dict[str, Any],
    ) -> tuple[torch.Tensor, dict[str, np.ndarray], torch.Tensor, dict[str, float]]:
        """The whole batch's logprobs (and routed experts) from every rank's rows, and its loss and metrics
        computed from them as one process computes them (no gradient: each rank's slice already gave its own)."""
        whole = share.assemble(logprobs.detach())
        routed = {
            name: share.assemble(torch.from_numpy(value).to(self.state.device), axis=1).cpu().numpy()
            for name, value in routed.items()
        }
        with torch.no_grad():
            inputs = {name: self.state.as_tensor(value) for name, value in tensors.items()}
            loss, metrics = compute_loss(loss_fn, whole, inputs, loss_fn_config)
            if self.nan_loss:
                loss = loss * float("nan")
        return whole, routed, loss, metrics

    def step(
        self,
        learning_rate: float | None = None,
        *,
        betas: list[float] | None = None,
        eps: float | None = None,
        weight_decay: float | None = None,
        grad_clip: float | None = None,
    ) -> dict[str, Any]:
        """Apply the accumulated gradients. Each hyperparameter given applies to this step only (the
        Tinker API sends them all on every step); the optimizer's moments carry on unchanged."""
        if self.pending_batches == 0:
            raise OperationError(
                "no_gradients", "step has no gradients to apply; call forward_backward first"
            )
        lr = float(learning_rate) if learning_rate is not None else float(self.settings["lr"])
        hyper = {
            "lr": lr,
            "betas": tuple(float(b) for b in (betas if betas is not None else self.settings["betas"])),
            "eps": float(eps if eps is not None else self.settings["eps"]),
            "weight_decay": float(
                weight_decay if weight_decay is not None else self.settings["weight_decay"]
            ),
        }
        for group in self.optimizer.param_groups:
            group.update(hyper)
        grads = [p.grad for p in self.parameters if p.grad is not None]
        clip = grad_clip if grad_clip is not None else self.settings.get("grad_clip")
        if clip:
            grad_norm = torch.nn.utils.clip_grad_norm_(self.parameters, float(clip))
        else:
            grad_norm = torch.nn.utils.get_total_norm(grads)
        grad_norm_value = float(full(grad_norm).item())
        if not math.isfinite(grad_norm_value):
            self.optimizer.zero_grad(set_to_none=True)
            self.pending_batches = self.pending_tokens = 0
            self.pending_mismatch = (0.0, 0.0, 0)
            raise OperationError(
                "non_finite_gradients", f"the gradient norm is {grad_norm_value}; the step was skipped"
            )
        if self.offload is not None:
            self.offload.to_device()
        self.optimizer.step()
        if self.offload is not None:
            self.offload.to_host()
        self.optimizer.zero_grad(set_to_none=True)
        self.step_count += 1
        self.state.weight_version = self.step_count
        result = {
            "step": self.step_count,
            "grad_norm": grad_norm_value,
            "learning_rate": lr,
            "batches": self.pending_batches,
            "tokens": self.pending_tokens,
            **peak_memory(self.state.device),
        }
        if is_sharded():
            result["ranks"] = rank_memory(self.state.device)
        total, largest, seen = self.pending_mismatch
        if seen:
            # Over every sampled token of the step's batches (a loss on the sampler's logprobs only).
            result["sampler_mismatch_mean"] = total / seen
            result["sampler_mismatch_max"] = largest
        self.pending_batches = self.pending_tokens = 0
        self.pending_mismatch = (0.0, 0.0, 0)
        return result
