"""Decoding attention that reads each prompt's keys and values once for all of its samples.

With `n` samples per prompt, a repeated cache makes every decoding step read each prompt's keys and
values `n` times, and on a CPU that memory traffic is most of a step. Here the prompt part stays one
copy per prompt (kv_cache.SharedPrefixLayer): the step's queries of a prompt's `n` samples are stacked
and meet the prompt's keys in one product, each row's generated part is attended separately, and one
softmax runs over both parts, so the result is ordinary attention over the whole row.

Active only inside `shared_prefix_attention(model)`; any other call falls back to transformers' sdpa.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from .kv_cache import SharedPrefixLayer

NAME = "cortex_shared_prefix"
_active: dict[int, list] = {}  # id(attention module's config) -> cache layers, while a decode runs


def _fallback(*args, **kwargs):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward(*args, **kwargs)


def _attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    if not _active:  # no shared-prefix decode running: transformers' own attention
        return _fallback(
            module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs
        )
    layers = _active.get(id(getattr(module, "config", None)))
    layer_index = getattr(module, "layer_idx", None)
    layer = layers[layer_index] if layers is not None and layer_index is not None else None
    if not isinstance(layer, SharedPrefixLayer) or query.shape[2] != 1:
        # `key` holds only the generated part here: attending to it alone would be silently wrong.
        raise RuntimeError(f"shared-prefix attention cannot serve {type(module).__name__} here")
    prefix_keys, prefix_values = layer.prefix_keys, layer.prefix_values
    rows, heads, _, dim = query.shape
    prompts, kv_heads, width, _ = prefix_keys.shape
    samples, groups = rows // prompts, heads // kv_heads
    query = query * (scaling if scaling is not None else dim**-0.5)
    # (rows, heads, 1, dim) -> per prompt: (prompts, kv_heads, samples * groups, dim)
    by_row = query.reshape(prompts, samples, kv_heads, groups, dim)
    by_prompt = by_row.transpose(1, 2).reshape(prompts, kv_heads, samples * groups, dim)
    prefix_scores = torch.matmul(by_prompt, prefix_keys.transpose(-1, -2))
    if attention_mask is not None:  # (rows, 1, 1, width + generated): generated positions are all attended
        prompt_mask = attention_mask[::samples, :, :, :width]  # a prompt's samples share its padding
        prefix_scores = prefix_scores.masked_fill(~prompt_mask, torch.finfo(prefix_scores.dtype).min)
    prefix_scores = (
        prefix_scores.reshape(prompts, kv_heads, samples, groups, width)
        .transpose(1, 2)
        .reshape(rows, kv_heads, groups, width)
    )
    own = query.reshape(rows, kv_heads, groups, dim)
    own_scores = torch.matmul(own, key.transpose(-1, -2))
    scores = torch.cat((prefix_scores, own_scores), dim=-1)
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    prefix_weights = (
        weights[..., :width]
        .reshape(prompts, samples, kv_heads, groups, width)
        .transpose(1, 2)
        .reshape(prompts, kv_heads, samples * groups, width)
    )
    from_prefix = (
        torch.matmul(prefix_weights, prefix_values)
        .reshape(prompts, kv_heads, samples, groups, dim)
        .transpose(1, 2)
        .reshape(rows, kv_heads, groups, dim)
    )
    output = torch.matmul(weights[..., width:], value).add_(from_prefix)
    # transformers' attention functions return (rows, query length, heads, dim)
    return output.reshape(rows, 1, heads, dim), None


def _register() -> bool:
    try:
        from transformers import AttentionInterface
    except ImportError:
        return False
    AttentionInterface.register(NAME, _attention)
    return True


def supports(model: torch.nn.Module) -> bool:
    """Whether every attention layer of `model` reads the model's own config (where the switch to this
    attention is made) and transformers can take a registered attention function."""
    try:
        from transformers import AttentionInterface  # noqa: F401
    except ImportError:
        return False
    config = getattr(model, "config", None)
    layers = [
        module for module in model.modules() if hasattr(module, "layer_idx") and hasattr(module, "config")
    ]
    return (
        bool(layers) and hasattr(config, "_attn_implementation") and all(m.config is config for m in layers)
    )


@contextlib.contextmanager
def shared_prefix_attention(model: torch.nn.Module, cache) -> Iterator[bool]:
    """Within the block the model's attention reads `cache`'s shared prompt parts; yields whether it does."""
    config = model.config
    if not _register() or not hasattr(config, "_attn_implementation"):
        yield False
        return
    previous = config._attn_implementation
    _active[id(config)] = cache.layers
    config._attn_implementation = NAME
    try:
        yield True
    finally:
        config._attn_implementation = previous
        _active.pop(id(config), None)
