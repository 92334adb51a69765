"""The `%%cortex train` spec: its YAML form (the cell body, `Client.train`'s argument).

The YAML form names data by a file path or a `$variable` and `keep_alive` as a duration; its JSON form,
`training_loop` of `POST /v1/jobs`, is `cortex_nb.protocol.schemas.training_loop.TrainingLoop`, and both
are built from the same parts, so they accept and refuse the same things. Unknown keys are refused (a
typo like `step:` must not silently train with defaults), and every problem is one `SpecError` line
naming the key (`field` holds its dotted path).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, ClassVar

from pydantic import Field, ValidationError, WrapValidator, field_validator
from pydantic_core import PydanticCustomError

from .protocol.checkpoint_format import (  # noqa: F401  (their SDK names)
    AUTO_CHECKPOINT_PREFIX,
    DRAINED_CHECKPOINT_PREFIX,
    FINAL_CHECKPOINT,
)
from .protocol.schemas.base import Body
from .protocol.schemas.spec_errors import SPEC_RULE, SpecError, parse_spec, spec_error
from .protocol.schemas.training_loop import (  # noqa: F401  (their SDK names)
    DATASET_ID,
    MAX_INTEGER,
    MAX_KEEP_ALIVE_S,
    RESUME_CHOICES,
    Count,
    DatasetRef,
    EvalOnDataset,
    InitFrom,
    LoopRules,
    NonEmptyText,
    Resume,
    RetryPolicy,
    SampleSpec,
    SaveSpec,
    TrainingLoop,
    Whole,
)

_DURATION = re.compile(
    r"^\s*(?:(\d+(?:\.\d+)?)\s*h)?\s*(?:(\d+(?:\.\d+)?)\s*m)?\s*(?:(\d+(?:\.\d+)?)\s*s)?\s*$"
)


def _data_ref(value: Any, handler: Any) -> str:
    try:
        return handler(value)
    except ValidationError:
        raise PydanticCustomError(
            SPEC_RULE, "must be a JSONL file path or $variable, e.g. train.jsonl"
        ) from None


class EvalSpec(Body):
    """Held-out loss every `every` steps, on at most `max_rows` rows of a JSONL file or `$variable`."""

    every: Count
    data: NonEmptyText
    max_rows: Count = 64

    _check = field_validator("data", mode="wrap")(_data_ref)


def _as_written(value: Any, handler: Any) -> Any:
    number = handler(value)
    return value if isinstance(value, int) else number


# A number kept as written (the backend's sub-job wants `r: 8`, not `r: 8.0`).
Number = Annotated[float, WrapValidator(_as_written)]


class LoraKeys(Body):
    """What the spec checks of `lora:` itself; the backend checks the rest against the model."""

    r: Number = Field(default=16, ge=1)
    alpha: Number = Field(default=32, ge=1)
    dropout: Number = Field(default=0.0, ge=0, le=1)
    target_modules: Any = None


class OptimizerKeys(Body):
    lr: Number = Field(default=1e-4, gt=0)
    betas: Any = None
    eps: Any = None
    weight_decay: Any = None
    grad_clip: Any = None


LORA_KEYS = tuple(LoraKeys.model_fields)
OPTIMIZER_KEYS = tuple(OptimizerKeys.model_fields)


class TrainSpec(LoopRules):
    """The YAML form of `%%cortex train`."""

    missing_hints: ClassVar[dict[str, str]] = {
        "data": "give a JSONL path or $variable holding the training rows"
    }

    base_model: NonEmptyText = "tiny"
    # Checked as `LoraKeys` / `OptimizerKeys`, kept as the dict of the keys given (the sub-job's own).
    lora: LoraKeys = Field(default_factory=dict)  # type: ignore[assignment]
    optimizer: OptimizerKeys = Field(default_factory=dict)  # type: ignore[assignment]
    data: NonEmptyText
    batch_size: Count = 8
    max_seq_len: int = Field(default=128, ge=2, le=MAX_INTEGER)
    # None: pack text rows, but keep each prompt/completion example in rows of its own (see train_data).
    packing: bool | None = None
    # Recompute activations in the backward pass (a training sub-job setting: less memory, same gradients).
    gradient_checkpointing: bool = False
    # Ranks of the training sub-job, FSDP2 over that many devices (docs/models.md); 1: one process.
    n_gpus: int = Field(default=1, ge=1, le=64)
    steps: Count | None = None
    epochs: float | None = Field(default=None, gt=0)
    eval: EvalSpec | None = None
    sample: SampleSpec | None = None
    save: SaveSpec | None = None
    seed: Whole = 0
    # Seconds the job stays up for sampling after training (0: it completes, freeing its device).
    keep_alive_s: float = Field(default=0.0, ge=0, le=MAX_KEEP_ALIVE_S, alias="keep_alive")
    init_from: InitFrom | None = None
    resume: Resume = "auto"
    # `{max, on, backoff_s}`: a failed attempt is tried again from the run's newest resumable checkpoint.
    retry: RetryPolicy | None = None
    # Device-seconds the run may use (as GET /v1/stats counts them); spent, it stops and saves `final`.
    budget_device_s: float | None = Field(default=None, gt=0, le=MAX_INTEGER, alias="budget")

    _check_data = field_validator("data", mode="wrap")(_data_ref)

    @field_validator("lora", "optimizer")
    @classmethod
    def _keys_given(cls, value: Body) -> dict[str, Any]:
        return value.model_dump(exclude_unset=True)

    @field_validator("keep_alive_s", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> Any:
        return duration_seconds(value)

    @field_validator("budget_device_s", mode="before")
    @classmethod
    def _budget(cls, value: Any) -> Any:
        plain = isinstance(value, str) and re.fullmatch(r"\s*\d+(?:\.\d+)?\s*", value)
        # Plain seconds as a command-line option gives them, or a duration.
        seconds = float(value) if plain else duration_seconds(value)
        if isinstance(seconds, (int, float)) and not isinstance(seconds, bool) and seconds <= 0:
            raise PydanticCustomError(
                SPEC_RULE, f"a budget must be more than 0 device-seconds, not {value!r}"
            )
        return seconds

    def sub_job(self) -> dict[str, Any]:
        """The training sub-job of `POST /v1/jobs` for this spec."""
        return {
            "type": "training",
            "base_model": self.base_model,
            "lora": dict(self.lora),
            "optimizer": dict(self.optimizer),
            "seed": self.seed,
            **({"gradient_checkpointing": True} if self.gradient_checkpointing else {}),
            **({"n_gpus": self.n_gpus} if self.n_gpus != 1 else {}),
        }

    def training_loop(self, dataset_id: str, eval_dataset_id: str | None = None) -> dict[str, Any]:
        """The JSON form (`training_loop` of `POST /v1/jobs`), data named by uploaded dataset ids."""
        if self.eval is not None and eval_dataset_id is None:
            raise ValueError("the spec has eval: give the eval dataset's id")
        loop = TrainingLoop(
            data=DatasetRef(dataset_id=dataset_id),
            eval=None
            if self.eval is None
            else EvalOnDataset(
                every=self.eval.every, dataset_id=eval_dataset_id, max_rows=self.eval.max_rows
            ),
            batch_size=self.batch_size,
            max_seq_len=self.max_seq_len,
            packing=self.packing,
            steps=self.steps,
            epochs=self.epochs,
            sample=self.sample,
            save=self.save,
            seed=self.seed,
            keep_alive_s=self.keep_alive_s,
            init_from=self.init_from,
            resume=self.resume,
            retry=self.retry,
            budget_device_s=self.budget_device_s,
        )
        return loop.normalised()


TOP_LEVEL_KEYS = tuple(info.alias or name for name, info in TrainSpec.model_fields.items())


def accepted_keys() -> tuple[str, ...]:
    return TOP_LEVEL_KEYS


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
    return parse_spec(TrainSpec, raw, TrainSpec.missing_hints)


def parse_budget(value: Any, name: str = "budget") -> float:
    """A run's device-seconds budget from seconds or a duration such as `20s`, `10m`, `1h` (more than 0);
    raises `SpecError` naming `name`."""
    try:
        spec = TrainSpec.model_validate({"data": "x.jsonl", "steps": 1, "budget": value})
    except ValidationError as exc:
        problem = spec_error(exc, TrainSpec, TrainSpec.missing_hints)
        raise SpecError(problem.message.replace("budget", name, 1), name) from None
    return float(spec.budget_device_s)


def parse_training_loop(raw: Any) -> TrainingLoop:
    """Validate the JSON form (`training_loop` of `POST /v1/jobs`); raises `SpecError`."""
    return TrainingLoop.parse(raw)


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


def duration_seconds(value: Any) -> Any:
    """Seconds from a duration such as `90s`, `10m`, `1h30m`; anything but a string is left as it is."""
    if not isinstance(value, str):
        return value
    match = _DURATION.match(value)
    if not value.strip() or match is None or not any(match.groups()):
        raise PydanticCustomError(
            SPEC_RULE, f"{value!r} is not a duration; write seconds or e.g. 90s, 10m, 1h30m"
        )
    hours, minutes, seconds = (float(part or 0) for part in match.groups())
    return hours * 3600 + minutes * 60 + seconds
