"""The models the check builds from a config, with random weights: nothing is downloaded.

Llama models shaped like Qwen2-0.5B and Qwen2-1.5B (layers, widths, heads, vocabulary, tied
embeddings), and for the dry run a tiny one whose heads are still 32 wide (vLLM's CPU attention
refuses narrower ones). The final norm is scaled up so logits are not flat: a random model's greedy
path is otherwise decided by near-ties, and precision comparisons would test noise.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

FINAL_NORM_SCALE = 8.0


@dataclass(frozen=True)
class Shape:
    name: str
    config: dict[str, Any]


QWEN2_0_5B = Shape(
    "qwen2-0.5b-shaped",
    {
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "vocab_size": 151936,
        "tie_word_embeddings": True,
    },
)
QWEN2_1_5B = Shape(
    "qwen2-1.5b-shaped",
    {
        "hidden_size": 1536,
        "intermediate_size": 8960,
        "num_hidden_layers": 28,
        "num_attention_heads": 12,
        "num_key_value_heads": 2,
        "vocab_size": 151936,
        "tie_word_embeddings": True,
    },
)
DRY_RUN = Shape(
    "dry-run-tiny",
    {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "vocab_size": 512,
        "tie_word_embeddings": False,
    },
)
SHAPES = {shape.name: shape for shape in (QWEN2_0_5B, QWEN2_1_5B, DRY_RUN)}
COMMON = {
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1_000_000.0,
    "bos_token_id": 1,
    "eos_token_id": 2,
}


def build_model_dir(shape: Shape, directory: Path, device: str, seed: int = 0) -> Path:
    """Initialise the model on `device` (fast on a GPU) and save it as bf16 safetensors."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(**COMMON, **shape.config)
    with torch.device(device):
        model = LlamaForCausalLM(config)
    with torch.no_grad():
        model.model.norm.weight.mul_(FINAL_NORM_SCALE)
    model.to(torch.bfloat16).save_pretrained(str(directory), safe_serialization=True)
    del model
    return directory


def parameter_counts(config: dict[str, Any]) -> dict[str, int]:
    """Parameters in linear layers (what a token's matmuls touch) and in total."""
    hidden, layers = config["hidden_size"], config["num_hidden_layers"]
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = hidden // heads
    attention = hidden * heads * head_dim * 2 + hidden * kv_heads * head_dim * 2
    mlp = 3 * hidden * config["intermediate_size"]
    embedding = config["vocab_size"] * hidden
    linear = layers * (attention + mlp) + embedding  # the output head multiplies every token
    total = (
        layers * (attention + mlp + 2 * hidden)
        + hidden
        + embedding * (1 if config["tie_word_embeddings"] else 2)
    )
    return {"linear": linear, "total": total}
