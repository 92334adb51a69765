"""The `%%cortex train` spec: the one definition of its keys, in its two forms.

- The YAML cell body (`parse_train_spec`): data named by a file path or a `$variable`.
- The JSON `training_loop` of `POST /v1/jobs` (`parse_training_loop`): the same loop keys, with data
  named by the SHA-256 id of an uploaded dataset and `keep_alive` in seconds (`keep_alive_s`). The
  backend validates it with this module, so both forms accept and refuse exactly the same things.

Unknown keys are refused (a typo like `step:` must not silently train with defaults), and every
problem is reported as one `SpecError` line naming the key (`field` holds its dotted path).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from .errors import CortexError
from .protocol.checkpoint_format import CHECKPOINT_TYPES, RESUMABLE

LORA_KEYS = ("r", "alpha", "dropout", "target_modules")
OPTIMIZER_KEYS = ("lr", "betas", "eps", "weight_decay", "grad_clip")
EVAL_KEYS = ("every", "data", "max_rows")
SAMPLE_KEYS = ("every", "prompts", "max_tokens", "temperature")
SAVE_KEYS = ("every", "type")
TOP_LEVEL_KEYS = (
    "base_model",
    "lora",
    "optimizer",
    "data",
    "batch_size",
    "max_seq_len",
    "packing",
    "steps",
    "epochs",
    "eval",
    "sample",
    "save",
    "seed",
    "keep_alive",
)
# The JSON form: what the training worker's loop needs (the model, LoRA and optimizer go in the sub-job).
LOOP_KEYS = (
    "data",
    "eval",
    "batch_size",
    "max_seq_len",
    "packing",
    "steps",
    "epochs",
    "sample",
    "save",
    "seed",
    "keep_alive_s",
)
LOOP_EVAL_KEYS = ("every", "dataset_id", "max_rows")
# The checkpoint the end of a training is saved as (a managed run's last step, or "Free device" on a job
# with trained steps no checkpoint holds); `final-2`, ... when the name is taken.
FINAL_CHECKPOINT = "final"
DATASET_ID = re.compile(r"^[0-9a-f]{64}\Z")
# The longest keep-alive a spec may ask for: a week, like a job's idle timeout.
MAX_KEEP_ALIVE_S = 7 * 24 * 3600
_DURATION = re.compile(
    r"^\s*(?:(\d+(?:\.\d+)?)\s*h)?\s*(?:(\d+(?:\.\d+)?)\s*m)?\s*(?:(\d+(?:\.\d+)?)\s*s)?\s*$"
)


def save_supported() -> bool:
    """`save` in a spec needs checkpoints in the SDK (`TrainingJob.save`), which this version has."""
    return True


def accepted_keys() -> tuple[str, ...]:
    return TOP_LEVEL_KEYS if save_supported() else tuple(key for key in TOP_LEVEL_KEYS if key != "save")


class SpecError(CortexError):
    """The train spec is wrong; the message names the key and what to write instead, `field` its path."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message, code="spec_invalid", detail={"field": field} if field else None)
        self.field = field


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
    type: str = RESUMABLE


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
    # Seconds the job stays up for sampling after training (0: it completes, freeing its device).
    keep_alive_s: float = 0.0

    def sub_job(self) -> dict[str, Any]:
        """The training sub-job of `POST /v1/jobs` for this spec."""
        return {
            "type": "training",
            "base_model": self.base_model,
            "lora": dict(self.lora),
            "optimizer": dict(self.optimizer),
            "seed": self.seed,
        }

    def training_loop(self, dataset_id: str, eval_dataset_id: str | None = None) -> dict[str, Any]:
        """The JSON form (`training_loop` of `POST /v1/jobs`), data named by uploaded dataset ids."""
        loop: dict[str, Any] = {
            "data": {"dataset_id": dataset_id},
            "batch_size": self.batch_size,
            "max_seq_len": self.max_seq_len,
            "packing": self.packing,
            "steps": self.steps,
            "epochs": self.epochs,
            "seed": self.seed,
            "keep_alive_s": self.keep_alive_s,
        }
        if self.eval is not None:
            if eval_dataset_id is None:
                raise ValueError("the spec has eval: give the eval dataset's id")
            loop["eval"] = {
                "dataset_id": eval_dataset_id,
                "every": self.eval.every,
                "max_rows": self.eval.max_rows,
            }
        if self.sample is not None:
            loop["sample"] = {
                "every": self.sample.every,
                "prompts": list(self.sample.prompts),
                "max_tokens": self.sample.max_tokens,
                "temperature": self.sample.temperature,
            }
        if self.save is not None:
            loop["save"] = {"every": self.save.every, "type": self.save.type}
        return loop

    def planned_steps(self, steps_per_epoch: int) -> int:
        """Optimizer steps this spec asks for, given how many batches one pass over the data makes."""
        if self.steps is not None:
            return self.steps
        return max(1, round(steps_per_epoch * float(self.epochs or 1)))


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
        raise SpecError(
            "the train spec is empty; give at least `data:` and `steps:` (see %cortex? for the keys)"
        )
    if not isinstance(raw, dict):
        raise SpecError(
            f"the train spec must be a YAML mapping of keys (base_model, data, steps, ...), not a {type(raw).__name__}"
        )
    _reject_unknown(raw, accepted_keys(), "")
    if "data" not in raw:
        raise SpecError("data: missing; give a JSONL path or $variable holding the training rows", "data")
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
    if "keep_alive" in raw:
        spec.keep_alive_s = parse_duration(raw["keep_alive"], "keep_alive")
    _parse_loop(raw, spec, "data", _data_ref)
    return spec


