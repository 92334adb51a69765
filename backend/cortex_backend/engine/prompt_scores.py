"""Log-probabilities of the prompts themselves under a sub-job's own model (`prompt_logprobs`,
`prompt_logprobs_topk`, `prompt_logprobs_targets` and `prompt_alt_tokens_k` of `generate`): one forward over
the left-padded prompts, on either engine. Log-probabilities are the model's own (temperature 1, no
truncation); `prompt_alt_tokens_k` draws tokens from each position's next-token distribution.
"""

from __future__ import annotations

import torch

from .model_state import ModelState


def prompt_logprobs_of(
    logits: torch.Tensor, input_ids: torch.Tensor, lengths: list[int]
) -> list[list[float]]:
    """log p(prompt token t | tokens before it) for t >= 1, from the prefill's logits (left-padded rows)."""
    logprobs = (
        torch.log_softmax(logits[:, :-1].float(), dim=-1).gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    )
    width = input_ids.shape[1]
    return [
        row[width - length :] if length > 1 else []
        for row, length in zip(logprobs.tolist(), lengths, strict=True)
    ]


def prompt_logprobs(state: ModelState, prompts: list[list[int]]) -> list[list[float]]:
    """Each prompt's logprobs (token t >= 1 given the tokens before it) from the sub-job's own model."""
    with state.inference():
        logits, input_ids = prompt_logits(state, prompts)
        return prompt_logprobs_of(logits, input_ids, [len(prompt) for prompt in prompts])


def prompt_topk_logprobs(state: ModelState, prompts: list[list[int]], k: int) -> list[dict[str, list]]:
    """Each prompt's k most likely tokens at every position t >= 1 (given the tokens before it), most likely
    first: `{"token_ids": [[...k]] * (len - 1), "logprobs": [[...k]] * (len - 1)}`, under the model's own
    distribution (temperature 1, no truncation), like `prompt_logprobs`."""
    with state.inference():
        logits, input_ids = prompt_logits(state, prompts)
        values, ids = torch.log_softmax(logits[:, :-1].float(), dim=-1).topk(k, dim=-1)
    width = input_ids.shape[1]
    return [
        {
            "token_ids": ids[row, width - len(prompt) :].tolist() if len(prompt) > 1 else [],
            "logprobs": values[row, width - len(prompt) :].tolist() if len(prompt) > 1 else [],
        }
        for row, prompt in enumerate(prompts)
    ]


def prompt_logits(state: ModelState, prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """One forward over the left-padded prompts (in `state.inference()`): its logits and input ids."""
    width = max(len(prompt) for prompt in prompts)
    input_ids = torch.zeros((len(prompts), width), dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, prompt in enumerate(prompts):
        input_ids[i, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
        mask[i, width - len(prompt) :] = 1
    input_ids, mask = input_ids.to(state.device), mask.to(state.device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    logits = state.model(
        input_ids=input_ids, attention_mask=mask, position_ids=positions, use_cache=False
    ).logits
    return logits, input_ids


def _prompt_log_softmax(state: ModelState, prompts: list[list[int]]) -> tuple[torch.Tensor, int]:
    """[batch, width - 1, vocab] log-probabilities of each next token (left-padded), and the width."""
    with state.inference():
        logits, input_ids = prompt_logits(state, prompts)
        return torch.log_softmax(logits[:, :-1].float(), dim=-1), input_ids.shape[1]


def prompt_target_logprobs(
    state: ModelState, prompts: list[list[int]], targets: list[list[list[int]]]
) -> list[list[list[float]]]:
    """Per prompt, `targets[i][j]`'s log-probability at prompt position i + 1 (0.0 where the id is -1)."""
    logprobs, width = _prompt_log_softmax(state, prompts)
    vocab = logprobs.shape[-1]
    answers = []
    for row, (prompt, matrix) in enumerate(zip(prompts, targets, strict=True)):
        ids = torch.tensor(matrix, dtype=torch.long, device=logprobs.device)
        if int(ids.max()) >= vocab:
            raise ValueError(
                f"prompt_logprobs_targets: token id {int(ids.max())} is beyond the vocabulary ({vocab})"
            )
        positions = logprobs[row, width - len(prompt) :]  # [len - 1, vocab]
        picked = positions.gather(1, ids.clamp(min=0))
        answers.append(torch.where(ids >= 0, picked, torch.zeros_like(picked)).tolist())
    return answers


def prompt_alt_tokens(
    state: ModelState, prompts: list[list[int]], k: int, temperature: float, seed: int | None
) -> list[dict[str, list]]:
    """Per prompt, k draws (with replacement) at each position after the first, at `temperature` (0: the most
    likely token, k times), reproducible under `seed`: `{"token_ids": [[k]] * (len - 1), "logprobs": [[k]] * ...}`."""
    logprobs, width = _prompt_log_softmax(state, prompts)
    generator = torch.Generator(device="cpu")
    if seed is not None:
        generator.manual_seed(seed)
    answers = []
    for row, prompt in enumerate(prompts):
        positions = logprobs[row, width - len(prompt) :].cpu()  # [len - 1, vocab]
        if temperature == 0:
            ids = positions.argmax(-1, keepdim=True).expand(-1, k)
        else:
            probabilities = torch.softmax(positions / temperature, dim=-1)
            ids = torch.multinomial(probabilities, k, replacement=True, generator=generator)
        answers.append({"token_ids": ids.tolist(), "logprobs": positions.gather(1, ids).tolist()})
    return answers
