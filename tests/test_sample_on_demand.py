"""Sampling what you just trained needs no plan: a run that has ended (its device freed, no keep_alive)
answers `job.generate` and `%%cortex sample --job ID` from its `final` checkpoint through a short-lived
sampling job, with the same tokens the run itself gave while it kept its device."""

from __future__ import annotations

from cortex_nb import Client
from cortex_nb.demo_data import addition_problems

from .notebook_fixtures import run_cell

PROMPTS = ["2+3=", "7+5=", "The lighthouse keeper"]
SPEC = {
    "base_model": "tiny",
    "steps": 8,
    "batch_size": 8,
    "max_seq_len": 32,
    "optimizer": {"lr": 0.003},
    "lora": {"r": 8, "alpha": 16},
    "seed": 3,
}


def test_greedy_sampling_a_finished_run_equals_sampling_it_in_keep_alive(client: Client):
    job = client.train({**SPEC, "data": addition_problems(), "keep_alive": "10m"}, name="on-demand")
    kept = job.wait(timeout_s=300)
    assert kept["progress"]["phase"] == "keep_alive"
    live = job.generate(PROMPTS, max_tokens=12, temperature=0.0).result()  # the trainer, still on its device
    assert live.checkpoint_id is None

    ended = job.complete(wait=True)
    assert ended["status"] == "done"
    later = job.generate(PROMPTS, max_tokens=12, temperature=0.0).result()  # no device: sampled on demand
    assert later.tokens == live.tokens and later.texts == live.texts  # token for token
    assert later.checkpoint_id == "final" and later.source_job_id == job.job_id
    assert later.weight_version == live.weight_version == SPEC["steps"]
    assert f"checkpoint final of {job.job_id} (weights v{SPEC['steps']})" in repr(later)
    # The short-lived sampling job was completed before the answer came back; it holds no device.
    sampler = client.get_job(later.sampling_job_id)
    assert sampler["status"] == "done" and sampler["name"] == f"sample {job.job_id}"


def test_sample_magic_on_a_finished_run_names_the_checkpoint_it_sampled(cortex_shell, client: Client):
    job = client.train({**SPEC, "data": addition_problems(), "steps": 3}, name="ended-then-sampled")
    finished = job.wait(timeout_s=300)
    assert finished["status"] == "done"  # no keep_alive: the device is already free
    ran = run_cell(cortex_shell, f"%%cortex sample --job {job.job_id} --temperature 0 --max-tokens 4\n2+3=\n")
    assert ran.success, ran.stderr
    assert list(ran.result["prompt"]) == ["2+3="]
    assert f"job {job.job_id} has ended: sampled its checkpoint 'final' (weights v3)" in ran.stdout


def test_a_finished_run_without_a_checkpoint_says_so(client: Client):
    job = client.create_training_job("tiny", name="nothing-trained")
    job.complete(wait=True)
    import pytest

    from cortex_nb.errors import CortexError

    with pytest.raises(CortexError, match="saved no checkpoint") as refused:
        job.generate(["2+3="], max_tokens=2).result()
    assert refused.value.code == "checkpoint_not_found"


def test_streaming_a_finished_run_streams_its_checkpoint(cortex_shell, client: Client):
    job = client.train({**SPEC, "data": addition_problems(), "steps": 3}, name="ended-then-streamed")
    assert job.wait(timeout_s=300)["status"] == "done"  # no keep_alive: no device to stream from
    plain = job.generate(PROMPTS, max_tokens=10, temperature=0.0).result()  # on demand, not streamed

    stream = job.generate_stream(PROMPTS, max_tokens=10, temperature=0.0)
    pieces = list(stream)
    # Token by token from the checkpoint's sampling job: several pieces per sample, joined the whole sample.
    assert len(pieces) > len(PROMPTS)
    for index, tokens in enumerate(plain.tokens):
        joined = [token for piece in pieces if piece["prompt_index"] == index for token in piece["tokens"]]
        assert joined == tokens
    streamed = stream.result
    assert streamed.tokens == plain.tokens and streamed.texts == plain.texts
    assert streamed.checkpoint_id == "final" and streamed.source_job_id == job.job_id
    assert client.get_job(streamed.sampling_job_id)["status"] == "done"  # its device freed

    ran = run_cell(
        cortex_shell, f"%%cortex sample --job {job.job_id} --stream --temperature 0 --max-tokens 10\n2+3=\n"
    )
    assert ran.success, ran.stderr
    assert list(ran.result["sample"]) == plain.texts[:1]
    assert f"streamed: {len(plain.tokens[0])} tokens" in ran.stdout
    assert "not streamed" not in ran.stdout
    assert f"job {job.job_id} has ended: sampled its checkpoint 'final' (weights v3)" in ran.stdout
