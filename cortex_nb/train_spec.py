"""The `%%cortex train` cell body: a short YAML spec, validated into a `TrainSpec`.

Unknown keys are refused (a typo like `step:` must not silently train with defaults), and every
problem is reported as one `SpecError` line naming the key.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .errors import CortexError

LORA_KEYS = ("r", "alpha", "dropout", "target_modules")
OPTIMIZER_KEYS = ("lr", "betas", "eps", "weight_decay", "grad_clip")
EVAL_KEYS = ("every", "data", "max_rows")
SAMPLE_KEYS = ("every", "prompts", "max_tokens", "temperature")
SAVE_KEYS = ("every", "type")
TOP_LEVEL_KEYS = (
    "base_model", "lora", "optimizer", "data", "batch_size", "max_seq_len", "packing", "steps", "epochs",
    "eval", "sample", "save", "seed",
)


def save_supported() -> bool:
    """`save` in a spec needs checkpoints in the SDK (`TrainingJob.save`)."""
    from .training import TrainingJob

    return callable(getattr(TrainingJob, "save", None))


def accepted_keys() -> tuple[str, ...]:
    return TOP_LEVEL_KEYS if save_supported() else tuple(key for key in TOP_LEVEL_KEYS if key != "save")


class SpecError(CortexError):
    """The train spec is wrong; the message names the key and what to write instead."""

    def __init__(self, message: str) -> None:
        super().__init__(message, code="spec_invalid")


@dataclass
class EvalSpec:
    every: int
    data: str
    max_rows: int = 64


@dataclass
class SampleSpec:
    every: int
    prompts: list[str]
    max_tokens: int = 48
    temperature: float = 0.0


@dataclass
class SaveSpec:
    every: int
    type: str = "resumable"


@dataclass
class TrainSpec:
    data: str
    base_model: str = "tiny"
    lora: dict[str, Any] = field(default_factory=dict)
    optimizer: dict[str, Any] = field(default_factory=dict)
    batch_size: int = 8
    max_seq_len: int = 128
    # None: pack text rows, but keep each prompt/completion example in rows of its own (see train_data).
    packing: bool | None = None
    steps: int | None = None
    epochs: float | None = None
    eval: EvalSpec | None = None
    sample: SampleSpec | None = None
    save: SaveSpec | None = None
    seed: int = 0


def parse_train_spec(text: str) -> TrainSpec:
    """Parse and validate a YAML train spec; raises `SpecError` with one line on any problem."""
    import yaml

    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise SpecError(f"the train spec is not valid YAML{where}: {problem}") from None
    if raw is None:
        raise SpecError("the train spec is empty; give at least `data:` and `steps:` (see %cortex? for the keys)")
    if not isinstance(raw, dict):
        raise SpecError(f"the train spec must be a YAML mapping of keys (base_model, data, steps, ...), not a {type(raw).__name__}")
    _reject_unknown(raw, accepted_keys(), "")
    if "data" not in raw:
        raise SpecError("data: missing; give a JSONL path or $variable holding the training rows")
    spec = TrainSpec(data=_data_ref(raw["data"], "data"))
    if "base_model" in raw:
        spec.base_model = _string(raw["base_model"], "base_model")
    if "lora" in raw:
        spec.lora = _section(raw["lora"], "lora", LORA_KEYS)
        for key in ("r", "alpha"):
            if key in spec.lora:
                _number(spec.lora[key], f"lora.{key}", minimum=1)
        if "dropout" in spec.lora:
            _number(spec.lora["dropout"], "lora.dropout", minimum=0, maximum=1)
    if "optimizer" in raw:
        spec.optimizer = _section(raw["optimizer"], "optimizer", OPTIMIZER_KEYS)
        if "lr" in spec.optimizer:
            _number(spec.optimizer["lr"], "optimizer.lr", minimum=0, strict=True)
    if "batch_size" in raw:
        spec.batch_size = _integer(raw["batch_size"], "batch_size", minimum=1)
    if "max_seq_len" in raw:
        spec.max_seq_len = _integer(raw["max_seq_len"], "max_seq_len", minimum=2)
    if "seed" in raw:
        spec.seed = _integer(raw["seed"], "seed", minimum=0)
    if "packing" in raw:
        if not isinstance(raw["packing"], bool):
            raise SpecError(f"packing: must be true or false, not {raw['packing']!r}")
        spec.packing = raw["packing"]
    has_steps, has_epochs = "steps" in raw, "epochs" in raw
    if has_steps == has_epochs:
        raise SpecError("give exactly one of steps: (optimizer steps) or epochs: (passes over the data)")
    if has_steps:
        spec.steps = _integer(raw["steps"], "steps", minimum=1)
    else:
        spec.epochs = float(_number(raw["epochs"], "epochs", minimum=0, strict=True))
    if "eval" in raw:
        section = _section(raw["eval"], "eval", EVAL_KEYS, required=("every", "data"))
        spec.eval = EvalSpec(
            every=_integer(section["every"], "eval.every", minimum=1),
            data=_data_ref(section["data"], "eval.data"),
            max_rows=_integer(section.get("max_rows", 64), "eval.max_rows", minimum=1),
        )
    if "sample" in raw:
        section = _section(raw["sample"], "sample", SAMPLE_KEYS, required=("every", "prompts"))
        prompts = section["prompts"]
        if isinstance(prompts, str):
            prompts = [prompts]
        if not isinstance(prompts, list) or not prompts or not all(isinstance(p, str) and p for p in prompts):
            raise SpecError("sample.prompts: must be a non-empty list of strings")
        spec.sample = SampleSpec(
            every=_integer(section["every"], "sample.every", minimum=1),
            prompts=prompts,
            max_tokens=_integer(section.get("max_tokens", 48), "sample.max_tokens", minimum=1),
            temperature=float(_number(section.get("temperature", 0.0), "sample.temperature", minimum=0)),
        )
    if "save" in raw:
        section = _section(raw["save"], "save", SAVE_KEYS, required=("every",))
        kind = section.get("type", "resumable")
        if kind not in ("resumable", "weights-only"):
            raise SpecError(f"save.type: must be resumable or weights-only, not {kind!r}")
        spec.save = SaveSpec(every=_integer(section["every"], "save.every", minimum=1), type=kind)
    return spec


# helpers ----------------------------------------------------------------------------------------
def _reject_unknown(mapping: dict[str, Any], allowed: tuple[str, ...], prefix: str) -> None:
    unknown = [str(key) for key in mapping if key not in allowed]
    if unknown:
        names = ", ".join(prefix + key for key in unknown)
        plural = "s" if len(unknown) > 1 else ""
        where = f"in {prefix[:-1]} " if prefix else ""
        raise SpecError(f"unknown key{plural} {where}{names}; allowed: {', '.join(allowed)}")


def _section(value: Any, name: str, allowed: tuple[str, ...], required: tuple[str, ...] = ()) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise SpecError(f"{name}: must be a mapping with keys {', '.join(allowed)}")
    _reject_unknown(value, allowed, name + ".")
    for key in required:
        if key not in value:
            raise SpecError(f"{name}.{key}: missing; {name} needs {', '.join(required)}")
    return dict(value)


def _string(value: Any, name: str) -> str:
    if not isinstance(value, str) or not value:
        raise SpecError(f"{name}: must be a non-empty string")
    return value


def _data_ref(value: Any, name: str) -> str:
    if not isinstance(value, str) or not value:
        raise SpecError(f"{name}: must be a JSONL file path or $variable, e.g. {name}: train.jsonl")
    return value


def _number(value: Any, name: str, minimum: float | None = None, maximum: float | None = None, strict: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SpecError(f"{name}: must be a number, not {value!r}")
    if minimum is not None and (value < minimum or (strict and value == minimum)):
        raise SpecError(f"{name}: must be {'>' if strict else '>='} {minimum:g}, not {value!r}")
    if maximum is not None and value > maximum:
        raise SpecError(f"{name}: must be <= {maximum:g}, not {value!r}")
    return value


def _integer(value: Any, name: str, minimum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(f"{name}: must be a whole number, not {value!r}")
    if minimum is not None and value < minimum:
        raise SpecError(f"{name}: must be >= {minimum}, not {value!r}")
    return value
