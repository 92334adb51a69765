"""In-process references: the same base model and LoRA adapter, trained with plain torch + peft.

Written independently of the engine (log_softmax + gather instead of the engine's fused path), so a
parity test compares two implementations, not one with itself.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch


def reference_base(model: str, model_dir: Path | None = None) -> torch.nn.Module:
    if model == "tiny":
        from cortex_backend.engine.loading import build_tiny

        return build_tiny()
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)


def reference_lora(
    base: torch.nn.Module, r: int, alpha: float, seed: int, target_modules="all-linear"
) -> torch.nn.Module:
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    config = LoraConfig(
        r=r, lora_alpha=alpha, lora_dropout=0.0, target_modules=target_modules, task_type="CAUSAL_LM"
    )
    return get_peft_model(base, config)


def reference_logprobs(model: torch.nn.Module, batch: dict[str, np.ndarray]) -> torch.Tensor:
    logits = model(
        input_ids=torch.from_numpy(batch["input_ids"]),
        attention_mask=torch.from_numpy(batch["attention_mask"]) if "attention_mask" in batch else None,
    ).logits
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    return logprobs.gather(-1, torch.from_numpy(batch["target_tokens"])[..., None]).squeeze(-1)


class ReferenceTrainer:
    """AdamW on the LoRA parameters, cross-entropy summed over weighted tokens."""

    def __init__(self, model: torch.nn.Module, lr: float) -> None:
        self.model = model
        # Deterministic: no dropout anywhere (the tests use lora dropout 0).
        self.model.eval()
        parameters = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(parameters, lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)

    def train_step(self, batch: dict[str, np.ndarray]) -> tuple[float, np.ndarray]:
        """One step; returns the loss and the per-token target logprobs before the update."""
        logprobs = reference_logprobs(self.model, batch)
        loss = -(torch.from_numpy(batch["weights"]) * logprobs).sum()
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad()
        return float(loss.item()), logprobs.detach().numpy()


def random_batch(
    rng: np.random.Generator, vocab: int, batch: int, length: int, pad_tail: bool = True
) -> dict[str, np.ndarray]:
    """Random tokens with a padded tail on some rows (weight 0, attention 0) to exercise masking."""
    tokens = rng.integers(0, vocab, size=(batch, length + 1))
    weights = rng.uniform(0.5, 1.5, size=(batch, length)).astype(np.float32)
    mask = np.ones((batch, length), dtype=np.int64)
    if pad_tail:
        for row in range(1, batch, 2):
            cut = length - int(rng.integers(1, length // 2))
            weights[row, cut:] = 0.0
            mask[row, cut:] = 0
    return {
        "input_ids": tokens[:, :-1].astype(np.int64),
        "target_tokens": tokens[:, 1:].astype(np.int64),
        "weights": weights,
        "attention_mask": mask,
    }
