"""Streamed generate (`stream: true`): tokens arrive as they are decoded, the final result is the plain one,
and a client that leaves mid-stream frees the sampler."""

from __future__ import annotations

import time

import httpx
import numpy as np
import pytest
import torch

from cortex_nb import Client, errors
from cortex_nb.polling import poll_request
from cortex_nb.server_events import server_events

from .notebook_fixtures import run_cell
from .reference import reference_base

PROMPT = [72, 101, 108, 108, 111]
GREEDY_128 = {"max_tokens": 128, "temperature": 0.0, "ignore_eos": True, "logprobs": True}


@pytest.fixture(scope="module")
def sampler(backend):
    with Client(backend.url, backend.token) as client:
        sampler = client.create_sampler("tiny")
        yield sampler
        sampler.cancel()


def without_timing(raw: dict) -> dict:
    """A generate's result less its speed (the one field two runs of the same call need not share)."""
    return {key: value for key, value in raw.items() if key != "tokens_per_second"}


def test_streamed_result_equals_plain_and_transformers(sampler):
    stream = sampler.generate_stream([PROMPT], **GREEDY_128)
    pieces = list(stream)
    plain = sampler.generate([PROMPT], **GREEDY_128).result()
    assert without_timing(stream.result.raw) == without_timing(plain.raw)
    # The pieces, joined, are the final sample: tokens, their logprobs, and the text.
    final = plain.samples[0]
    assert [token for piece in pieces for token in piece["tokens"]] == final["tokens"]
    np.testing.assert_allclose(
        [value for piece in pieces for value in piece["logprobs"]], final["logprobs"], rtol=0, atol=1e-6
    )
    assert "".join(piece["text"] for piece in pieces) == final["text"]
    assert len(pieces) > 1  # one piece per decoding step here (a CPU looks at every step)
    # transformers' own greedy generate on the same base (a fresh sampler's LoRA is the identity).
    model = reference_base("tiny")
    model.eval()
    with torch.no_grad():
        expected = model.generate(
            input_ids=torch.tensor([PROMPT]),
            attention_mask=torch.ones(1, len(PROMPT), dtype=torch.long),
            max_new_tokens=128,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )[0, len(PROMPT) :].tolist()
    assert final["tokens"] == expected


def test_tokens_arrive_before_the_last_is_decoded(sampler):
    """An ordering check as a ratio within one call: the first piece comes well before the end."""
    started = time.perf_counter()
    stream = sampler.generate_stream([PROMPT], **GREEDY_128)
    first = None
    for _ in stream:
        if first is None:
            first = time.perf_counter() - started
    whole = time.perf_counter() - started
    assert len(stream.result.samples[0]["tokens"]) == 128
    assert first < whole / 2, (first, whole)


def test_a_client_that_leaves_frees_the_sampler(sampler):
    stream = sampler.generate_stream([PROMPT], max_tokens=2000, temperature=0.0, ignore_eos=True)
    for _ in stream:
        break
    stream.close()
    request_id = stream.request_id
    with pytest.raises(errors.RequestFailed) as failed:
        poll_request(sampler.api, sampler.job_id, request_id, timeout_s=60)
    assert failed.value.code == "cancelled"
    # The sampler serves the next request (it is not still decoding 2000 tokens for no one).
    after = sampler.generate([PROMPT], max_tokens=4, temperature=0.0).result()
    assert len(after.samples[0]["tokens"]) == 4


def test_the_wire_is_server_sent_events(backend, sampler):
    """The raw reply: `submitted`, `tokens`..., then `result` with the request as polled."""
    url = f"{backend.url}/v1/jobs/{sampler.job_id}/generate"
    body = {"prompts": ["Hi"], "sampling_params": {"max_tokens": 3, "temperature": 0.0}, "stream": True}
    headers = {"Authorization": f"Bearer {backend.token}"}
    with httpx.stream("POST", url, json=body, headers=headers, timeout=60) as response:
        assert response.status_code == 202
        assert response.headers["content-type"].startswith("text/event-stream")
        events = list(server_events(response.iter_lines()))
    names = [name for name, _ in events]
    assert names[0] == "submitted" and names[-1] == "result" and set(names[1:-1]) == {"tokens"}
    result = events[-1][1]
    assert result["status"] == "succeeded" and result["request_id"] == events[0][1]["request_id"]
    streamed = [
        token for name, data in events[1:-1] for piece in data["samples"] for token in piece["tokens"]
    ]
    assert streamed == result["result"]["samples"][0]["tokens"]
    # A bad body is refused as JSON before any stream starts.
    bad = httpx.post(url, json={**body, "prompts": []}, headers=headers, timeout=30)
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_field"


def test_sample_magic_streams_into_the_cell(cortex_shell, sampler):
    ran = run_cell(
        cortex_shell,
        f"%%cortex sample --job {sampler.job_id} --stream --temperature 0 --max-tokens 12\nHello\n",
    )
    assert ran.success, ran.stderr
    frame = ran.result
    plain = sampler.generate(["Hello"], max_tokens=12, temperature=0.0).result()
    assert list(frame["sample"]) == plain.texts
    # The live view ends with the whole text of the sample, as the DataFrame holds it.
    assert f"streamed: {len(plain.tokens[0])} tokens" in ran.stdout
    assert f"[0.0] 'Hello' → {plain.texts[0]}" in ran.stdout