def parse_training_loop(raw: Any) -> TrainSpec:
    """Validate the JSON form (`training_loop` of `POST /v1/jobs`). `data` and `eval.data` of the
    result hold dataset ids; the model, LoRA and optimizer come from the job's training sub-job."""
    if not isinstance(raw, dict):
        raise SpecError(f"must be an object with keys {', '.join(LOOP_KEYS)}")
    _reject_unknown(raw, LOOP_KEYS, "")
    if "data" not in raw:
        raise SpecError('data: missing; give {"dataset_id": "<sha256 of the uploaded JSONL>"}', "data")
    data = raw["data"]
    if not isinstance(data, dict) or set(data) != {"dataset_id"}:
        raise SpecError('data: must be {"dataset_id": "<sha256 hex>"}', "data")
    spec = TrainSpec(data=_dataset_id(data["dataset_id"], "data.dataset_id"))
    # null is "not given" in JSON: the YAML form leaves such keys out.
    present = {key: value for key, value in raw.items() if value is not None}
    if "keep_alive_s" in present:
        spec.keep_alive_s = float(
            _number(present["keep_alive_s"], "keep_alive_s", minimum=0, maximum=MAX_KEEP_ALIVE_S)
        )
    _parse_loop(present, spec, "dataset_id", _dataset_id)
    return spec


def spec_from(value: Any) -> tuple[Any, Any, Any]:
    """`Client.train`'s spec argument -> (TrainSpec, data rows or None, eval rows or None).

    A dict may hold the rows themselves (a list of dicts or a DataFrame) under `data` or `eval.data`;
    they come back apart, and the spec names them as variables for `load_examples`.
    """
    if isinstance(value, TrainSpec):
        return value, None, None
    if isinstance(value, str):
        return parse_train_spec(value), None, None
    if not isinstance(value, dict):
        return value, None, None
    import yaml

    def is_rows(data: Any) -> bool:
        return isinstance(data, (list, tuple)) or hasattr(data, "columns")

    raw = dict(value)
    data_rows = eval_rows = None
    if is_rows(raw.get("data")):
        data_rows, raw["data"] = raw["data"], "$rows"
    if isinstance(raw.get("eval"), dict) and is_rows(raw["eval"].get("data")):
        eval_rows = raw["eval"]["data"]
        raw["eval"] = {**raw["eval"], "data": "$eval_rows"}
    return parse_train_spec(yaml.safe_dump(raw)), data_rows, eval_rows


def parse_duration(value: Any, name: str) -> float:
    """Seconds from a number or a duration such as `90s`, `10m`, `1h30m`."""
    if isinstance(value, str):
        match = _DURATION.match(value)
        if not value.strip() or match is None or not any(match.groups()):
            raise SpecError(
                f"{name}: {value!r} is not a duration; write seconds or e.g. 90s, 10m, 1h30m", name
            )
        hours, minutes, seconds = (float(part or 0) for part in match.groups())
        value = hours * 3600 + minutes * 60 + seconds
    return float(_number(value, name, minimum=0, maximum=MAX_KEEP_ALIVE_S))


