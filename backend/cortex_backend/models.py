"""The model catalog: the built-in `tiny` and models registered from local directories.

A client names a model; it can never make the backend read a path. Registration accepts only
directories whose weights are safetensors and whose config asks for no remote code.
"""

from __future__ import annotations

import dataclasses
import json
import struct
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from cortex_nb.protocol.errors import ApiError
from cortex_nb.protocol.model_names import RULE, is_model_name
from cortex_nb.protocol.quantization import QUANTIZATIONS

from .tokenizer import ByteTokenizer, FileTokenizer, Tokenizer

TINY = "tiny"

# The built-in model: Llama-shaped, random weights from a fixed seed, byte-level tokens.
TINY_CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": ByteTokenizer.vocab_size,
    "hidden_size": 128,
    "intermediate_size": 352,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 2048,
    "bos_token_id": ByteTokenizer.bos_token_id,
    "eos_token_id": ByteTokenizer.eos_token_id,
    "pad_token_id": ByteTokenizer.pad_token_id,
    "tie_word_embeddings": False,
    "rms_norm_eps": 1e-5,
}
TINY_SEED = 1234
TINY_HEAD_SCALE = 10.0


@dataclass(frozen=True)
class ModelInfo:
    name: str
    kind: str  # "builtin" | "local"
    path: Path | None
    config: dict[str, Any]
    # How the base's weights are held: None (the device's precision), "nf4" or "int8" (QLoRA).
    quantization: str | None = None

    @property
    def vocab_size(self) -> int:
        return int(self.config.get("vocab_size") or 0)

    @property
    def max_positions(self) -> int | None:
        value = self.config.get("max_position_embeddings") or self.config.get("n_positions")
        return int(value) if value else None

    @cached_property
    def module_names(self) -> frozenset[str]:
        """The dotted names of the model's weight-holding modules (what LoRA `target_modules` may name),
        read from the safetensors headers (no weights are loaded; torch-free)."""
        if self.kind == "builtin":
            return frozenset(_tiny_module_names(self.config))
        names: set[str] = set()
        for path in sorted(self.path.glob("*.safetensors")) if self.path else []:
            try:
                names.update(key.rsplit(".", 1)[0] for key in _safetensors_keys(path) if "." in key)
            except (OSError, ValueError):
                return frozenset()  # unreadable here: the worker will say what is wrong
        if self.config.get("tie_word_embeddings", True):
            # A tied output layer is saved only as the input embedding, but the model has it (and LoRA can adapt it:
            # Tinker's train_unembed).
            names.add("lm_head")
        return frozenset(names)

    def to_wire(self) -> dict[str, Any]:
        """What a worker needs to load the model (sent over the service-worker channel)."""
        return {
            "name": self.name,
            "kind": self.kind,
            "path": str(self.path) if self.path else None,
            "config": self.config,
            "quantization": self.quantization,
        }

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> ModelInfo:
        path = Path(data["path"]) if data["path"] else None
        return cls(data["name"], data["kind"], path, data["config"], data.get("quantization"))

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "architecture": (self.config.get("architectures") or [self.config.get("model_type")])[0],
            "vocab_size": self.vocab_size,
            "max_positions": self.max_positions,
            "hidden_size": self.config.get("hidden_size") or self.config.get("n_embd"),
            "num_layers": self.config.get("num_hidden_layers") or self.config.get("n_layer"),
            "quantization": self.quantization,
        }


def _tiny_module_names(config: dict[str, Any]) -> list[str]:
    names = ["model.embed_tokens", "model.norm", "lm_head"]
    for layer in range(int(config["num_hidden_layers"])):
        prefix = f"model.layers.{layer}"
        names += [f"{prefix}.self_attn.{p}" for p in ("q_proj", "k_proj", "v_proj", "o_proj")]
        names += [f"{prefix}.mlp.{p}" for p in ("gate_proj", "up_proj", "down_proj")]
        names += [f"{prefix}.input_layernorm", f"{prefix}.post_attention_layernorm"]
    return names


