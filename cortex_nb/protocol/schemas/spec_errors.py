"""How a refused train spec is told: one line naming the key, in the words `%%cortex train` always used.

The train spec's two forms (the YAML cell and the `training_loop` of `POST /v1/jobs`) are pydantic
models; this turns the first problem pydantic finds into a `SpecError` ("steps: must be >= 1, not 0",
"unknown key stepz; allowed: ..."), with `field` holding the dotted path of the key.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from ..errors import CortexError
from .base import field_path, model_of

# The type of a rule a spec model states itself (`PydanticCustomError(SPEC_RULE, "words")`): its words
# follow the key's path; with a `field` in its context the words are the whole line and name that field.
SPEC_RULE = "spec_rule"


class SpecError(CortexError):
    """The train spec is wrong; the message names the key and what to write instead, `field` its path."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message, code="spec_invalid", detail={"field": field} if field else None)
        self.field = field


def _fields_at(model: type[BaseModel], loc: tuple[Any, ...]) -> dict[str, Any]:
    """The fields (by the key a spec writes) of the object at `loc` of `model`."""
    current: Any = model
    for part in loc:
        if isinstance(part, int):
            continue
        fields = _keyed_fields(current)
        if part not in fields:
            return {}
        current = model_of(fields[part].annotation)
    return _keyed_fields(current)


def _keyed_fields(model: Any) -> dict[str, Any]:
    fields = getattr(model, "model_fields", None) or {}
    return {info.alias or name: info for name, info in fields.items()}


def _number(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _words(error: dict[str, Any], model: type[BaseModel]) -> str:
    kind, ctx, value = error["type"], error.get("ctx") or {}, error.get("input")
    if kind in ("int_type", "int_from_float", "int_parsing"):
        return f"must be a whole number, not {value!r}"
    if kind in ("float_type", "float_parsing", "finite_number"):
        return f"must be a finite number, not {value!r}"
    if kind == "greater_than_equal":
        return f"must be >= {_number(ctx['ge'])}, not {value!r}"
    if kind == "greater_than":
        return f"must be > {_number(ctx['gt'])}, not {value!r}"
    if kind == "less_than_equal":
        return f"must be <= {_number(ctx['le'])}, not {value!r}"
    if kind == "bool_type":
        return f"must be true or false, not {value!r}"
    if kind in ("string_type", "string_too_short"):
        return "must be a non-empty string"
    if kind == "literal_error":
        return f"must be {str(ctx.get('expected', '')).replace(chr(39), '')}, not {value!r}"
    if kind in ("model_type", "dict_type", "model_attributes_type"):
        keys = ", ".join(_fields_at(model, tuple(error["loc"])))
        return f"must be a mapping with keys {keys}"
    return str(error["msg"]).removeprefix("Value error, ")


def spec_error(exc: ValidationError, model: type[BaseModel], missing_hints: dict[str, str]) -> SpecError:
    """The first problem of `exc` (raised validating `model`) as one line. Unknown keys come first, all
    those of one mapping in one line; `missing_hints` says what to write for a missing top-level key."""
    errors = exc.errors(include_url=False)
    unknown = [error for error in errors if error["type"] == "extra_forbidden"]
    if unknown:
        parent = tuple(unknown[0]["loc"][:-1])
        prefix = field_path(parent) + "." if parent else ""
        names = [prefix + str(error["loc"][-1]) for error in unknown if tuple(error["loc"][:-1]) == parent]
        where = f"in {prefix[:-1]} " if prefix else ""
        allowed = ", ".join(_fields_at(model, parent))
        plural = "s" if len(names) > 1 else ""
        return SpecError(f"unknown key{plural} {where}{', '.join(names)}; allowed: {allowed}", names[0])
    error = errors[0]
    loc = tuple(error["loc"])
    path = field_path(loc)
    if error["type"] == SPEC_RULE and (error.get("ctx") or {}).get("field"):
        return SpecError(str(error["msg"]), error["ctx"]["field"])
    if error["type"] == "missing":
        parent = loc[:-1]
        if not parent:
            return SpecError(f"{path}: missing; {missing_hints.get(path, 'it is required')}", path)
        section = field_path(parent)
        required = [key for key, info in _fields_at(model, parent).items() if info.is_required()]
        return SpecError(f"{path}: missing; {section} needs {', '.join(required)}", path)
    words = _words(error, model)
    if not path:
        return SpecError(words[0].upper() + words[1:])
    return SpecError(f"{path}: {words}", path)


M = TypeVar("M", bound=BaseModel)


def parse_spec(model: type[M], raw: Any, missing_hints: dict[str, str]) -> M:
    """`raw` as a `model`, or the `SpecError` naming its first problem."""
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise spec_error(exc, model, missing_hints) from None