def _parse_loop(raw: dict[str, Any], spec: TrainSpec, eval_data_key: str, data_ref) -> None:
    """The keys both forms share: batching, length, eval, samples, checkpoints, seed."""
    if "batch_size" in raw:
        spec.batch_size = _integer(raw["batch_size"], "batch_size", minimum=1)
    if "max_seq_len" in raw:
        spec.max_seq_len = _integer(raw["max_seq_len"], "max_seq_len", minimum=2)
    if "seed" in raw:
        spec.seed = _integer(raw["seed"], "seed", minimum=0)
    if "packing" in raw:
        if not isinstance(raw["packing"], bool):
            raise SpecError(f"packing: must be true or false, not {raw['packing']!r}", "packing")
        spec.packing = raw["packing"]
    has_steps, has_epochs = "steps" in raw, "epochs" in raw
    if has_steps == has_epochs:
        raise SpecError(
            "give exactly one of steps: (optimizer steps) or epochs: (passes over the data)", "steps"
        )
    if has_steps:
        spec.steps = _integer(raw["steps"], "steps", minimum=1)
    else:
        spec.epochs = float(_number(raw["epochs"], "epochs", minimum=0, strict=True))
    if "eval" in raw:
        keys = (*EVAL_KEYS[:1], eval_data_key, *EVAL_KEYS[2:])
        section = _section(raw["eval"], "eval", keys, required=("every", eval_data_key))
        spec.eval = EvalSpec(
            every=_integer(section["every"], "eval.every", minimum=1),
            data=data_ref(section[eval_data_key], f"eval.{eval_data_key}"),
            max_rows=_integer(section.get("max_rows", 64), "eval.max_rows", minimum=1),
        )
    if "sample" in raw:
        section = _section(raw["sample"], "sample", SAMPLE_KEYS, required=("every", "prompts"))
        prompts = section["prompts"]
        if isinstance(prompts, str):
            prompts = [prompts]
        if not isinstance(prompts, list) or not prompts or not all(isinstance(p, str) and p for p in prompts):
            raise SpecError("sample.prompts: must be a non-empty list of strings", "sample.prompts")
        spec.sample = SampleSpec(
            every=_integer(section["every"], "sample.every", minimum=1),
            prompts=prompts,
            max_tokens=_integer(section.get("max_tokens", 48), "sample.max_tokens", minimum=1),
            temperature=float(_number(section.get("temperature", 0.0), "sample.temperature", minimum=0)),
        )
    if "save" in raw:
        section = _section(raw["save"], "save", SAVE_KEYS, required=("every",))
        kind = section.get("type", RESUMABLE)
        if kind not in CHECKPOINT_TYPES:
            raise SpecError(f"save.type: must be resumable or weights-only, not {kind!r}", "save.type")
        spec.save = SaveSpec(every=_integer(section["every"], "save.every", minimum=1), type=kind)


# helpers ----------------------------------------------------------------------------------------
def _reject_unknown(mapping: dict[str, Any], allowed: tuple[str, ...], prefix: str) -> None:
    unknown = [str(key) for key in mapping if key not in allowed]
    if unknown:
        names = ", ".join(prefix + key for key in unknown)
        plural = "s" if len(unknown) > 1 else ""
        where = f"in {prefix[:-1]} " if prefix else ""
        raise SpecError(
            f"unknown key{plural} {where}{names}; allowed: {', '.join(allowed)}", prefix + unknown[0]
        )


def _section(
    value: Any, name: str, allowed: tuple[str, ...], required: tuple[str, ...] = ()
) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise SpecError(f"{name}: must be a mapping with keys {', '.join(allowed)}", name)
    _reject_unknown(value, allowed, name + ".")
    for key in required:
        if key not in value:
            raise SpecError(f"{name}.{key}: missing; {name} needs {', '.join(required)}", f"{name}.{key}")
    return dict(value)


def _string(value: Any, name: str) -> str:
    if not isinstance(value, str) or not value:
        raise SpecError(f"{name}: must be a non-empty string", name)
    return value


def _data_ref(value: Any, name: str) -> str:
    if not isinstance(value, str) or not value:
        raise SpecError(f"{name}: must be a JSONL file path or $variable, e.g. {name}: train.jsonl", name)
    return value


def _dataset_id(value: Any, name: str) -> str:
    if not isinstance(value, str) or not DATASET_ID.match(value):
        raise SpecError(
            f"{name}: must be the SHA-256 hex of an uploaded dataset (PUT /v1/datasets/{{dataset_id}})", name
        )
    return value


def _number(
    value: Any, name: str, minimum: float | None = None, maximum: float | None = None, strict: bool = False
) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise SpecError(f"{name}: must be a finite number, not {value!r}", name)
    if minimum is not None and (value < minimum or (strict and value == minimum)):
        raise SpecError(f"{name}: must be {'>' if strict else '>='} {minimum:g}, not {value!r}", name)
    if maximum is not None and value > maximum:
        raise SpecError(f"{name}: must be <= {maximum:g}, not {value!r}", name)
    return value


# No count in a spec needs more; a bound keeps absurd values out of the loop's arithmetic.
MAX_INTEGER = 1 << 53


def _integer(value: Any, name: str, minimum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(f"{name}: must be a whole number, not {value!r}", name)
    if minimum is not None and value < minimum:
        raise SpecError(f"{name}: must be >= {minimum}, not {value!r}", name)
    if value > MAX_INTEGER:
        raise SpecError(f"{name}: must be <= {MAX_INTEGER}, not {value!r}", name)
    return value
