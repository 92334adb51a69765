"""Sampling parameters, as the sampling engines read them: the protocol's one definition
(cortex_nb/protocol/schemas/sampling.py), re-exported here with the seed bound the engines derive
per-sample seeds within. Torch-free.

Logprobs, for both engines: `logprobs` (per sampled token) and `prompt_logprobs` (per prompt token
after the first) are under the model's own distribution: temperature 1, no top-k/top-p truncation,
the quantity the trainer's `forward` computes for the same tokens.
"""

from __future__ import annotations

from .protocol.schemas.base import MAX_SEED
from .protocol.schemas.sampling import SAMPLING_KEYS, SamplingParams

__all__ = ["MAX_SEED", "SAMPLING_KEYS", "SamplingParams"]
