"""A KV cache that writes each step into room reserved up front, instead of growing by concatenation.

transformers' DynamicCache concatenates every layer's keys and values with the new token's at each
step: a copy of the whole cache per token, most of a small model's decoding time on a CPU. The sampler
knows how long its rows can get (prompt width + max_tokens), so each layer gets buffers of that length
once; a step writes one column and hands attention a view of the filled part. Layers of any other kind
(sliding windows, linear attention) are left as they are.
"""

from __future__ import annotations

import torch

try:  # transformers >= 4.56 keeps a cache as a list of layers
    from transformers.cache_utils import DynamicLayer
except ImportError:  # older caches keep growing by concatenation
    DynamicLayer = None


class ReservedLayer(DynamicLayer or object):
    """A DynamicLayer whose keys and values are views into buffers of a fixed capacity."""

    key_buffer: torch.Tensor
    value_buffer: torch.Tensor

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        length = self.keys.shape[-2]
        end = length + key_states.shape[-2]
        if end > self.key_buffer.shape[-2]:  # past the reserved room: grow as transformers does
            return super().update(key_states, value_states, *args, **kwargs)
        self.key_buffer[:, :, length:end].copy_(key_states)
        self.value_buffer[:, :, length:end].copy_(value_states)
        self.keys = self.key_buffer[:, :, :end]
        self.values = self.value_buffer[:, :, :end]
        return self.keys, self.values


def reserve(cache, capacity: int) -> int:
    """Move every plain dynamic layer of `cache` into buffers of `capacity` positions; return how many moved."""
    layers = getattr(cache, "layers", None)
    if layers is None or DynamicLayer is None:
        return 0
    moved = 0
    for index, layer in enumerate(layers):
        if type(layer) is not DynamicLayer or not layer.is_initialized or layer.keys.dim() != 4:
            continue
        keys, values = layer.keys, layer.values
        reserved = ReservedLayer.__new__(ReservedLayer)
        reserved.__dict__.update(layer.__dict__)
        shape = (keys.shape[0], keys.shape[1], capacity, keys.shape[3])
        reserved.key_buffer = keys.new_empty(shape)
        reserved.value_buffer = values.new_empty(
            (values.shape[0], values.shape[1], capacity, values.shape[3])
        )
        length = keys.shape[-2]
        reserved.key_buffer[:, :, :length].copy_(keys)
        reserved.value_buffer[:, :, :length].copy_(values)
        reserved.keys = reserved.key_buffer[:, :, :length]
        reserved.values = reserved.value_buffer[:, :, :length]
        layers[index] = reserved
        moved += 1
    return moved


class SharedPrefixLayer(DynamicLayer or object):
    """A layer whose prompt part is kept once per prompt and read by all of its `n` samples.

    `prefix_keys`/`prefix_values` hold the prefill's keys and values (prompts, heads, width, dim), as the
    prefill left them: not repeated. The generated part is per row (prompts x n), written into buffers
    reserved up front; `update` returns only that part, and engine/prefix_attention.py attends to both.
    """

    prefix_keys: torch.Tensor
    prefix_values: torch.Tensor
    key_buffer: torch.Tensor
    value_buffer: torch.Tensor
    generated: int

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        end = self.generated + key_states.shape[-2]
        self.key_buffer[:, :, self.generated : end].copy_(key_states)
        self.value_buffer[:, :, self.generated : end].copy_(value_states)
        self.generated = end
        self.keys = self.key_buffer[:, :, :end]
        self.values = self.value_buffer[:, :, :end]
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.prefix_keys.shape[-2] + self.generated

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.get_seq_length() + query_length, 0


def share_prefix(cache, samples: int, steps: int) -> bool:
    """Turn every layer of a prefilled `cache` into a SharedPrefixLayer for `samples` rows per prompt and
    `steps` generated positions. All or nothing: False (the cache untouched) if any layer is of another kind."""
    layers = getattr(cache, "layers", None)
    if layers is None or DynamicLayer is None:
        return False
    if not all(
        type(layer) is DynamicLayer and layer.is_initialized and layer.keys.dim() == 4 for layer in layers
    ):
        return False
    for index, layer in enumerate(layers):
        keys, values = layer.keys, layer.values
        shared = SharedPrefixLayer.__new__(SharedPrefixLayer)
        shared.__dict__.update(layer.__dict__)
        shared.prefix_keys, shared.prefix_values = keys, values
        rows = keys.shape[0] * samples
        shared.key_buffer = keys.new_empty((rows, keys.shape[1], steps, keys.shape[3]))
        shared.value_buffer = values.new_empty((rows, values.shape[1], steps, values.shape[3]))
        shared.generated = 0
        shared.keys = shared.key_buffer[:, :, :0]
        shared.values = shared.value_buffer[:, :, :0]
        layers[index] = shared
    return True
