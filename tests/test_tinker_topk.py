"""`topk_prompt_logprobs` and `topk_sample_logprobs` through the published SDK: the k most likely tokens at each
prompt position, as the SDK's dense [len, k] TopkLogprobs (the first position, and with `prompt_logprobs_last_n` all
before the last n, are its mask), and at each sampled position, equal transformers' top-k of the log-softmax of the
same model (CPU, fp32)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from .reference import reference_base
from .tinker_fixtures import NEEDS_SDK, TINKER_MODEL

pytestmark = NEEDS_SDK
TOLERANCE = 1e-5
K = 5


def test_prompt_and_sample_topk_logprobs_equal_transformers_topk(service_client, llama_dir):
    import tinker
    from tinker import types

    base = reference_base(TINKER_MODEL, llama_dir).eval()
    prompt = [5, 17, 33, 2, 60, 41, 9]
    with torch.no_grad():
        logprobs = torch.log_softmax(base(input_ids=torch.tensor([prompt])).logits[0, :-1].float(), dim=-1)
    expected_values, expected_ids = logprobs.topk(K, dim=-1)

    sampler = service_client.create_sampling_client(base_model=TINKER_MODEL).result()
    greedy = types.SamplingParams(max_tokens=2, temperature=0.0)
    answer = sampler.sample(
        types.ModelInput.from_ints(prompt), 1, greedy, include_prompt_logprobs=True, topk_prompt_logprobs=K
    ).result()
    topk = answer.topk_prompt_logprobs
    assert len(topk) == len(prompt) and topk[0] is None
    for position, row in enumerate(topk[1:]):
        assert [token for token, _ in row] == expected_ids[position].tolist()
        np.testing.assert_allclose(
            [value for _, value in row], expected_values[position].numpy(), rtol=0, atol=TOLERANCE
        )
    # the prompt's own logprobs agree with its top-k where the prompt token is among them
    assert answer.prompt_logprobs[0] is None and len(answer.prompt_logprobs) == len(prompt)

    # only the last n positions, the rest masked as the SDK marks them
    last = sampler.sample(
        types.ModelInput.from_ints(prompt),
        1,
        greedy,
        include_prompt_logprobs=True,
        topk_prompt_logprobs=K,
        prompt_logprobs_last_n=2,
    ).result()
    assert last.topk_prompt_logprobs[:-2] == [None] * (len(prompt) - 2)
    assert [token for token, _ in last.topk_prompt_logprobs[-1]] == expected_ids[-1].tolist()

    # topk_sample_logprobs: at each sampled position, the model's own top-k given the prompt and the tokens
    # sampled before it (greedy here, so the first entry is the sampled token itself)
    sampled = sampler.sample(
        types.ModelInput.from_ints(prompt),
        1,
        types.SamplingParams(max_tokens=4, temperature=0.0),
        topk_sample_logprobs=K,
    ).result()
    sequence = sampled.sequences[0]
    with torch.no_grad():
        logits = base(input_ids=torch.tensor([prompt + sequence.tokens[:-1]])).logits[0, len(prompt) - 1 :]
        values, ids = torch.log_softmax(logits.float(), dim=-1).topk(K, dim=-1)
    assert len(sequence.topk_logprobs) == len(sequence.tokens)
    for position, row in enumerate(sequence.topk_logprobs):
        assert [token for token, _ in row] == ids[position].tolist()
        assert row[0][0] == sequence.tokens[position]
        np.testing.assert_allclose(
            [value for _, value in row], values[position].numpy(), rtol=0, atol=TOLERANCE
        )

    # more than the sampler gives is refused at once, naming the field
    with pytest.raises(tinker.BadRequestError, match="topk_prompt_logprobs"):
        sampler.sample(types.ModelInput.from_ints(prompt), 1, greedy, topk_prompt_logprobs=21).result()
