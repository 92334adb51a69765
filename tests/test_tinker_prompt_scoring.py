"""`target_prompt_logprobs` and `prompt_alt_tokens_k` through the published SDK: the log-probabilities of chosen
ids at chosen prompt positions (dense, or sparse CSR answered in the same layout), and tokens drawn from the
next-token distribution at every prompt position, each checked against transformers' log-softmax of the same model
(CPU, fp32)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from .reference import reference_base
from .tinker_fixtures import NEEDS_SDK, TINKER_MODEL

pytestmark = NEEDS_SDK
TOLERANCE = 1e-5
PROMPT = [5, 17, 33, 2, 60, 41, 9]


@pytest.fixture(scope="module")
def reference_logprobs(llama_dir) -> torch.Tensor:
    """[len(PROMPT) - 1, vocab]: row i is the distribution over prompt token i + 1."""
    base = reference_base(TINKER_MODEL, llama_dir).eval()
    with torch.no_grad():
        return torch.log_softmax(base(input_ids=torch.tensor([PROMPT])).logits[0, :-1].float(), dim=-1)


def test_target_prompt_logprobs_equal_transformers_at_the_ids_asked(service_client, reference_logprobs):
    import tinker
    from tinker import types

    sampler = service_client.create_sampling_client(base_model=TINKER_MODEL).result()
    prompt, one = types.ModelInput.from_ints(PROMPT), types.SamplingParams(max_tokens=1, temperature=0.0)
    rows = len(PROMPT) - 1
    ids = torch.tensor([[PROMPT[i + 1], (7 * i) % 50, -1] for i in range(rows)], dtype=torch.int64)
    ids[0] = torch.tensor([-1, -1, 3])

    dense = sampler.sample(prompt, 1, one, target_prompt_logprobs=types.TensorData.from_torch(ids)).result()
    got = dense.target_prompt_logprobs.to_numpy().reshape(rows, 3)
    expected = reference_logprobs.gather(1, ids.clamp(min=0)).masked_fill(ids < 0, 0.0).numpy()
    np.testing.assert_allclose(got, expected, rtol=0, atol=TOLERANCE)
    assert dense.target_prompt_logprobs.sparse_crow_indices is None

    # sparse in, sparse out: one candidate at the last position, the rest not asked
    only = torch.full((rows, 3), -1, dtype=torch.int64)  # wide enough that the SDK sends it as CSR
    only[rows - 1, 2] = 11
    sparse = types.TensorData.from_torch_sparse(only, pad_value=-1)
    assert sparse.sparse_crow_indices is not None
    answer = sampler.sample(prompt, 1, one, target_prompt_logprobs=sparse).result().target_prompt_logprobs
    assert answer.sparse_crow_indices == sparse.sparse_crow_indices
    assert answer.sparse_col_indices == sparse.sparse_col_indices
    np.testing.assert_allclose(
        np.asarray(answer.data, dtype=np.float32),
        [reference_logprobs[rows - 1, 11].item()],
        rtol=0,
        atol=TOLERANCE,
    )

    for bad in (
        torch.full((rows, 1), -1, dtype=torch.int64),  # asks nothing
        torch.zeros((rows + 1, 1), dtype=torch.int64),  # one row too many
        torch.full((rows, 1), 10**6, dtype=torch.int64),  # beyond the vocabulary
    ):
        with pytest.raises(tinker.BadRequestError, match="target_prompt_logprobs"):
            sampler.sample(prompt, 1, one, target_prompt_logprobs=types.TensorData.from_torch(bad)).result()


def test_prompt_alt_tokens_are_drawn_from_the_models_distribution(service_client, reference_logprobs):
    from tinker import types

    sampler = service_client.create_sampling_client(base_model=TINKER_MODEL).result()
    prompt, k, rows = types.ModelInput.from_ints(PROMPT), 4, len(PROMPT) - 1

    # greedy: every draw is the most likely token, with its own log-probability
    greedy = sampler.sample(
        prompt, 1, types.SamplingParams(max_tokens=1, temperature=0.0), prompt_alt_tokens_k=k
    ).result()
    tokens = greedy.prompt_alt_tokens.tokens.to_numpy().reshape(rows, k)
    logprobs = greedy.prompt_alt_tokens.logprobs.to_numpy().reshape(rows, k)
    best = reference_logprobs.max(-1)
    assert (tokens == best.indices.numpy()[:, None]).all()
    np.testing.assert_allclose(
        logprobs, np.repeat(best.values.numpy()[:, None], k, 1), rtol=0, atol=TOLERANCE
    )

    # sampled with a seed: reproducible, each draw's logprob the model's own at that position
    params = types.SamplingParams(max_tokens=1, temperature=1.0, seed=1234)
    first = sampler.sample(prompt, 1, params, prompt_alt_tokens_k=k).result().prompt_alt_tokens
    again = sampler.sample(prompt, 1, params, prompt_alt_tokens_k=k).result().prompt_alt_tokens
    drawn = first.tokens.to_numpy().reshape(rows, k)
    assert (drawn == again.tokens.to_numpy().reshape(rows, k)).all()
    expected = reference_logprobs.gather(1, torch.from_numpy(drawn.astype(np.int64))).numpy()
    np.testing.assert_allclose(first.logprobs.to_numpy().reshape(rows, k), expected, rtol=0, atol=TOLERANCE)
    assert len(np.unique(drawn)) > 1, "temperature 1 draws more than one token across the prompt"


def test_our_generate_answers_targets_in_their_shape_and_refuses_a_misfit(backend):
    """The same fields on our own `generate` (what the face sends): one matrix per token-id prompt."""
    import time

    import httpx

    headers = {"Authorization": f"Bearer {backend.token}"}
    with httpx.Client(base_url=backend.url, headers=headers, timeout=60) as http:
        job = http.post("/v1/jobs", json={"sub_jobs": [{"type": "sampling", "base_model": "tiny"}]}).json()
        generate = f"/v1/jobs/{job['job_id']}/generate"
        misfit = {"max_tokens": 1, "prompt_logprobs_targets": [[[4]]]}  # 1 row for a 3-token prompt
        refused = http.post(generate, json={"prompts": [[1, 2, 3]], "sampling_params": misfit})
        assert refused.status_code == 400 and refused.json()["error"]["code"] == "invalid_field", refused.text
        params = {"max_tokens": 1, "temperature": 0, "prompt_logprobs_targets": [[[4, -1], [5, 6]]]}
        params["prompt_alt_tokens_k"] = 3
        submitted = http.post(generate, json={"prompts": [[1, 2, 3]], "sampling_params": params})
        assert submitted.status_code == 202, submitted.text
        request = f"/v1/jobs/{job['job_id']}/requests/{submitted.json()['request_id']}"
        deadline = time.monotonic() + 120
        while (status := http.get(request).json())["status"] not in ("succeeded", "failed"):
            assert time.monotonic() < deadline
            time.sleep(0.2)
        assert status["status"] == "succeeded", status
        result = status["result"]
        [[first, second]] = result["prompt_target_logprobs"]
        assert first[1] == 0.0 and first[0] < 0 and all(value < 0 for value in second)
        [alt] = result["prompt_alt_tokens"]
        assert len(alt["token_ids"]) == 2 and all(len(set(row)) == 1 for row in alt["token_ids"])  # greedy
        http.post(f"/v1/jobs/{job['job_id']}/cancel")
