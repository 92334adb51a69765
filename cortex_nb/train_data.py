"""Training rows for `%%cortex train`, the kernel's side: read a JSONL file or a notebook variable,
tokenize with the backend's tokenizer, upload as a dataset. The row shapes are `protocol.train_rows`.

A row is `{"text": ...}` (every token is trained on) or `{"prompt": ..., "completion": ...}` (only the
completion carries loss). The kernel uploads examples as a dataset (`examples_to_jsonl`); the training
worker's managed loop and a kernel's own loop over the primitive API cut them into rows with the same
`pack_examples`, so both train on exactly the same batches.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .protocol.schemas.spec_errors import SpecError
from .protocol.train_rows import (  # noqa: F401  (their SDK names)
    Example,
    PackedData,
    Row,
    example_from_record,
    examples_from_jsonl,
    examples_to_jsonl,
    pack_examples,
)

if TYPE_CHECKING:
    from .api import Api, HasApi

TOKENIZE_CHUNK = 256


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
    return [example_from_record(record, f"${name}[{index}]", key) for index, record in enumerate(records)]


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
        from .link_speed import announce_upload

        announce_upload(api, len(data), "a training dataset")
        api.put_dataset(dataset_id, data)
    return dataset_id