def _safetensors_keys(path: Path) -> list[str]:
    """Tensor names from a safetensors file's JSON header."""
    with open(path, "rb") as handle:
        (size,) = struct.unpack("<Q", handle.read(8))
        if size > 100 * 2**20:
            raise ValueError(f"{path.name}: implausible safetensors header size {size}")
        header = json.loads(handle.read(size))
    return [key for key in header if key != "__metadata__"]


def inspect_model_dir(name: str, path: Path) -> ModelInfo:
    """Check a local Hugging Face directory is safe to load and read its config."""
    if not is_model_name(name) or name == TINY:
        raise ValueError(f"model name {name!r} is not allowed; use {RULE} (and not 'tiny')")
    if not path.is_dir():
        raise ValueError(f"model {name}: {path} is not a directory")
    config_path = path / "config.json"
    if not config_path.exists():
        raise ValueError(f"model {name}: {path} has no config.json")
    config = json.loads(config_path.read_text())
    if config.get("auto_map"):
        raise ValueError(f"model {name}: its config asks for remote code (auto_map); that is never run")
    if not list(path.glob("*.safetensors")):
        raise ValueError(
            f"model {name}: {path} has no *.safetensors weights (pickle checkpoints are never loaded)"
        )
    return ModelInfo(name, "local", path, config)


class ModelCatalog:
    def __init__(self, registered: dict[str, Path], quantize: dict[str, str] | None = None) -> None:
        """`quantize` maps a model name (registered here, or `tiny`) to how its base is held."""
        quantize = dict(quantize or {})
        unknown = sorted(set(quantize) - set(registered) - {TINY})
        if unknown:
            raise ValueError(f"--quantize names models that are not registered: {unknown}")
        for name, kind in quantize.items():
            if kind not in QUANTIZATIONS:
                raise ValueError(f"--quantize {name}={kind}: use one of {list(QUANTIZATIONS)}")
        tiny = ModelInfo(TINY, "builtin", None, dict(TINY_CONFIG), quantize.get(TINY))
        self._models: dict[str, ModelInfo] = {TINY: tiny}
        for name, path in registered.items():
            info = inspect_model_dir(name, path)
            self._models[name] = dataclasses.replace(info, quantization=quantize.get(name))
        self._own = set(self._models)
        self._tokenizers: dict[str, Tokenizer] = {}

    def set_host_models(self, models: dict[str, ModelInfo]) -> None:
        """The models registered on a cluster's hosts now (`cortex-nb host join --model`), beside the
        built-in and this backend's own. Each `path` is a local copy of its config and tokenizer files."""
        for name in [name for name in self._models if name not in self._own and name not in models]:
            del self._models[name]
            self._tokenizers.pop(name, None)
        for name, info in models.items():
            if name not in self._own and self._models.get(name) != info:
                self._models[name] = info
                self._tokenizers.pop(name, None)

    def names(self) -> list[str]:
        return sorted(self._models)

    def get(self, name: Any) -> ModelInfo:
        if not is_model_name(name):
            raise ApiError(
                "invalid_model_name",
                f"base_model must be the name of a registered model, not a path or URL (got {str(name)[:80]!r});"
                f" registered: {self.names()}",
            )
        info = self._models.get(name)
        if info is None:
            raise ApiError(
                "unknown_model", f"no model named {name!r} is registered; registered: {self.names()}"
            )
        return info

    def list(self) -> list[dict[str, Any]]:
        return [self._models[name].to_json() for name in self.names()]

    def quantized(self) -> dict[str, str]:
        """The models whose base is held quantized, by name: `nf4` or `int8` (capacity shows them)."""
        return {name: info.quantization for name, info in sorted(self._models.items()) if info.quantization}

    def tokenizer(self, name: str) -> Tokenizer:
        info = self.get(name)
        if name not in self._tokenizers:
            if info.kind == "builtin":
                self._tokenizers[name] = ByteTokenizer()
            elif info.path is not None and (info.path / "tokenizer.json").exists():
                self._tokenizers[name] = FileTokenizer(info.path)
            else:
                raise ApiError(
                    "unsupported_operation",
                    f"model {name!r} has no tokenizer.json; send token ids instead of text",
                )
        return self._tokenizers[name]
