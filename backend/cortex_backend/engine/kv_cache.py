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
