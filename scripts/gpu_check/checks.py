"""Correctness on the device: bf16 training against an fp32 reference, and samplers against the trainer.

Tolerances (bf16 keeps 8 bits of mantissa, about 3 significant digits):
- training: each step's loss within 1e-2 relative of the fp32 run's; after the steps, per-token
  logprobs on a probe batch within 0.05 on average (fp32 on a CPU: 1e-5 and 1e-4);
- samplers after a sync: greedy continuations equal the trainer's, except where the trainer's own
  choice leads the sampler's by less than twice the largest logprob deviation measured on the
  tokens both agree on (a near-tie, which bf16 rounding may flip).
"""

from __future__ import annotations

from typing import Any

import numpy as np

LOSS_RTOL = {"bfloat16": 1e-2, "float32": 1e-5}
LOGPROB_MEAN_ATOL = {"bfloat16": 5e-2, "float32": 1e-4}


def random_batch(rng: np.random.Generator, vocab: int, rows: int, length: int) -> dict[str, np.ndarray]:
    tokens = rng.integers(3, vocab, size=(rows, length + 1))
    return {
        "input_ids": tokens[:, :-1],
        "target_tokens": tokens[:, 1:],
        "weights": np.ones((rows, length), np.float32),
    }


def training_parity(trainer, reference, batches: list[dict], probe: dict, dtype: str) -> dict[str, Any]:
    """Train `trainer` (bf16) and `reference` (fp32) on the same batches; compare losses and logprobs."""
    from cortex_backend.engine.scoring import forward

    steps = []
    for batch in batches:
        ours = trainer.forward_backward(batch, "cross_entropy", {})[0]["loss"]
        expected = reference.forward_backward(batch, "cross_entropy", {})[0]["loss"]
        trainer.step()
        reference.step()
        steps.append(
            {"loss": ours, "reference_loss": expected, "relative_error": abs(ours - expected) / abs(expected)}
        )
    ours = forward(trainer.state, probe)[1]["logprobs"]
    expected = forward(reference.state, probe)[1]["logprobs"]
    deviation = np.abs(ours - expected)
    passed = (
        all(step["relative_error"] <= LOSS_RTOL[dtype] for step in steps)
        and deviation.mean() <= LOGPROB_MEAN_ATOL[dtype]
    )
    return {
        "passed": bool(passed),
        "dtype": dtype,
        "tolerances": {"loss_relative": LOSS_RTOL[dtype], "logprob_mean_abs": LOGPROB_MEAN_ATOL[dtype]},
        "steps": steps,
        "probe_logprob_mean_abs_error": float(deviation.mean()),
        "probe_logprob_max_abs_error": float(deviation.max()),
    }


def sync_adapter(trainer_state, sampler_state) -> dict[str, Any]:
    """Move the trainer's adapter into the sampler as a weight sync does: an fp16 delta, checked by hash."""
    from cortex_backend.engine.adapter import as_stored, assign, layout, snapshot, tensor_hash
    from cortex_backend.engine.weight_codec import apply_delta, decode_delta, delta_values, encode_delta

    base, new = snapshot(sampler_state.model), snapshot(trainer_state.model)
    payload = encode_delta(delta_values(base, new))
    dtypes = {name: value["dtype"] for name, value in layout(sampler_state.model).items()}
    expected = as_stored(apply_delta(base, delta_values(base, new)), dtypes)
    received = as_stored(apply_delta(base, decode_delta(payload.data)), dtypes)
    assert tensor_hash(received) == tensor_hash(expected), "the delta did not arrive intact"
    assign(sampler_state.model, received)
    sampler_state.weight_version = trainer_state.weight_version
    return {"bytes": len(payload.data), "raw_bytes": payload.raw_bytes}


def _distributions(state, sequences: list[list[int]]) -> list[np.ndarray]:
    """Each sequence's full next-token log-distributions under `state`'s model (teacher forcing)."""
    import torch

    out = []
    with state.inference():
        for sequence in sequences:
            ids = torch.tensor([sequence], device=state.device)
            logits = state.model(input_ids=ids, use_cache=False).logits[0].float()
            out.append(torch.log_softmax(logits, dim=-1).cpu().numpy())
    return out


def sampler_agrees(
    trainer_state,
    prompts: list[list[int]],
    expected: list[list[int]],
    got: list[list[int]],
    got_logprobs: list[list[float]],
) -> dict[str, Any]:
    """Compare a sampler's greedy continuations with the trainer's under the near-tie rule above."""
    trainer_views = _distributions(trainer_state, [p + e for p, e in zip(prompts, expected, strict=True)])
    deviation = 0.0
    for prompt, mine, theirs, logprobs, view in zip(
        prompts, expected, got, got_logprobs, trainer_views, strict=True
    ):
        agree = next(
            (i for i, (a, b) in enumerate(zip(mine, theirs, strict=False)) if a != b),
            min(len(mine), len(theirs)),
        )
        for i in range(agree):
            deviation = max(deviation, abs(float(view[len(prompt) - 1 + i, mine[i]]) - logprobs[i]))
    exact, near_ties, unexplained = 0, 0, []
    for index, (prompt, mine, theirs, view) in enumerate(
        zip(prompts, expected, got, trainer_views, strict=True)
    ):
        if mine == theirs:
            exact += 1
            continue
        first = next((i for i, (a, b) in enumerate(zip(mine, theirs, strict=False)) if a != b), None)
        if first is None:  # one stopped early: not a disagreement about any token
            near_ties += 1
            continue
        row = view[len(prompt) - 1 + first]
        margin = float(row[mine[first]] - row[theirs[first]])
        if margin <= 2 * deviation:
            near_ties += 1
        else:
            unexplained.append({"prompt": index, "position": first, "margin": margin})
    return {
        "passed": not unexplained,
        "exact": exact,
        "near_ties": near_ties,
        "prompts": len(prompts),
        "max_logprob_deviation": deviation,
        "unexplained": unexplained[:5],
    }


def optimizer_offload(make_trainer, batches: list[dict]) -> dict[str, Any]:
    """A trainer whose AdamW moments sit in host memory between steps (an adapter host's offload) against
    the same trainer keeping them on the device: adapters equal bitwise after the steps, and the device
    memory each holds after its last step (the offloaded one less by the moments)."""
    import torch
    from cortex_backend.engine.adapter import adapter_parameters

    def allocated() -> int:
        return int(torch.cuda.memory_allocated()) if torch.cuda.is_available() else 0

    def train(offload: bool) -> tuple[dict[str, torch.Tensor], int, int]:
        before = allocated()
        trainer = make_trainer()
        if offload:
            trainer.offload_optimizer()
        for batch in batches:
            trainer.forward_backward(batch, "cross_entropy", {})
            trainer.step()
        held = allocated() - before
        host = trainer.offload.host_bytes() if trainer.offload is not None else 0
        weights = {
            name: p.detach().cpu().clone() for name, p in adapter_parameters(trainer.state.model).items()
        }
        del trainer
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return weights, held, host

    kept, kept_bytes, _ = train(False)
    moved, moved_bytes, host_bytes = train(True)
    equal = kept.keys() == moved.keys() and all(torch.equal(kept[name], moved[name]) for name in kept)
    return {
        "passed": bool(equal),
        "adapters_equal_bitwise": bool(equal),
        "steps": len(batches),
        "device_bytes_moments_on_device": kept_bytes,
        "device_bytes_moments_offloaded": moved_bytes,
        "moments_in_host_memory_bytes": host_bytes,
        "note": None if torch.cuda.is_available() else "on a CPU the moments are in host memory already",
    }
