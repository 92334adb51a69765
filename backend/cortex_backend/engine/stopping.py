"""When a sample ends and what its text is: one set of rules for every sampling engine.

A sample ends at the first stop token id (the tokenizer's end-of-sequence token counts unless
`ignore_eos`), at the first token whose decoded text holds a stop string, or at `max_tokens`. The
ending token stays in `tokens` (and `logprobs`); the text leaves out a final stop token and cuts
before a stop string. Engines find stop token ids themselves; stop strings are found here, on the
project's tokenizer, so both engines cut at the same token.
"""

from __future__ import annotations

from typing import Any

from cortex_nb.protocol.schemas.sampling import SamplingParams

from ..tokenizer import Tokenizer


def stop_token_ids(params: SamplingParams, tokenizer: Tokenizer | None, eos_token_id: int | None) -> set[int]:
    ids = set(params.stop_token_ids)
    eos = getattr(tokenizer, "eos_token_id", None) if tokenizer is not None else eos_token_id
    if eos is not None and not params.ignore_eos:
        ids.add(int(eos))
    return ids


def _stop_position(text: str, stops: list[str], search_from: int) -> int | None:
    positions = [text.find(stop, max(0, search_from - len(stop))) for stop in stops]
    found = [position for position in positions if position >= 0]
    return min(found) if found else None


class TextStop:
    """One sample's stop-string search, fed the sample's tokens as they grow.

    Equivalent to decoding after every token and searching the new end of the text; done in strides
    (one decode per `advance` unless a stop string may have appeared), so an engine can check every
    few tokens instead of after each.
    """

    def __init__(self, strings: list[str], tokenizer: Tokenizer) -> None:
        self.strings = strings
        self.tokenizer = tokenizer
        self.longest = max(len(s) for s in strings)
        self.checked = 0  # tokens already searched
        self.text = ""  # decoded text of the first `checked` tokens
        self.cut: int | None = None  # where the text ends, once a stop string was found

    def advance(self, tokens: list[int]) -> int | None:
        """Search tokens[checked:]; return how many tokens the sample keeps if a stop string appeared."""
        if self.cut is not None or len(tokens) <= self.checked:
            return None
        text = self.tokenizer.decode(tokens)
        if _stop_position(text, self.strings, len(self.text) - self.longest) is None:
            self.checked, self.text = len(tokens), text
            return None
        # A stop string is in the new text: find the first token whose text holds it, token by token.
        for end in range(self.checked + 1, len(tokens) + 1):
            text = self.tokenizer.decode(tokens[:end])
            cut = _stop_position(text, self.strings, len(self.text))
            self.checked, self.text = end, text
            if cut is not None:
                self.cut = cut
                self.text = text[:cut]
                return end
        return None


def finish_sample(
    tokens: list[int],
    logprobs: list[float],
    stop_ids: set[int],
    text_stop: TextStop | None,
    tokenizer: Tokenizer | None,
    want_logprobs: bool,
) -> dict[str, Any]:
    """The sample as the API returns it, from the tokens an engine kept (already cut at the stop)."""
    if text_stop is not None and text_stop.cut is not None:
        finish, text = "stop", text_stop.text
    elif tokens and tokens[-1] in stop_ids:
        finish = "stop"
        text = tokenizer.decode(tokens[:-1]) if tokenizer is not None else None
    else:
        finish = "length"
        text = tokenizer.decode(tokens) if tokenizer is not None else None
    return {
        "tokens": tokens,
        "text": text,
        "logprob": float(sum(logprobs)),
        "logprobs": logprobs if want_logprobs else None,
        "finish_reason": finish,
    }
