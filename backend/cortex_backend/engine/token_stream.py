"""Streamed generation: the tokens a decoder drew since its last look, handed on as they are decoded.

A `TokenStreamer` watches one decoding batch. At each look (every step on a CPU, every few on a GPU) it
sends each row's new tokens with their logprobs and the text they add. Text is decoded incrementally
from a short window of tokens (as vLLM does), so a token that ends in the middle of a UTF-8 character
waits for the next one, and a tokenizer that drops a leading space at the start of a decode does not
drop it here. A row stops streaming at its stop token or stop string; the final result stays what
the engine returns (the stream is a preview of it, token for token up to the stop).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

# How far back from the newest token a clean end of text is looked for, and how many tokens may wait for
# one before they go out anyway (a run of bytes that are no text at all, from an untrained model).
LOOK_BACK_TOKENS = 8
MAX_HELD_TOKENS = 64
# What a streamed generate hands each look's news to: a list of {prompt_index, sample_index, tokens,
# logprobs, text} (only rows with new tokens).
TokensCallback = Callable[[list[dict[str, Any]]], None]


class _RowText:
    """One row's incremental detokenization. Text goes out up to a clean end (one that does not end in a
    replacement character, so later tokens cannot change it); `prefix` starts the decoding window one
    piece back, so a tokenizer that drops a word's leading space at the start of a decode keeps it."""

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.prefix = 0
        self.read = 0

    def add(self, tokens: list[int], tokenizer: Any, stop_ids: set[int], final: bool) -> str:
        self.tokens.extend(token for token in tokens if token not in stop_ids)
        if tokenizer is None or len(self.tokens) == self.read:
            return ""
        shown = tokenizer.decode(self.tokens[self.prefix : self.read])
        end = len(self.tokens)
        if not final and end - self.read < MAX_HELD_TOKENS:
            end = self._clean_end(tokenizer)
            if end is None:
                return ""  # an incomplete character: wait for the token that completes it
        text = tokenizer.decode(self.tokens[self.prefix : end])
        self.prefix, self.read = self.read, end
        return text[len(shown) :]

    def _clean_end(self, tokenizer: Any) -> int | None:
        for end in range(len(self.tokens), max(self.read, len(self.tokens) - LOOK_BACK_TOKENS), -1):
            if not tokenizer.decode(self.tokens[self.prefix : end]).endswith("\ufffd"):
                return end
        return None


class TokenStreamer:
    """Sends one batch's newly decoded tokens. Rows are numbered prompt-major (`n` samples per prompt);
    `first_prompt` is the batch's first prompt index in the whole call."""

    def __init__(
        self, send: TokensCallback, rows: int, n: int, first_prompt: int, tokenizer: Any, stop_ids: set[int]
    ) -> None:
        self.send, self.n, self.first_prompt = send, n, first_prompt
        self.tokenizer, self.stop_ids = tokenizer, stop_ids
        self.sent = [0] * rows
        self.text = [_RowText() for _ in range(rows)]

    def look(
        self,
        tokens: torch.Tensor,
        logprobs: torch.Tensor,
        taken: int,
        kept: torch.Tensor,
        final: bool = False,
    ) -> None:
        """Send what rows drew up to `taken` steps, each up to its own end (`kept`); the `final` look also
        sends the text held back."""
        ends = kept.clamp(max=taken).tolist()
        start = min(self.sent)
        if not final and max(end - sent for end, sent in zip(ends, self.sent, strict=True)) <= 0:
            return
        block = tokens[:, start:taken].tolist()
        block_logprobs = logprobs[:, start:taken].tolist()
        self._send(
            ends,
            lambda row, sent, end: (
                block[row][sent - start : end - start],
                block_logprobs[row][sent - start : end - start],
            ),
            final,
        )

    def look_lists(self, tokens: list[list[int]], logprobs: list[list[float]], final: bool = False) -> None:
        """`look` for an engine that keeps each row's tokens as a list, already cut at its stop (vLLM)."""
        self._send(
            [len(row) for row in tokens],
            lambda row, sent, end: (tokens[row][sent:end], logprobs[row][sent:end]),
            final,
        )

    def _send(
        self,
        ends: list[int],
        pick: Callable[[int, int, int], tuple[list[int], list[float]]],
        final: bool,
    ) -> None:
        news = []
        for row, end in enumerate(ends):
            sent = self.sent[row]
            if end <= sent and not (final and self.text[row].read < len(self.text[row].tokens)):
                continue
            new_tokens, new_logprobs = pick(row, sent, end) if end > sent else ([], [])
            prompt_index, sample_index = divmod(row, self.n)
            news.append(
                {
                    "prompt_index": self.first_prompt + prompt_index,
                    "sample_index": sample_index,
                    "tokens": new_tokens,
                    "logprobs": new_logprobs,
                    "text": self.text[row].add(new_tokens, self.tokenizer, self.stop_ids, final),
                }
            )
            self.sent[row] = max(end, sent)
        if news:
            self.send(news)
