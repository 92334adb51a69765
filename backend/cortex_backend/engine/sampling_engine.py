"""Choose and open a sub-job's sampling engine (the interface they share is `sampling_interface`).

Apart from the interface, so the engines import the interface and only this module imports the engines.
"""

from __future__ import annotations

from typing import Any

from .model_state import ModelState
from .sampling_interface import SamplingEngine


def open_engine(
    name: str, state: ModelState, sub_job_type: str, options: dict[str, Any] | None = None
) -> SamplingEngine:
    """The engine a sub-job samples with: `vllm` only for sampling sub-jobs, the built-in otherwise."""
    from .transformers_sampler import TransformersSampler

    if name == "vllm" and sub_job_type == "sampling":
        from .vllm_sampler import VllmSampler

        return VllmSampler(state, options or {})
    # A sampling sub-job only runs inference: its LoRA is merged into its own base weights.
    # A quantized base cannot hold W + BA without re-quantizing it (and losing the adapter's precision):
    # its samplers run the adapter unmerged. So does a slot of an adapter host: its base weights are every
    # slot's (shared_base.py).
    merge = sub_job_type == "sampling" and not state.info.quantization and not state.base_shared
    return TransformersSampler(state, merge_lora=merge)
