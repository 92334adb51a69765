"""Several targets per position through the published SDK (top-k distillation): `cross_entropy` with `[T, K]`
target_tokens and weights, dense or sparse CSR, equals in-process peft's -sum(w * log_softmax gathered at the K
targets) and trains as it does; `forward` returns `[T, K]` logprobs; a custom loss with rank-2 logprobs and inputs
equals the same loss run client-side by `forward_backward_custom`. Other losses, and weights whose K differs from
the targets', are refused naming the field."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cortex_nb import Client
from cortex_nb.errors import BadRequestError

from .reference import reference_base, reference_lora
from .tinker_fixtures import NEEDS_SDK, TINKER_MODEL

pytestmark = NEEDS_SDK

TOLERANCE = 1e-5
RANK, SEED = 4, 11
# eps far above the gradients' size: Adam's first update is then about lr * grad, so it carries each gradient's
# size as well as its sign, and the logprobs after a step compare the gradients themselves.
ADAM = {"learning_rate": 0.02, "beta1": 0.9, "beta2": 0.95, "eps": 1.0, "weight_decay": 0.0}
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"]


def _reference_logprobs(model: torch.nn.Module, tokens: list[int], targets: np.ndarray) -> torch.Tensor:
    """log p(targets[t, k] | tokens[:t+1]) from the full log-softmax ([T] targets give [T])."""
    logits = model(input_ids=torch.tensor([tokens])).logits[0].float()
    logprobs = torch.log_softmax(logits, dim=-1)
    index = torch.from_numpy(np.asarray(targets, np.int64))
    if index.ndim == 1:
        return logprobs.gather(-1, index[:, None]).squeeze(-1)
    return logprobs.gather(-1, index)


def _examples(rng: np.random.Generator, vocab: int, k: int, sparse: bool) -> list[dict]:
    """Datums of different lengths with K targets per position (the first a next-token one) and soft weights;
    the last datum has one target per position, as a batch may mix them. Sparse: most cells 0, so the SDK
    sends them as CSR."""
    examples = []
    for length in (7, 5):
        tokens = rng.integers(3, vocab, size=length).tolist()
        targets = rng.integers(3, vocab, size=(length, k))
        weights = rng.uniform(0.05, 1.0, size=(length, k)).astype(np.float32)
        if sparse:
            keep = np.zeros((length, k), bool)
            keep[::2, 0] = True
            keep[1, 1] = True
            targets, weights = np.where(keep, targets, 0), np.where(keep, weights, 0.0).astype(np.float32)
        examples.append({"input": tokens, "target": targets, "weights": weights})
    tokens = rng.integers(3, vocab, size=6).tolist()
    examples.append(
        {
            "input": tokens,
            "target": np.asarray(tokens[1:] + [4]),
            "weights": rng.uniform(0.0, 1.0, size=6).astype(np.float32),
        }
    )
    return examples


def _datums(examples: list[dict]):
    from tinker import types

    return [
        types.Datum(
            model_input=types.ModelInput.from_ints(e["input"]),
            loss_fn_inputs={
                "target_tokens": torch.from_numpy(e["target"]),
                "weights": torch.from_numpy(e["weights"]),
            },
        )
        for e in examples
    ]


def _adam(model: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad],
        lr=ADAM["learning_rate"],
        betas=(ADAM["beta1"], ADAM["beta2"]),
        eps=ADAM["eps"],
        weight_decay=ADAM["weight_decay"],
    )


def test_top_k_cross_entropy_dense_and_sparse_equals_peft_and_trains_as_it(service_client, llama_dir):
    from tinker import types

    base = reference_base(TINKER_MODEL, llama_dir)
    vocab = int(base.config.vocab_size)
    reference = reference_lora(base, r=RANK, alpha=32, seed=SEED, target_modules=TARGETS).eval()
    optimizer = _adam(reference)
    training = service_client.create_lora_training_client(
        base_model=TINKER_MODEL, rank=RANK, seed=SEED
    ).result()
    rng = np.random.default_rng(3)

    for k, sparse in ((3, False), (4, True)):
        examples = _examples(rng, vocab, k, sparse)
        data = _datums(examples)
        layouts = [d.loss_fn_inputs["target_tokens"].sparse_crow_indices is not None for d in data[:2]]
        assert layouts == [sparse, sparse]  # the SDK chose CSR for the sparse ones, dense otherwise
        result = training.forward_backward(data, "cross_entropy").result()
        training.optim_step(types.AdamParams(**ADAM)).result()

        expected_loss = torch.zeros(())
        for example, output in zip(examples, result.loss_fn_outputs, strict=True):
            logprobs = _reference_logprobs(reference, example["input"], example["target"])
            expected_loss = expected_loss - (torch.from_numpy(example["weights"]) * logprobs).sum()
            got = output["logprobs"].to_numpy()
            assert got.shape == example["target"].shape  # [T, K], or [T] for the one-target datum
            np.testing.assert_allclose(got, logprobs.detach().numpy(), rtol=0, atol=TOLERANCE)
        assert result.metrics["loss:sum"] == pytest.approx(expected_loss.item(), rel=TOLERANCE, abs=TOLERANCE)
        expected_loss.backward()
        optimizer.step()
        optimizer.zero_grad()

        # forward: the trained model's [T, K] logprobs, equal to the reference after the same step
        scored = training.forward(data, "cross_entropy").result()
        with torch.no_grad():
            for example, output in zip(examples, scored.loss_fn_outputs, strict=True):
                expected = _reference_logprobs(reference, example["input"], example["target"]).numpy()
                assert output["logprobs"].to_numpy().shape == expected.shape
                np.testing.assert_allclose(output["logprobs"].to_numpy(), expected, rtol=0, atol=TOLERANCE)


def distill(logprobs, teacher):
    """Soft-target distillation on K targets per position, with a quadratic term so the loss is not linear."""
    loss = -(teacher.exp() * logprobs).sum() + 0.1 * (logprobs**2).mean()
    return loss, {"custom/distill:sum": loss, "custom/top:mean": logprobs[:, 0].mean()}


def _distill_data():
    from tinker import types

    rng = np.random.default_rng(9)
    data = []
    for length in (6, 4):
        tokens = rng.integers(3, 80, size=length).tolist()
        teacher = np.log(rng.dirichlet(np.ones(3), size=length)).astype(np.float32)
        data.append(
            types.Datum(
                model_input=types.ModelInput.from_ints(tokens),
                loss_fn_inputs={
                    "target_tokens": types.TensorData.from_numpy(rng.integers(3, 80, size=(length, 3))),
                    "teacher": types.TensorData.from_numpy(teacher),
                },
            )
        )
    return data


def test_a_rank_2_custom_loss_equals_the_client_side_one(service_client):
    from tinker import types

    def client_side(data, logprobs_list):
        total, summed, top = 0.0, 0.0, 0.0
        for datum, logprobs in zip(data, logprobs_list, strict=True):
            loss, metrics = distill(logprobs, datum.loss_fn_inputs["teacher"].to_torch())
            total = total + loss
            summed += metrics["custom/distill:sum"].item()
            top += metrics["custom/top:mean"].item() / len(data)
        return total, {"custom/distill:sum": summed, "custom/top:mean": top}

    handle = service_client.create_custom_loss(distill, {"logprobs": 2, "teacher": 2}).result()
    assert handle.loss_id is not None  # uploaded: it runs on the server
    data = _distill_data()
    server_client, local_client = (
        service_client.create_lora_training_client(base_model=TINKER_MODEL, rank=RANK, seed=SEED).result()
        for _ in range(2)
    )
    server = server_client.forward_backward_custom(data, handle).result()
    local = local_client.forward_backward_custom(data, client_side).result()
    for key in ("loss:sum", "custom/distill:sum", "custom/top:mean"):
        assert server.metrics[key] == pytest.approx(local.metrics[key], abs=1e-5), key
    for ours, theirs in zip(server.loss_fn_outputs, local.loss_fn_outputs, strict=True):
        assert (
            ours["logprobs"].to_numpy().shape
            == theirs["logprobs"].to_numpy().shape
            == (len(ours["logprobs"].to_numpy()), 3)
        )
        np.testing.assert_allclose(
            ours["logprobs"].to_numpy(), theirs["logprobs"].to_numpy(), rtol=0, atol=1e-5
        )

    # The same gradients: one identical step from the same initial adapter leaves the same model.
    for client in (server_client, local_client):
        client.optim_step(types.AdamParams(**ADAM)).result()
    scored = [
        types.Datum(
            model_input=d.model_input, loss_fn_inputs={"target_tokens": d.loss_fn_inputs["target_tokens"]}
        )
        for d in data
    ]
    after = [
        c.forward(scored, "cross_entropy").result().loss_fn_outputs for c in (server_client, local_client)
    ]
    for ours, theirs in zip(*after, strict=True):
        np.testing.assert_allclose(
            ours["logprobs"].to_numpy(), theirs["logprobs"].to_numpy(), rtol=0, atol=1e-5
        )
    before = server.loss_fn_outputs[0]["logprobs"].to_numpy()
    assert not np.allclose(after[0][0]["logprobs"].to_numpy(), before, atol=1e-4)  # the step did move it


def test_multi_target_inputs_are_refused_where_they_do_not_fit(service_client, backend, tinker_key):
    import tinker
    from cortex_backend.compat.tinker.names import job_id_for
    from tinker import types

    training = service_client.create_lora_training_client(base_model=TINKER_MODEL, rank=RANK).result()
    tokens = [5, 9, 12, 7]
    wide = types.TensorData.from_numpy(np.array([[9, 3], [12, 4], [7, 5], [1, 6]], np.int64))
    ppo = types.Datum(
        model_input=types.ModelInput.from_ints(tokens),
        loss_fn_inputs={
            "target_tokens": wide,
            "logprobs": types.TensorData.from_numpy(np.zeros(4, np.float32)),
            "advantages": types.TensorData.from_numpy(np.ones(4, np.float32)),
        },
    )
    with pytest.raises(tinker.BadRequestError) as refused:
        training.forward_backward([ppo], "ppo").result()
    message = str(refused.value)
    assert "data[0].loss_fn_inputs.target_tokens" in message and "ppo takes one value per token" in message

    mismatched = types.Datum(
        model_input=types.ModelInput.from_ints(tokens),
        loss_fn_inputs={
            "target_tokens": wide,
            "weights": types.TensorData.from_numpy(np.ones((4, 3), np.float32)),
        },
    )
    with pytest.raises(tinker.BadRequestError) as refused:
        training.forward_backward([mismatched], "cross_entropy").result()
    assert "data[0].loss_fn_inputs.weights" in str(refused.value) and "[4, 3]" in str(refused.value)

    # Our own /v1 data plane: the same rule on the frame, with the tensor named.
    job_id = job_id_for(training.model_id)
    batch = {
        "input_ids": np.array([tokens]),
        "target_tokens": np.array([[[9, 3], [12, 4], [7, 5], [1, 6]]]),
        "logprobs": np.zeros((1, 4), np.float32),
        "advantages": np.ones((1, 4), np.float32),
    }
    with Client(backend.url, tinker_key) as ours:
        with pytest.raises(BadRequestError) as refused:
            ours.forward_backward(job_id, batch, "ppo")
        assert refused.value.code == "unsupported_operation"
        assert refused.value.detail == {"field": "target_tokens"} and "ppo takes one value" in str(
            refused.value
        )
        weights = np.ones((1, 4, 3), np.float32)
        with pytest.raises(BadRequestError) as refused:
            ours.forward_backward(job_id, {**batch, "weights": weights}, "cross_entropy")
        assert refused.value.code == "invalid_batch" and refused.value.detail == {"field": "weights"}
        # and a [B, T, K] cross_entropy frame is served: its logprobs come back [B, T, K]
        done = ours.poll_request(
            job_id,
            ours.forward(job_id, {**batch, "weights": weights[..., :2]}, loss_fn="cross_entropy"),
            120,
        )
        assert list(done["tensors"]["logprobs"].shape) == [1, 4, 2]
