"""tinker-cookbook's own training loops, unmodified, against this backend, offline: its supervised recipe
(`recipes.chat_sl.train` on a local JSONL of the project's arithmetic problems) and its RL recipe
(`recipes.math_rl.train env=arithmetic`), each run as its command line runs it. The tokenizer is found by name
in a local Hugging Face cache made from the registered model's directory (HF_HUB_OFFLINE=1)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from cortex_nb import Client
from cortex_nb.demo_data import addition_problems

from .tinker_fixtures import NEEDS_SDK, TINKER_MODEL

pytestmark = NEEDS_SDK


def _start_recipe(
    module: str, args: dict[str, object], backend, tinker_key: str, hf_home, log_path
) -> subprocess.Popen:
    env = {
        **os.environ,
        "TINKER_API_KEY": tinker_key,
        "HF_HOME": str(hf_home),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "WANDB_MODE": "disabled",
    }
    command = [
        sys.executable,
        "-m",
        module,
        f"base_url={backend.url}",
        f"model_name={TINKER_MODEL}",
        "renderer_name=role_colon",
        f"log_path={log_path}",
        "behavior_if_log_dir_exists=delete",
        *(f"{key}={value}" for key, value in args.items()),
    ]
    output = open(log_path.parent / f"{log_path.name}.out", "w")  # noqa: SIM115
    return subprocess.Popen(command, env=env, stdout=output, stderr=subprocess.STDOUT, text=True)


def _finished(process: subprocess.Popen, log_path) -> list[dict]:
    """Wait for a recipe; it must have exited cleanly and said so. Returns its metrics.jsonl rows."""
    try:
        returncode = process.wait(timeout=600)
    finally:
        if process.poll() is None:
            process.kill()
    output = (log_path.parent / f"{log_path.name}.out").read_text()
    assert returncode == 0 and "Training completed successfully" in output, output[-6000:]
    return [json.loads(line) for line in (log_path / "metrics.jsonl").read_text().splitlines()]


def _final_checkpoints_are_ours(backend, tinker_key: str, log_path) -> None:
    """The recipe's final checkpoints (checkpoints.jsonl) are checkpoints of its model's job, under their tinker:// names."""
    final = [json.loads(line) for line in (log_path / "checkpoints.jsonl").read_text().splitlines()][-1]
    run_id = final["state_path"].removeprefix("tinker://").split("/")[0]
    assert final["state_path"] == f"tinker://{run_id}/weights/final"
    assert final["sampler_path"] == f"tinker://{run_id}/sampler_weights/final"
    with Client(backend.url, tinker_key) as ours:
        saved = {c["checkpoint_id"]: c for c in ours.list_checkpoints(run_id.replace(":", "."))}
    assert saved["final"]["type"] == "resumable" and saved["sampler.final"]["type"] == "weights-only"


def test_cookbook_supervised_and_rl_recipes(backend, tinker_key, hf_home, tmp_path):
    conversations = tmp_path / "arithmetic.jsonl"
    conversations.write_text(
        "".join(
            json.dumps(
                {
                    "messages": [
                        {"role": "user", "content": row["prompt"]},
                        {"role": "assistant", "content": row["completion"]},
                    ]
                }
            )
            + "\n"
            for row in addition_problems(seed=0)
        )
    )
    sl_log, rl_log = tmp_path / "sl", tmp_path / "rl"
    # Both at once, as two users would: each is its own Tinker session and its own job.
    supervised = _start_recipe(
        "tinker_cookbook.recipes.chat_sl.train",
        {
            "dataset": conversations,
            "lora_rank": 8,
            "learning_rate": 1e-2,
            "batch_size": 16,
            "max_steps": 4,
            "max_length": 64,
            "save_every": 0,
            "eval_every": 0,
            "infrequent_eval_every": 0,
        },
        backend,
        tinker_key,
        hf_home,
        sl_log,
    )
    rl = _start_recipe(
        "tinker_cookbook.recipes.math_rl.train",
        {
            "env": "arithmetic",
            "loss_fn": "importance_sampling",
            "lora_rank": 8,
            "learning_rate": 1e-2,
            "groups_per_batch": 2,
            "group_size": 4,
            "max_tokens": 4,
            "max_steps": 2,
            "eval_every": 0,
            "save_every": 0,
        },
        backend,
        tinker_key,
        hf_home,
        rl_log,
    )

    metrics = _finished(supervised, sl_log)
    assert len(metrics) == 4
    # The recipe merges optim_step's metrics into its rows: the backend's own are prefixed, so its `step` column
    # stays the recipe's (0, 1, 2, 3), beside the optimizer's step count.
    assert [row["step"] for row in metrics] == [0, 1, 2, 3]
    assert [row["cortex/step"] for row in metrics] == [1, 2, 3, 4]
    nll = [row["train_mean_nll"] for row in metrics]
    # The recipe passes no seed, so each run starts from its own random LoRA A (B is zero: the first step's NLL is
    # the base model's). At this learning rate the NLL falls in every run; a larger one sometimes spikes.
    assert nll[-1] < 0.9 * nll[0], f"the cookbook's train_mean_nll should fall: {nll}"
    _final_checkpoints_are_ours(backend, tinker_key, sl_log)

    iterations = [row for row in _finished(rl, rl_log) if "env/all/total_episodes" in row]
    assert len(iterations) == 2
    for row in iterations:
        # 2 problems x 4 samples were drawn, scored by the cookbook's own arithmetic checker, and trained on; the
        # trainer's logprobs of the sampled tokens equal the sampler's (KL ~ 0).
        assert row["env/all/total_episodes"] == 8 and row["tokens/sampled"] > 0 and row["tokens/trained"] > 0
        assert "env/all/reward/total" in row and row["optim/kl_sample_train_v1"] == pytest.approx(
            0.0, abs=1e-3
        )
    _final_checkpoints_are_ours(backend, tinker_key, rl_log)
