"""Training rows for `%%cortex train`: read JSONL or a notebook variable, tokenize with the model's
tokenizer, and pack into fixed-length rows.

A row is `{"text": ...}` (every token is trained on) or `{"prompt": ..., "completion": ...}` (only the
completion carries loss). The kernel uploads examples as a dataset (`examples_to_jsonl`); the training
worker's managed loop and a kernel's own loop over the primitive API cut them into rows with the same
`pack_examples`, so both train on exactly the same batches.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .batching import pack_sequences, rows_to_batch
from .train_spec import SpecError

if TYPE_CHECKING:
    from .api import Api, HasApi

TOKENIZE_CHUNK = 256
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


def load_examples(ref: str, namespace: Mapping[str, Any], key: str = "data") -> list[Example]:
    """`ref` is a JSONL path, a plain `.txt` file (one document), or `$name` of a list of dicts or a
    DataFrame in `namespace`."""
    if ref.startswith("$"):
        return _examples_from_variable(ref[1:], namespace, key)
    path = Path(ref).expanduser()
    if not path.is_file():
        raise SpecError(
            f"{key}: no file {ref!r} (looked for {path.resolve()}); give a JSONL path or a $variable"
        )
    if path.suffix == ".txt":
        text = path.read_text(encoding="utf-8")
        if not text.strip():
            raise SpecError(f"{key}: {ref} is empty")
        return [Example(None, text)]
    with path.open(encoding="utf-8") as handle:
        return examples_from_jsonl(handle, ref, key)


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
        examples.append(_example(record, f"{where} line {number}", key))
    if not examples:
        raise SpecError(f"{key}: {where} holds no rows")
    return examples


def examples_to_jsonl(examples: Sequence[Example]) -> bytes:
    """The canonical JSONL of examples (what a dataset upload carries; its SHA-256 is the dataset id)."""
    rows = [
        {"text": e.text} if e.prompt is None else {"prompt": e.prompt, "completion": e.text} for e in examples
    ]
    return "".join(json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n" for row in rows).encode("utf-8")


def _examples_from_variable(name: str, namespace: Mapping[str, Any], key: str) -> list[Example]:
    if name not in namespace:
        raise SpecError(f"{key}: ${name} is not defined in the notebook")
    value = namespace[name]
    if hasattr(value, "to_dict") and hasattr(value, "columns"):  # a pandas DataFrame
        records: Sequence[Any] = value.to_dict("records")
    elif isinstance(value, (list, tuple)):
        records = value
    else:
        raise SpecError(f"{key}: ${name} is a {type(value).__name__}; give a list of dicts or a DataFrame")
    if not records:
        raise SpecError(f"{key}: ${name} is empty")
    return [_example(record, f"${name}[{index}]", key) for index, record in enumerate(records)]


def _example(record: Any, where: str, key: str) -> Example:
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


def tokenize_and_pack(
    client: Api | HasApi, model: str, examples: Sequence[Example], seq_len: int, packing: bool | None = None
) -> PackedData:
    """`pack_examples` with the backend's tokenizer for `model` (`Client.tokenize`)."""
    from .api import api_of

    api = api_of(client)
    info = api.tokenize(model, [])

    def tokenize(texts: list[str], add_special_tokens: bool) -> list[list[int]]:
        return _tokenize(api, model, texts, add_special_tokens)

    return pack_examples(
        examples, tokenize, info.get("eos_token_id"), info.get("pad_token_id"), seq_len, packing
    )


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


def _tokenize(api: Api, model: str, texts: list[str], add_special_tokens: bool) -> list[list[int]]:
    tokens: list[list[int]] = []
    for start in range(0, len(texts), TOKENIZE_CHUNK):
        chunk = texts[start : start + TOKENIZE_CHUNK]
        tokens.extend(api.tokenize(model, chunk, add_special_tokens=add_special_tokens)["tokens"])
    return tokens


def upload_dataset(client: Api | HasApi, data: bytes) -> str:
    """Upload JSONL training rows once; returns the dataset id (their SHA-256). Nothing is sent when the
    backend already has them."""
    from . import errors
    from .api import api_of
    from .protocol import wire

    api = api_of(client)
    dataset_id = wire.sha256_hex(data)
    try:
        api.get_dataset(dataset_id)
    except errors.NotFoundError:
        api.put_dataset(dataset_id, data)
    return dataset_id
