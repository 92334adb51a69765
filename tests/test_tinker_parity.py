"""Through the published tinker SDK: LoRA training (cross_entropy, then ppo, cispo, gspo and dro) equals in-process peft (rank, Tinker's
alpha 32, Adam settings), compute_logprobs equals transformers' log-softmax, greedy sampling equals transformers'
generate (CPU, fp32)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cortex_nb import Client

from .reference import reference_base, reference_lora
from .tinker_fixtures import NEEDS_SDK, TINKER_MODEL

pytestmark = NEEDS_SDK

STEPS = 5
TOLERANCE = 1e-5
RANK, SEED = 4, 7
ADAM = {"learning_rate": 1e-2, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.0}
# What Tinker's train_attn + train_mlp + train_unembed mean on a Llama.
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"]


def _examples(rng: np.random.Generator, vocab: int) -> list[dict[str, list]]:
    """Datums of different lengths: tokens, next-token targets, weights (some zero)."""
    examples = []
    for length in (9, 14, 6):
        tokens = rng.integers(3, vocab, size=length + 1).tolist()
        weights = rng.uniform(0.0, 1.5, size=length).round(3)
        weights[: length // 3] = 0.0
        examples.append({"input": tokens[:-1], "target": tokens[1:], "weights": weights.tolist()})
    return examples


def _reference_logprobs(model: torch.nn.Module, tokens: list[int], targets: list[int]) -> torch.Tensor:
    logits = model(input_ids=torch.tensor([tokens])).logits[0].float()
    return torch.log_softmax(logits, dim=-1).gather(-1, torch.tensor(targets)[:, None]).squeeze(-1)


def test_lora_training_sampling_and_logprobs_match_peft_and_transformers(
    service_client, backend, tinker_key, llama_dir, tmp_path
):
    from tinker import types

    vocab = int(reference_base(TINKER_MODEL, llama_dir).config.vocab_size)
    reference = reference_lora(
        reference_base(TINKER_MODEL, llama_dir), r=RANK, alpha=32, seed=SEED, target_modules=TARGETS
    )
    reference.eval()
    parameters = [p for p in reference.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(
        parameters,
        lr=ADAM["learning_rate"],
        betas=(ADAM["beta1"], ADAM["beta2"]),
        eps=ADAM["eps"],
        weight_decay=ADAM["weight_decay"],
    )
    training = service_client.create_lora_training_client(
        base_model=TINKER_MODEL, rank=RANK, seed=SEED
    ).result()
    info = training.get_info()
    assert info.model_data.model_name == TINKER_MODEL and info.lora_rank == RANK and info.is_lora

    rng = np.random.default_rng(5)
    for step in range(STEPS):
        examples = _examples(rng, vocab)
        data = [
            types.Datum(
                model_input=types.ModelInput.from_ints(e["input"]),
                loss_fn_inputs={"target_tokens": e["target"], "weights": e["weights"]},
            )
            for e in examples
        ]
        # Queued back to back, as the cookbook does, before reading either result.
        forward_backward = training.forward_backward(data, "cross_entropy")
        optim = training.optim_step(types.AdamParams(**ADAM))
        result, stepped = forward_backward.result(), optim.result()

        expected_loss = 0.0
        for example, output in zip(examples, result.loss_fn_outputs, strict=True):
            logprobs = _reference_logprobs(reference, example["input"], example["target"])
            expected_loss = expected_loss - (torch.tensor(example["weights"]) * logprobs).sum()
            np.testing.assert_allclose(
                output["logprobs"].to_numpy(), logprobs.detach().numpy(), rtol=0, atol=TOLERANCE
            )
        expected_loss.backward()
        expected_loss = expected_loss.detach()
        optimizer.step()
        optimizer.zero_grad()
        assert result.metrics["loss:sum"] == pytest.approx(
            expected_loss.item(), rel=TOLERANCE, abs=TOLERANCE
        ), f"step {step}"
        assert stepped.metrics["cortex/step"] == step + 1

    # One step of each policy loss on top, each objective from its definition: PPO's clipped objective; CISPO (every
    # token keeps a gradient, weighted by its clipped ratio held constant); GSPO-token (each token carries its
    # sequence's ratio, the geometric mean over the masked positions, with its own gradient); DRO (a quadratic
    # penalty on the log-ratio). Sampling logprobs a little off the current ones, so some ratios clip, and
    # advantages of both signs.
    clip = {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1}
    dro_config = {"beta": 0.3}

    def clipped(ratio):
        return torch.clamp(ratio, clip["clip_low_threshold"], clip["clip_high_threshold"])

    def ppo_objective(logprobs, old, advantages, mask):
        ratio = torch.exp(logprobs - old)
        return torch.minimum(ratio * advantages, clipped(ratio) * advantages)

    def cispo_objective(logprobs, old, advantages, mask):
        return clipped(torch.exp(logprobs - old)).detach() * logprobs * advantages

    def gspo_objective(logprobs, old, advantages, mask):
        sequence_log_ratio = (logprobs.detach() - old)[mask != 0].mean()
        ratio = torch.exp(sequence_log_ratio + logprobs - logprobs.detach())
        return torch.minimum(ratio * advantages, clipped(ratio) * advantages)

    def dro_objective(logprobs, old, advantages, mask):
        return logprobs * advantages - 0.5 * dro_config["beta"] * (logprobs - old) ** 2

    for loss_fn, objective, config in (
        ("ppo", ppo_objective, clip),
        ("cispo", cispo_objective, clip),
        ("gspo", gspo_objective, clip),
        ("dro", dro_objective, dro_config),
    ):
        examples, expected_loss = _examples(rng, vocab), 0.0
        data = []
        for example in examples:
            with torch.no_grad():
                current = _reference_logprobs(reference, example["input"], example["target"])
            noise = torch.from_numpy(rng.normal(0.0, 0.2, size=len(example["target"])))
            example["old"] = (current + noise).float().tolist()
            example["advantages"] = rng.normal(0.0, 1.0, size=len(example["target"])).round(3).tolist()
            # GSPO's ratio over the "completion": every position but the first third
            example["mask"] = [
                0.0 if i < len(example["target"]) // 3 else 1.0 for i in range(len(example["target"]))
            ]
            inputs = {
                "target_tokens": example["target"],
                "logprobs": example["old"],
                "advantages": example["advantages"],
            }
            if loss_fn == "gspo":
                inputs["sequence_ratio_mask"] = example["mask"]
            data.append(
                types.Datum(model_input=types.ModelInput.from_ints(example["input"]), loss_fn_inputs=inputs)
            )
        forward_backward = training.forward_backward(data, loss_fn, config)
        optim = training.optim_step(types.AdamParams(**ADAM))
        result, _ = forward_backward.result(), optim.result()
        for example, output in zip(examples, result.loss_fn_outputs, strict=True):
            logprobs = _reference_logprobs(reference, example["input"], example["target"])
            np.testing.assert_allclose(
                output["logprobs"].to_numpy(), logprobs.detach().numpy(), rtol=0, atol=TOLERANCE
            )
            terms = objective(
                logprobs,
                torch.tensor(example["old"]),
                torch.tensor(example["advantages"]),
                torch.tensor(example["mask"]),
            )
            expected_loss = expected_loss - terms.sum()
        expected_loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        assert result.metrics["loss:sum"] == pytest.approx(
            expected_loss.item(), rel=TOLERANCE, abs=TOLERANCE
        ), loss_fn
        if loss_fn in ("ppo", "cispo"):
            assert 0 < result.metrics["clip_fraction:mean"] < 1, loss_fn

    # The trained weights sample and score exactly as the reference does.
    sampler = training.save_weights_and_get_sampling_client().result()
    prompt = rng.integers(3, vocab, size=7).tolist()
    with torch.no_grad():
        expected_greedy = reference.generate(
            input_ids=torch.tensor([prompt]),
            attention_mask=torch.ones(1, 7, dtype=torch.long),
            max_new_tokens=10,
            do_sample=False,
        )[0, 7:].tolist()
        expected_prompt = [None, *_reference_logprobs(reference, prompt[:-1], prompt[1:]).tolist()]
    greedy = sampler.sample(
        types.ModelInput.from_ints(prompt), 1, types.SamplingParams(max_tokens=10, temperature=0.0)
    ).result()
    assert greedy.sequences[0].tokens == expected_greedy
    scored = sampler.compute_logprobs(types.ModelInput.from_ints(prompt)).result()
    assert scored[0] is None
    np.testing.assert_allclose(scored[1:], expected_prompt[1:], rtol=0, atol=TOLERANCE)

    # The adapter itself: saved for the sampler, it is a checkpoint of the model's job, listed and exportable.
    path = training.save_weights_for_sampler("parity").result().path
    run_id = path.removeprefix("tinker://").split("/")[0]
    assert run_id == training.model_id
    job_id = run_id.replace(":", ".")
    with Client(backend.url, tinker_key) as ours:
        assert "sampler.parity" in [c["checkpoint_id"] for c in ours.list_checkpoints(job_id)]
        exported = ours.export_checkpoint(job_id, "sampler.parity", tmp_path / "adapter")
    from peft import get_peft_model_state_dict
    from safetensors.torch import load_file

    adapter = load_file(str(exported / "adapter_model.safetensors"))
    expected_adapter = get_peft_model_state_dict(reference, save_embedding_layers=False)
    # LoRA on the output layer, and only the LoRA tensors (never a copy of the frozen base layer).
    assert sorted(adapter) == sorted(expected_adapter) and any("lm_head.lora_A" in name for name in adapter)
    assert all("lora_" in name for name in adapter)
    for name, tensor in expected_adapter.items():
        torch.testing.assert_close(adapter[name], tensor.detach(), rtol=0, atol=TOLERANCE, msg=name)


def test_base_model_logprobs_and_greedy_equal_transformers(service_client, llama_dir):
    from tinker import types

    base = reference_base(TINKER_MODEL, llama_dir).eval()
    sampler = service_client.create_sampling_client(base_model=TINKER_MODEL).result()
    assert sampler.get_base_model() == TINKER_MODEL
    prompts = [[5, 17, 33, 2, 60, 41], [70, 12, 7]]
    with torch.no_grad():
        for prompt in prompts:
            scored = sampler.compute_logprobs(types.ModelInput.from_ints(prompt)).result()
            expected = _reference_logprobs(base, prompt[:-1], prompt[1:]).numpy()
            assert scored[0] is None and len(scored) == len(prompt)
            np.testing.assert_allclose(scored[1:], expected, rtol=0, atol=TOLERANCE)
            greedy = sampler.sample(
                types.ModelInput.from_ints(prompt), 1, types.SamplingParams(max_tokens=8, temperature=0)
            ).result()
            reference = base.generate(
                input_ids=torch.tensor([prompt]),
                attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                max_new_tokens=8,
                do_sample=False,
            )[0, len(prompt) :].tolist()
            assert greedy.sequences[0].tokens == reference


def test_forward_backward_custom_trains_as_the_same_loss_in_peft(service_client, llama_dir):
    """A client-side loss (forward_backward_custom) reaches the backend as cross_entropy with weights -dC/dlogprob:
    here C = sum(w * logprob), so the weights sent are -w, negative. One step of it must train exactly as peft
    minimising C does."""
    from tinker import types

    tokens = [5, 17, 33, 2, 60, 41, 9, 12]
    w = [0.0, 0.5, 1.0, -0.25, 2.0, 1.0, 0.75]
    data = [
        types.Datum(
            model_input=types.ModelInput.from_ints(tokens[:-1]),
            loss_fn_inputs={"target_tokens": tokens[1:], "weights": w},
        )
    ]

    def custom(batch, logprobs):
        loss = sum(
            (torch.tensor(d.loss_fn_inputs["weights"].data) * lp).sum()
            for d, lp in zip(batch, logprobs, strict=True)
        )
        return loss, {"custom:sum": float(loss.detach())}

    client = service_client.create_lora_training_client(base_model=TINKER_MODEL, rank=RANK, seed=3).result()
    custom_result = client.forward_backward_custom(data, custom).result()
    client.optim_step(types.AdamParams(**ADAM)).result()
    after = client.forward(data, "cross_entropy").result().loss_fn_outputs[0]["logprobs"].to_numpy()

    reference = reference_lora(
        reference_base(TINKER_MODEL, llama_dir), r=RANK, alpha=32, seed=3, target_modules=TARGETS
    ).eval()
    optimizer = torch.optim.AdamW(
        [p for p in reference.parameters() if p.requires_grad],
        lr=ADAM["learning_rate"],
        betas=(ADAM["beta1"], ADAM["beta2"]),
        eps=ADAM["eps"],
        weight_decay=ADAM["weight_decay"],
    )
    expected_loss = (torch.tensor(w) * _reference_logprobs(reference, tokens[:-1], tokens[1:])).sum()
    expected_loss.backward()
    optimizer.step()
    with torch.no_grad():
        expected_after = _reference_logprobs(reference, tokens[:-1], tokens[1:]).numpy()
    assert custom_result.metrics["custom:sum"] == pytest.approx(
        expected_loss.item(), rel=TOLERANCE, abs=TOLERANCE
    )
    # What the backend computed: cross_entropy with the negative weights -w, whose value is C itself.
    assert custom_result.metrics["surrogate_loss:sum"] == pytest.approx(
        expected_loss.item(), rel=TOLERANCE, abs=TOLERANCE
    )
    np.testing.assert_allclose(after, expected_after, rtol=0, atol=TOLERANCE)


def test_sampling_params_seed_stop_and_truncation(service_client):
    from tinker import types

    sampler = service_client.create_sampling_client(base_model=TINKER_MODEL).result()
    prompt = types.ModelInput.from_ints([5, 17, 33, 2])

    def draw(**params):
        return sampler.sample(prompt, 4, types.SamplingParams(max_tokens=6, **params)).result().sequences

    first, again = draw(temperature=1.0, seed=7), draw(temperature=1.0, seed=7)
    assert [s.tokens for s in first] == [s.tokens for s in again], "a seed replays the samples"
    assert len({tuple(s.tokens) for s in first}) > 1, "num_samples draws differ"
    assert all(len(s.tokens) == len(s.logprobs) <= 6 for s in first)
    greedy = draw(temperature=0.0)[0].tokens
    assert draw(temperature=1.0, top_k=1, seed=3)[0].tokens == greedy, "top_k=1 is greedy"
    never = draw(temperature=0.0, stop=[])[0]  # [] turns off every stop, EOS too
    assert never.stop_reason == "length" and len(never.tokens) == 6 and never.tokens[: len(greedy)] == greedy
    stop, eos = never.tokens[2], 1  # </s> of the test tokenizer
    stopped = draw(temperature=0.0, stop=[stop])[0]  # a stop token, and EOS still
    end = next(i for i, token in enumerate(never.tokens) if token in (stop, eos))
    assert stopped.stop_reason == "stop" and stopped.tokens == never.tokens[: end + 1]
