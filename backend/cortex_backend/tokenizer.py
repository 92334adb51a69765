"""Tokenizers with one small interface, importable without torch (the service tokenizes too).

The built-in `tiny` model uses bytes as tokens; registered models use their own `tokenizer.json`
through the `tokenizers` library (no remote code, no pickle).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Protocol


class Tokenizer(Protocol):
    vocab_size: int
    bos_token_id: int | None
    eos_token_id: int | None
    pad_token_id: int | None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str: ...


class ByteTokenizer:
    """Token i < 256 is byte i; then BOS, EOS and PAD. Honest and dependency-free."""

    vocab_size = 259
    bos_token_id = 256
    eos_token_id = 257
    pad_token_id = 258

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = list(text.encode("utf-8"))
        return [self.bos_token_id, *ids] if add_special_tokens else ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        data = bytearray()
        for token in ids:
            if token < 256:
                data.append(token)
            elif not skip_special_tokens:
                data.extend({256: b"<s>", 257: b"</s>", 258: b"<pad>"}.get(token, b"<unk>"))
        return data.decode("utf-8", errors="replace")


class FileTokenizer:
    """A Hugging Face fast tokenizer loaded from `tokenizer.json` in a model directory."""

    def __init__(self, model_dir: Path) -> None:
        from tokenizers import Tokenizer as _HFTokenizer

        self._tokenizer = _HFTokenizer.from_file(str(model_dir / "tokenizer.json"))
        self.vocab_size = self._tokenizer.get_vocab_size(with_added_tokens=True)
        settings: dict = {}
        for name in ("config.json", "generation_config.json", "tokenizer_config.json"):
            path = model_dir / name
            if path.exists():
                settings.update({k: v for k, v in json.loads(path.read_text()).items() if v is not None})
        self.bos_token_id = self._special_id(settings, "bos")
        self.eos_token_id = self._special_id(settings, "eos")
        self.pad_token_id = self._special_id(settings, "pad")

    def _special_id(self, settings: dict, kind: str) -> int | None:
        value = settings.get(f"{kind}_token_id")
        if isinstance(value, list):
            value = value[0] if value else None
        if isinstance(value, int):
            return value
        token = settings.get(f"{kind}_token")
        if isinstance(token, dict):
            token = token.get("content")
        if isinstance(token, str):
            return self._tokenizer.token_to_id(token)
        return None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)
