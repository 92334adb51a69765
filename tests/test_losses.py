"""The losses as data (`cortex_nb.protocol.losses`) and the engine's functions for them, pinned against
values computed by hand on small tensors: sums over tokens, zero-weight tokens left out, PPO's clipping."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from cortex_backend.engine.losses import REGISTRY, compute_loss, target_logprobs
from cortex_backend.validation import validate_loss, validate_token_batch

from cortex_nb.client import as_batch
from cortex_nb.protocol.errors import ApiError
from cortex_nb.protocol.losses import LOSSES, TENSORS


def _inputs(**arrays) -> dict[str, torch.Tensor]:
    return {name: torch.tensor([values], dtype=torch.float32) for name, values in arrays.items()}


def test_every_loss_has_an_engine_function_and_known_tensors():
    assert set(REGISTRY) == set(LOSSES)
    for spec in LOSSES.values():
        assert set(spec.tensors) <= set(TENSORS)
        assert "target_tokens" in spec.tensors


def test_cross_entropy_sums_weighted_nll_and_leaves_zero_weight_tokens_out():
    logprobs = torch.tensor([[-1.0, -50.0, -0.5]], requires_grad=True)
    loss, metrics = compute_loss("cross_entropy", logprobs, _inputs(weights=[1.0, 0.0, 2.0]), {})
    # -(1 * -1 + 0 * -50 + 2 * -0.5) = 2: the zero-weight token's -50 adds nothing
    assert loss.item() == pytest.approx(2.0)
    assert metrics == {"loss:sum": pytest.approx(2.0), "weights:sum": pytest.approx(3.0)}
    loss.backward()
    assert logprobs.grad.tolist() == [[-1.0, 0.0, -2.0]]


def test_importance_sampling_weights_advantages_by_the_probability_ratio():
    # ratios exp(lp - q): 0.5 / 0.25 = 2 and 0.1 / 0.2 = 0.5; loss = -(2 * 3 + 0.5 * -4) = -4
    logprobs = torch.tensor([[math.log(0.5), math.log(0.1)]])
    tensors = _inputs(logprobs=[math.log(0.25), math.log(0.2)], advantages=[3.0, -4.0])
    loss, metrics = compute_loss("importance_sampling", logprobs, tensors, {})
    assert loss.item() == pytest.approx(-4.0)
    assert metrics["ratio:mean"] == pytest.approx(1.25)


def test_ppo_clips_the_ratio_where_it_would_gain_and_reports_the_clipped_fraction():
    # ratios 2, 0.5, 1 with advantages 1, -1, 2 and the default clip [0.8, 1.2]:
    #   min(2 * 1, 1.2 * 1) = 1.2; min(0.5 * -1, 0.8 * -1) = -0.8; min(1 * 2, 1 * 2) = 2  -> loss -2.4
    q = [0.0, 0.0, 0.0]
    logprobs = torch.tensor([[math.log(2.0), math.log(0.5), 0.0]], requires_grad=True)
    config = LOSSES["ppo"].with_defaults({})
    assert config == {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}
    loss, metrics = compute_loss("ppo", logprobs, _inputs(logprobs=q, advantages=[1.0, -1.0, 2.0]), config)
    assert loss.item() == pytest.approx(-2.4)
    assert metrics["clip_fraction:mean"] == pytest.approx(2 / 3)
    loss.backward()
    # The clipped tokens pass no gradient; the unclipped one gets -ratio * advantage = -2.
    assert logprobs.grad[0].tolist() == pytest.approx([0.0, 0.0, -2.0])


def test_ppo_takes_its_thresholds_from_the_config():
    logprobs = torch.tensor([[math.log(2.0)]])
    loss, _ = compute_loss(
        "ppo",
        logprobs,
        _inputs(logprobs=[0.0], advantages=[1.0]),
        LOSSES["ppo"].with_defaults({"clip_high_threshold": 1.5}),
    )
    assert loss.item() == pytest.approx(-1.5)


def test_cispo_weights_every_token_by_its_clipped_ratio_without_differentiating_it():
    # ratios 2, 0.5, 1 (clipped to 1.2, 0.8, 1) with advantages 1, -1, 2 and logprobs log 2, log 0.5, 0:
    #   loss = -(1.2 * log 2 * 1 + 0.8 * log 0.5 * -1 + 1 * 0 * 2) = -(1.2 + 0.8) * log 2 = -2 log 2
    logprobs = torch.tensor([[math.log(2.0), math.log(0.5), 0.0]], requires_grad=True)
    config = LOSSES["cispo"].with_defaults({})
    tensors = _inputs(logprobs=[0.0, 0.0, 0.0], advantages=[1.0, -1.0, 2.0])
    loss, metrics = compute_loss("cispo", logprobs, tensors, config)
    assert loss.item() == pytest.approx(-2.0 * math.log(2.0))
    assert metrics["clip_fraction:mean"] == pytest.approx(2 / 3)
    loss.backward()
    # Unlike PPO, the clipped tokens keep a gradient: -clip(ratio) * advantage, the ratio held constant.
    assert logprobs.grad[0].tolist() == pytest.approx([-1.2, 0.8, -2.0])


def test_gspo_gives_every_token_its_sequences_ratio_with_its_own_gradient():
    # Two sequences (rows). Row 0 ratio over positions 1, 2: log-ratios log 2 and log 8 -> mean log 4, s = 4
    # (clipped to 1.2); position 0 is prompt (mask 0, advantage 0). Row 1: log-ratios log 0.25, log 1 over both
    # positions -> s = 0.5 (clipped to 0.8), advantages -1, 3.
    current = [[0.0, math.log(2.0), math.log(8.0)], [math.log(0.25), 0.0, 0.0]]
    logprobs = torch.tensor(current, requires_grad=True)
    tensors = {
        "logprobs": torch.zeros(2, 3),
        "advantages": torch.tensor([[0.0, 1.0, 1.0], [-1.0, 3.0, 0.0]]),
        "sequence_ratio_mask": torch.tensor([[0.0, 1.0, 1.0], [1.0, 1.0, 0.0]]),
    }
    loss, metrics = compute_loss("gspo", logprobs, tensors, LOSSES["gspo"].with_defaults({}))
    # The reference, from the definition: min(s * A, clip(s) * A) per token, s the sequence's ratio.
    expected = 0.0
    for row in range(2):
        mask = tensors["sequence_ratio_mask"][row] != 0
        s = math.exp(float(torch.tensor(current[row])[mask].mean()))
        for a in tensors["advantages"][row].tolist():
            expected -= min(s * a, min(max(s, 0.8), 1.2) * a)
    assert loss.item() == pytest.approx(expected, abs=1e-5)
    assert metrics["ratio:mean"] == pytest.approx((3 * 4.0 + 3 * 0.5) / 6, abs=1e-5)
    loss.backward()
    # A token's gradient is -s * A where min() picks the unclipped side, else 0. Row 0: s = 4 with A > 0 picks the
    # clipped 1.2 * A. Row 1 (s = 0.5): A = -1 picks the clipped -0.8; A = 3 picks 0.5 * 3, so its gradient is -1.5.
    torch.testing.assert_close(logprobs.grad, torch.tensor([[0.0, 0.0, 0.0], [0.0, -1.5, 0.0]]))


def test_gspo_row_with_nothing_masked_has_ratio_one():
    logprobs = torch.tensor([[math.log(3.0)]])
    tensors = _inputs(logprobs=[0.0], advantages=[2.0], sequence_ratio_mask=[0.0])
    loss, _ = compute_loss("gspo", logprobs, tensors, LOSSES["gspo"].with_defaults({}))
    assert loss.item() == pytest.approx(-2.0)


def test_dro_rewards_logprob_times_advantage_less_a_quadratic_penalty():
    # loss = -sum(logprob * A - beta / 2 * (logprob - sampling)^2), beta 0.5
    logprobs = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    tensors = _inputs(logprobs=[-1.5, -1.0], advantages=[2.0, -1.0])
    loss, metrics = compute_loss("dro", logprobs, tensors, LOSSES["dro"].with_defaults({"beta": 0.5}))
    expected = -((-1.0 * 2.0 - 0.25 * 0.25) + (-2.0 * -1.0 - 0.25 * 1.0))
    # Like every loss on the sampler's logprobs, it reports their gap to the trainer's: |-1+1.5|, |-2+1|.
    assert loss.item() == pytest.approx(expected) and metrics == {
        "loss:sum": pytest.approx(expected),
        "sampler_mismatch:mean": pytest.approx(0.75),
        "sampler_mismatch:max": pytest.approx(1.0),
        "sampler_mismatch_tokens:sum": 2.0,
    }
    loss.backward()
    # -(A - beta * (logprob - sampling))
    assert logprobs.grad[0].tolist() == pytest.approx([-(2.0 - 0.5 * 0.5), -(-1.0 - 0.5 * -1.0)])
    assert LOSSES["dro"].defaults() == {"beta": 0.05}
    # Padding (attention 0) adds no penalty, though its logprob is far from the 0 it was padded with.
    padded = {**tensors, "attention_mask": torch.tensor([[1.0, 0.0]])}
    loss, _ = compute_loss("dro", logprobs.detach(), padded, LOSSES["dro"].with_defaults({"beta": 0.5}))
    assert loss.item() == pytest.approx(-(-1.0 * 2.0 - 0.25 * 0.25))


def test_validation_fills_defaults_and_refuses_unknown_or_out_of_range_config():
    spec, config = validate_loss({"loss_fn": "ppo", "loss_fn_config": {"clip_low_threshold": 0.7}})
    assert spec.name == "ppo" and config == {"clip_low_threshold": 0.7, "clip_high_threshold": 1.2}
    with pytest.raises(ApiError) as info:  # a frame names its loss (the client always sends one)
        validate_loss({})
    assert info.value.code == "invalid_frame" and info.value.detail["field"] == "loss_fn"
    for metadata, field in (
        (
            {"loss_fn": "cross_entropy", "loss_fn_config": {"clip_low_threshold": 0.7}},
            "loss_fn_config.clip_low_threshold",
        ),
        (
            {"loss_fn": "ppo", "loss_fn_config": {"clip_high_threshold": 0.5}},
            "loss_fn_config.clip_high_threshold",
        ),
        (
            {"loss_fn": "ppo", "loss_fn_config": {"clip_low_threshold": "x"}},
            "loss_fn_config.clip_low_threshold",
        ),
    ):
        with pytest.raises(ApiError) as info:
            validate_loss(metadata)
        assert info.value.code == "invalid_field" and info.value.detail["field"] == field
    with pytest.raises(ApiError) as info:
        validate_loss({"loss_fn": "mse"})
    assert info.value.code == "unknown_loss"


def test_the_client_casts_with_the_tensor_specs_and_the_backend_checks_them():
    batch = as_batch(
        {"input_ids": [[1, 2]], "target_tokens": [[2, 3]], "weights": [[1, 0]], "extra": [[1, 1]]}
    )
    assert {name: str(array.dtype) for name, array in batch.items()} == {
        "input_ids": "int64",
        "target_tokens": "int64",
        "weights": "float32",
        "extra": "float32",
    }

    class Info:
        name, vocab_size = "tiny", 259

    validate_token_batch(batch, LOSSES["cross_entropy"].tensors, Info, 8)
    floats = dict(batch, target_tokens=batch["target_tokens"].astype(np.float32))
    with pytest.raises(ApiError) as info:
        validate_token_batch(floats, LOSSES["cross_entropy"].tensors, Info, 8)
    assert info.value.code == "invalid_batch" and info.value.detail["field"] == "target_tokens"
    with pytest.raises(ApiError) as info:
        validate_token_batch(
            {k: v for k, v in batch.items() if k != "weights"}, LOSSES["cross_entropy"].tensors, Info, 8
        )
    assert info.value.detail["missing"] == ["weights"]


def test_k_targets_per_position_score_as_the_log_softmax_and_one_target_stays_as_before():
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 11, dtype=torch.float64).float()
    targets = torch.randint(0, 11, (2, 5, 3))
    wide = target_logprobs(logits, targets)
    expected = torch.log_softmax(logits, dim=-1).gather(-1, targets)
    torch.testing.assert_close(wide, expected, rtol=0, atol=1e-6)
    # the [B, T] path gives the same numbers as column 0 of the [B, T, K] one
    torch.testing.assert_close(target_logprobs(logits, targets[..., 0]), wide[..., 0], rtol=0, atol=1e-6)
    weights = torch.rand(2, 5, 3)
    loss, metrics = compute_loss("cross_entropy", wide, {"weights": weights}, {})
    assert loss.item() == pytest.approx(-(weights * expected).sum().item(), rel=1e-6)
    assert metrics["weights:sum"] == pytest.approx(weights.sum().item(), rel=1e-6)


def test_the_backend_takes_k_targets_per_position_for_cross_entropy_only():
    class Info:
        name, vocab_size = "tiny", 259

    ids = np.array([[1, 2, 3]], np.int64)
    wide = {
        "input_ids": ids,
        "target_tokens": np.ones((1, 3, 4), np.int64),
        "weights": np.ones((1, 3, 4), np.float32),
    }
    spec = LOSSES["cross_entropy"]
    validate_token_batch(wide, spec.tensors, Info, 8, spec.multi_target, spec.wide, spec.name)
    with pytest.raises(ApiError) as info:
        narrow = dict(wide, weights=np.ones((1, 3, 2), np.float32))
        validate_token_batch(narrow, spec.tensors, Info, 8, spec.multi_target, spec.wide, spec.name)
    assert info.value.code == "invalid_batch" and info.value.detail["field"] == "weights"
    with pytest.raises(ApiError) as info:
        long = dict(wide, target_tokens=np.ones((1, 4, 4), np.int64), weights=np.ones((1, 4, 4), np.float32))
        validate_token_batch(long, spec.tensors, Info, 8, spec.multi_target, spec.wide, spec.name)
    assert info.value.code == "invalid_batch" and info.value.detail["field"] == "target_tokens"
    ppo = LOSSES["ppo"]
    batch = {**wide, "logprobs": np.zeros((1, 3), np.float32), "advantages": np.ones((1, 3), np.float32)}
    with pytest.raises(ApiError) as info:
        validate_token_batch(batch, ppo.tensors, Info, 8, ppo.multi_target, ppo.wide, ppo.name)
    assert info.value.code == "unsupported_operation" and info.value.detail["field"] == "target_tokens"
    assert "ppo takes one value per position" in info.value.message
