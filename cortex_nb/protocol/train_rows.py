"""Training rows: examples from JSONL, tokenized and cut into fixed-length rows with loss weights.

A row is `{"text": ...}` (every token is trained on) or `{"prompt": ..., "completion": ...}` (only the
completion carries loss). The kernel uploads examples as a dataset (`examples_to_jsonl`: its SHA-256 is
the dataset id); the training worker's managed loop and a kernel's own loop over the primitive API cut
them into rows with the same `pack_examples`, so both train on exactly the same batches.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .batching import pack_sequences, rows_to_batch
from .schemas.spec_errors import SpecError

Row = tuple[list[int], list[float]]


@dataclass
class Example:
    prompt: str | None
    text: str  # the whole text, or the completion when there is a prompt


@dataclass
class PackedData:
    """Rows of `seq_len + 1` tokens with per-token loss weights, ready for `rows_to_batch`."""

    rows: list[Row]
    examples: int
    tokens: int
    pad_id: int

    def batches(self, batch_size: int, seed: int) -> Iterator[list[Row]]:
        """Shuffled batches, epoch after epoch, each epoch in a fresh order (seeded)."""
        order = list(range(len(self.rows)))
        rng = random.Random(seed)
        while True:
            rng.shuffle(order)
            for start in range(0, len(order), batch_size):
                yield [self.rows[i] for i in order[start : start + batch_size]]

    def steps_per_epoch(self, batch_size: int) -> int:
        return -(-len(self.rows) // batch_size)

    def eval_batches(self, batch_size: int, max_rows: int) -> list[dict[str, Any]]:
        """The first `max_rows` rows, in order, as batches of `batch_size` (for a held-out loss)."""
        rows = self.rows[:max_rows]
        return [rows_to_batch(rows[i : i + batch_size], self.pad_id) for i in range(0, len(rows), batch_size)]


def examples_from_jsonl(lines: Iterable[str], where: str, key: str = "data") -> list[Example]:
    """Examples from JSONL lines (blank lines skipped); `where` names the source in errors."""
    examples = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise SpecError(f"{key}: {where} line {number} is not valid JSON ({exc.msg})") from None
        examples.append(example_from_record(record, f"{where} line {number}", key))
    if not examples:
        raise SpecError(f"{key}: {where} holds no rows")
    return examples


def examples_to_jsonl(examples: Sequence[Example]) -> bytes:
    """The canonical JSONL of examples (what a dataset upload carries; its SHA-256 is the dataset id)."""
    rows = [
        {"text": e.text} if e.prompt is None else {"prompt": e.prompt, "completion": e.text} for e in examples
    ]
    return "".join(json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n" for row in rows).encode("utf-8")


def example_from_record(record: Any, where: str, key: str) -> Example:
    """One row of a dataset (a string is a text row); `where` names it in errors."""
    if isinstance(record, str):
        return Example(None, record)
    if not isinstance(record, Mapping):
        raise SpecError(
            f'{key}: {where} is a {type(record).__name__}; each row needs "text" or "prompt"/"completion"'
        )
    if isinstance(record.get("prompt"), str) and isinstance(record.get("completion"), str):
        return Example(record["prompt"], record["completion"])
    if isinstance(record.get("text"), str):
        return Example(None, record["text"])
    raise SpecError(f'{key}: {where} has neither a "text" string nor "prompt" and "completion" strings')


def pack_examples(
    examples: Sequence[Example],
    tokenize: Callable[[list[str], bool], list[list[int]]],
    eos: int | None,
    pad_id: int | None,
    seq_len: int,
    packing: bool | None = None,
) -> PackedData:
    """Tokenize, end each example with EOS, and cut into rows; prompt tokens get weight 0.

    `tokenize(texts, add_special_tokens)` is the model's tokenizer. With `packing`, examples are
    concatenated and cut into full rows (no padding wasted). Without it, each example gets rows of
    its own (padded in the batch; a long one is cut into several). The default (None) packs plain
    text but not prompt/completion examples: a model trained on packed pairs learns to answer from
    the pairs before it in the row, and then answers a lone prompt badly.
    """
    pad_id = pad_id if pad_id is not None else (eos if eos is not None else 0)
    prompts = [example.prompt for example in examples if example.prompt is not None]
    prompt_tokens = iter(tokenize(prompts, True) if prompts else [])
    plain = [example.text for example in examples if example.prompt is None]
    completions_text = [example.text for example in examples if example.prompt is not None]
    texts_iter = iter(tokenize(plain, True) if plain else [])
    completions_iter = iter(tokenize(completions_text, False) if completions_text else [])
    token_lists: list[list[int]] = []
    weight_lists: list[list[float]] = []
    for example in examples:
        if example.prompt is None:
            tokens = list(next(texts_iter))
            weights = [1.0] * len(tokens)
        else:
            prompt = list(next(prompt_tokens))
            completion = list(next(completions_iter))
            tokens = prompt + completion
            weights = [0.0] * len(prompt) + [1.0] * len(completion)
        if eos is not None:
            tokens.append(eos)
            weights.append(1.0)
        token_lists.append(tokens)
        weight_lists.append(weights)
    total = sum(len(tokens) for tokens in token_lists)
    if packing is None:
        packing = not prompts
    if packing:
        cut = pack_sequences(token_lists, seq_len, weight_lists)
    else:
        cut = [
            row
            for tokens, weights in zip(token_lists, weight_lists, strict=True)
            for row in pack_sequences([tokens], seq_len, [weights])
        ]
    # Rows whose targets all have weight 0 (a long prompt's middle) would add nothing but cost.
    rows = [row for row in cut if sum(row[1][1:]) > 0]
    if not rows:
        raise SpecError("data: no trainable tokens after tokenizing (empty texts or completions?)")
    return PackedData(rows, len(examples), total, int(pad_id))
