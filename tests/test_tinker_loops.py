"""A supervised loop and an RL loop written the way tinker-cookbook writes them (sl_loop.py, rl_loop.py), on the
project's generated arithmetic data, through the published tinker SDK: the loss falls, then the reward rises.
The jobs they make are ordinary jobs: listed, logged, their checkpoints under `tinker://` paths in
`%cortex checkpoints`."""

from __future__ import annotations

import random

import numpy as np
import pytest

from cortex_nb import Client
from cortex_nb.demo_data import addition_problems, is_correct

from .notebook_fixtures import run_cell
from .tinker_fixtures import NEEDS_SDK, TINKER_MODEL

pytestmark = NEEDS_SDK

SL_STEPS, SL_BATCH, SL_LR = 40, 16, 3e-2
RL_ITERATIONS, RL_PROMPTS, GROUP, RL_LR = 12, 8, 8, 1e-2


def closeness(row: dict[str, str], text: str) -> float:
    """A checkable reward with partial credit: 1 for the exact sum, less the further off, 0 for no number."""
    if is_correct(row["prompt"], text):
        return 1.0
    try:
        return max(0.0, 0.9 - abs(int(text.strip()) - int(row["completion"])) / 10)
    except ValueError:
        return 0.0


def test_supervised_then_rl_loop_learns_arithmetic(
    service_client, backend, tinker_key, llama_dir, cortex_shell
):
    import tinker
    from tinker import types
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(llama_dir / "tokenizer.json"))
    eos = tokenizer.token_to_id("</s>")
    rows = addition_problems(seed=0)

    def datum(row: dict[str, str]) -> types.Datum:
        """Prompt and completion (+ EOS); loss on the completion only, as the cookbook's renderers weight it."""
        prompt, completion = (
            tokenizer.encode(row["prompt"]).ids,
            tokenizer.encode(row["completion"]).ids + [eos],
        )
        tokens = prompt + completion
        return types.Datum(
            model_input=types.ModelInput.from_ints(tokens[:-1]),
            loss_fn_inputs={
                "target_tokens": tokens[1:],
                "weights": [0.0] * (len(prompt) - 1) + [1.0] * len(completion),
            },
        )

    # Supervised: sl_loop.py's shape (linear LR decay, forward_backward + optim_step queued, then read).
    training_client = service_client.create_lora_training_client(
        base_model=TINKER_MODEL, rank=8, seed=0
    ).result()
    nll = []
    for step in range(SL_STEPS):
        batch = [datum(row) for row in random.Random(step).sample(rows, SL_BATCH)]
        adam = tinker.AdamParams(learning_rate=SL_LR * (1 - step / SL_STEPS), beta1=0.9, beta2=0.95, eps=1e-8)
        fwd_bwd_future = training_client.forward_backward(batch, loss_fn="cross_entropy")
        optim_future = training_client.optim_step(adam)
        result = fwd_bwd_future.result()
        optim_future.result()
        weights = [d.loss_fn_inputs["weights"].to_numpy() for d in batch]
        logprobs = [out["logprobs"].to_numpy() for out in result.loss_fn_outputs]
        nll.append(
            -sum(float(lp @ w) for lp, w in zip(logprobs, weights, strict=True))
            / sum(w.sum() for w in weights)
        )
    assert np.mean(nll[-5:]) < 0.6 * np.mean(nll[:5]), f"mean NLL should fall: {nll[:5]} ... {nll[-5:]}"
    state_path = training_client.save_state("sl-final").result().path
    probe_datum = datum(rows[0])
    trained = (
        training_client.forward([probe_datum], "cross_entropy")
        .result()
        .loss_fn_outputs[0]["logprobs"]
        .to_numpy()
    )
    # The saved state loads without its optimizer too, into a new client. (The SDK's deprecated load_state into an
    # existing client sends the same load_weights call; it is not repeated here, to spare a job.)
    weights_only = service_client.create_training_client_from_state(state_path).result()
    loaded = (
        weights_only.forward([probe_datum], "cross_entropy")
        .result()
        .loss_fn_outputs[0]["logprobs"]
        .to_numpy()
    )
    np.testing.assert_allclose(loaded, trained, rtol=0, atol=1e-6)

    # RL: rl_loop.py's shape, from the supervised state (optimizer included): sample a group per prompt from the
    # current weights, advantages = reward - group mean, importance_sampling on the sampled tokens.
    training_client = service_client.create_training_client_from_state_with_optimizer(state_path).result()
    probe = [row for row in rows[:20]]

    def closeness_on_probe(sampling_client, temperature: float, samples: int) -> float:
        """The mean reward on fixed prompts with fixed seeds: a before/after that no iteration's luck moves."""
        futures = [
            sampling_client.sample(
                types.ModelInput.from_ints(tokenizer.encode(row["prompt"]).ids),
                samples,
                types.SamplingParams(max_tokens=3, temperature=temperature, seed=7 + i),
            )
            for i, row in enumerate(probe)
        ]
        return float(
            np.mean(
                [
                    closeness(row, tokenizer.decode([t for t in sequence.tokens if t != eos]))
                    for row, future in zip(probe, futures, strict=True)
                    for sequence in future.result().sequences
                ]
            )
        )

    def measured(sampling_client) -> tuple[float, float]:
        """(greedy, sampled at temperature 1) mean rewards on the probe prompts."""
        return closeness_on_probe(sampling_client, 0.0, 1), closeness_on_probe(sampling_client, 1.0, GROUP)

    before = measured(training_client.save_weights_and_get_sampling_client().result())
    rewards = []
    for iteration in range(RL_ITERATIONS):
        sampling_client = training_client.save_weights_and_get_sampling_client().result()
        batch_rows = random.Random(100 + iteration).sample(rows, RL_PROMPTS)
        prompts = [types.ModelInput.from_ints(tokenizer.encode(row["prompt"]).ids) for row in batch_rows]
        futures = [
            sampling_client.sample(
                prompt, GROUP, types.SamplingParams(max_tokens=3, temperature=1.0, seed=1000 * iteration + i)
            )
            for i, prompt in enumerate(prompts)
        ]
        datums, prompt_lengths, group_rewards = [], [], []
        for row, prompt, future in zip(batch_rows, prompts, futures, strict=True):
            sequences = future.result().sequences
            rewards_g = [
                closeness(row, tokenizer.decode([t for t in s.tokens if t != eos])) for s in sequences
            ]
            group_rewards.append(np.mean(rewards_g))
            advantages = [reward - np.mean(rewards_g) for reward in rewards_g]
            if all(advantage == 0.0 for advantage in advantages):
                continue
            for sequence, advantage in zip(sequences, advantages, strict=True):
                ob_len = prompt.length - 1
                model_input = prompt.append(types.EncodedTextChunk(tokens=sequence.tokens[:-1]))
                prompt_lengths.append(ob_len)
                datums.append(
                    types.Datum(
                        model_input=model_input,
                        loss_fn_inputs={
                            "target_tokens": [0] * ob_len + sequence.tokens,
                            "logprobs": [0.0] * ob_len + sequence.logprobs,
                            "advantages": [0.0] * ob_len + [advantage] * (model_input.length - ob_len),
                        },
                    )
                )
        rewards.append(float(np.mean(group_rewards)))
        if datums:
            fwd_bwd_future = training_client.forward_backward(datums, loss_fn="importance_sampling")
            optim_future = training_client.optim_step(
                tinker.AdamParams(learning_rate=RL_LR, beta1=0.9, beta2=0.95, eps=1e-8)
            )
            trained = fwd_bwd_future.result().loss_fn_outputs[0]["logprobs"].to_numpy()
            optim_future.result()
            # On-policy: the trainer scores the sampled tokens as the sampler did.
            sampled, ob_len = datums[0].loss_fn_inputs["logprobs"].to_numpy(), prompt_lengths[0]
            np.testing.assert_allclose(trained[ob_len:], sampled[ob_len:], rtol=0, atol=1e-4)
    after = measured(training_client.save_weights_and_get_sampling_client().result())
    # Each iteration's mean reward is one draw of 64 samples on other prompts, and which samples are drawn
    # depends on float rounding (concurrent requests share a pass: sample_batching.py), so from one run to
    # the next the loop takes another path and its curve is noisy: with the sampling seeds shifted, 3 runs
    # in 8 of 10 iterations at lr 2e-2 showed no rise of the later half's mean over the earlier half's, and
    # one collapsed. The probe's fixed prompts and seeds measure the policy itself: over 7 shifted runs at
    # this lr, greedy closeness went from 0.29 to 0.50-0.58 and sampled closeness from 0.24 to 0.43-0.56.
    assert rewards, "the loop ran no iteration"
    assert after[0] > before[0] + 0.15, f"greedy answers should get closer: {before[0]:.2f} -> {after[0]:.2f}"
    assert after[1] > before[1] + 0.1, f"sampled answers should get closer: {before[1]:.2f} -> {after[1]:.2f}"

    # Ordinary jobs: listed with logs, checkpoints under their tinker:// names in %cortex checkpoints.
    job_id = training_client.model_id.replace(":", ".")
    with Client(backend.url, tinker_key) as ours:
        listed = {job["job_id"]: job for job in ours.list_jobs()}
        sl_job = state_path.removeprefix("tinker://").split("/")[0].replace(":", ".")
        assert {job_id, sl_job} <= set(listed) and listed[job_id]["name"].startswith(f"tinker {TINKER_MODEL}")
        lines = [line["line"] for line in ours.tail_logs(sl_job)["lines"]]
        assert any("forward_backward=" in line for line in lines) and any("step=" in line for line in lines)
        # The supervised job's progress record, folded from its requests like any primitive loop's.
        progress = ours.get_job(sl_job)["progress"]
        assert progress["source"] == "primitive" and progress["step"] == SL_STEPS
        assert progress["last_checkpoint"] == "sl-final" and progress["loss_per_token"] == pytest.approx(
            nll[-1], rel=1e-4
        )
    listed = run_cell(cortex_shell, "%cortex jobs --limit 200")
    assert listed.success, listed.stderr
    row = listed.result.set_index("job_id").loc[job_id]
    assert (
        row["name"] == f"tinker {TINKER_MODEL} r=8"
        and f"tinker.model_id={training_client.model_id}" in row["labels"]
    )
    shown = run_cell(cortex_shell, f"%cortex checkpoints {sl_job}")
    assert shown.success, shown.stderr
    assert "sl-final" in shown.result["checkpoint_id"].tolist()
