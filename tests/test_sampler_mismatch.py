"""The live sampler-vs-trainer mismatch of RL losses: |sampler logprob - trainer logprob| over the sampled
tokens, per forward_backward and per step, in the job's progress record. 0 when the sampler has the
trainer's weights; it rises once the trainer moves on without a sync."""

from __future__ import annotations

import numpy as np
import pytest

from cortex_nb import Client
from cortex_nb.job_state import JobState
from cortex_nb.widgets import job_view

from .test_widget_rendering import job_json, polyline_ys

PROMPTS = [[10, 11, 12, 13], [20, 21, 22]]


def rl_batch(prompts, samples, advantages):
    """An importance-sampling batch from sampled completions: position t predicts token t+1; the
    completion positions carry the sampler's logprobs and the sample's advantage, the prompt none."""
    width = max(len(p) + len(s["tokens"]) for p, s in zip(prompts, samples, strict=True)) - 1
    batch = {
        name: np.zeros((len(prompts), width), dtype=dtype)
        for name, dtype in (
            ("input_ids", np.int64),
            ("target_tokens", np.int64),
            ("attention_mask", np.int64),
            ("logprobs", np.float32),
            ("advantages", np.float32),
        )
    }
    for row, (prompt, sample, advantage) in enumerate(zip(prompts, samples, advantages, strict=True)):
        sequence = prompt + sample["tokens"]
        n = len(sequence) - 1
        batch["input_ids"][row, :n] = sequence[:-1]
        batch["target_tokens"][row, :n] = sequence[1:]
        batch["attention_mask"][row, :n] = 1
        start = len(prompt) - 1  # the position that predicts the first sampled token
        batch["logprobs"][row, start:n] = sample["logprobs"]
        batch["advantages"][row, start:n] = advantage
    return batch


@pytest.mark.parametrize("loss_fn", ["importance_sampling", "ppo", "cispo"])
def test_mismatch_is_zero_on_policy_and_rises_after_the_weights_move(backend, loss_fn):
    with Client(backend.url, backend.token) as client:
        job = client.create_training_job("tiny", lora={"r": 4, "alpha": 8}, optimizer={"lr": 0.05}, seed=3)
        try:
            # On policy: the trainer samples with its own weights.
            sampled = job.generate(PROMPTS, max_tokens=8, temperature=1.0, seed=1, logprobs=True).result()
            batch = rl_batch(PROMPTS, sampled.samples, [1.0, -1.0])
            first = job.forward_backward(batch, loss_fn).result()
            metrics = first["metrics"]
            sampled_tokens = sum(len(s["tokens"]) for s in sampled.samples)
            assert metrics["sampler_mismatch_tokens:sum"] == sampled_tokens
            assert metrics["sampler_mismatch:mean"] < 1e-4 and metrics["sampler_mismatch:max"] < 1e-4
            # The reference: the trainer's own logprobs of the same tokens, compared in the test.
            trainer = first["tensors"]["logprobs"]
            sampled_mask = batch["advantages"] != 0
            expected = np.abs(trainer - batch["logprobs"])[sampled_mask]
            assert metrics["sampler_mismatch:max"] == pytest.approx(expected.max(), abs=1e-6)
            step = job.step().result()
            assert step["sampler_mismatch_mean"] == pytest.approx(metrics["sampler_mismatch:mean"], abs=1e-9)
            # Off policy: the same samples after the weights moved, no new sampling.
            stale = job.forward_backward(batch, loss_fn).result()["metrics"]
            assert stale["sampler_mismatch:mean"] > 1e-3 > metrics["sampler_mismatch:mean"]
            later = job.step().result()
            assert later["sampler_mismatch_max"] == pytest.approx(stale["sampler_mismatch:max"], abs=1e-9)
            progress = client.get_job(job.job_id)["progress"]
            assert progress["sampler_mismatch_mean"] == pytest.approx(later["sampler_mismatch_mean"])
            assert progress["sampler_mismatch_max"] == pytest.approx(later["sampler_mismatch_max"])
            curve = [point["sampler_mismatch_mean"] for point in progress["mismatch_history"]]
            assert len(curve) == 2 and curve[0] < 1e-4 < 1e-3 < curve[1]
        finally:
            job.cancel()


def test_cross_entropy_reports_no_mismatch(backend):
    with Client(backend.url, backend.token) as client:
        job = client.create_training_job("tiny", lora={"r": 4, "alpha": 8}, seed=3)
        try:
            batch = {
                "input_ids": np.array([[1, 2, 3]]),
                "target_tokens": np.array([[2, 3, 4]]),
                "weights": np.ones((1, 3), dtype=np.float32),
            }
            metrics = job.forward_backward(batch).result()["metrics"]
            assert not any(name.startswith("sampler_mismatch") for name in metrics)
            assert "sampler_mismatch_mean" not in job.step().result()
        finally:
            job.cancel()


def test_the_widget_charts_the_mismatch():
    """The job widget's chart and text read the progress record's mismatch curve (no backend needed)."""
    curve = [{"step": step, "sampler_mismatch_mean": value} for step, value in ((1, 0.0), (2, 0.1), (3, 0.2))]
    state = JobState("job-render", "rl", "tiny")
    state.set_job(job_json(3, sampler_mismatch_mean=0.2, sampler_mismatch_max=0.9, mismatch_history=curve))
    snap = state.snapshot()
    svg = job_view.mismatch_chart_svg(snap)
    heights = polyline_ys(svg)
    assert len(heights) == 3 and heights[0] > heights[1] > heights[2]  # rising (SVG y grows downward)
    assert "last max 0.9" in svg
    assert "sampler mismatch 0.2" in state.progress_line()
    picture = job_view.static_html(snap, job_view.ViewOptions())
    assert 'alt="sampler-trainer mismatch"' in picture
    # A supervised run has no such curve, and its picture no such chart.
    plain = JobState("job-render", "sft", "tiny")
    plain.set_job(job_json(3))
    assert "mismatch" not in job_view.static_html(plain.snapshot(), job_view.ViewOptions())
