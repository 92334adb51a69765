"""The two kinds of body, the names they share, and how a refused body becomes a stable error.

A `Body` is what a client sends: unknown fields are refused, nothing is coerced ("1" is not 1, 1.5 is
not an integer, true is not a number) and numbers are finite. A `Reply` is what the backend answers: it
reads what the service produced, and a client built against an older minor version reads a newer
backend's replies (fields it does not know are ignored; fields added in a minor version have defaults).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, ClassVar, TypeVar

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from ..errors import ERROR_CODES, ApiError


class Body(BaseModel):
    """A request body. `body_name` names the object in errors about its own unknown fields ("job.color")."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)
    body_name: ClassVar[str | None] = None


class Reply(BaseModel):
    """A response body."""

    model_config = ConfigDict(extra="ignore")


class Query(BaseModel):
    """A route's query parameters, as the strings a URL carries, converted and checked."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)


IDENTIFIER = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
LABEL_KEY = r"^[a-z][a-z0-9_.-]{0,62}$"
MODULE_NAME = r"^[A-Za-z0-9_.]+$"
SHA256_HEX = r"^[0-9a-f]{64}$"
# What a pattern means, for the error a value that does not match it gets.
PATTERN_MEANINGS = {
    IDENTIFIER: "must be 1-64 characters of letters, digits, '_', '.', '-', starting with a letter or digit",
    LABEL_KEY: "label names are lower-case letters, digits, '_', '.', '-' (at most 63)",
    MODULE_NAME: "module names are letters, digits, '_' and '.'",
    SHA256_HEX: "must be the SHA-256 hex (64 lowercase hex digits)",
}

Identifier = Annotated[str, StringConstraints(pattern=IDENTIFIER)]
ShortText = Annotated[str, StringConstraints(max_length=200)]
Seconds = Annotated[float, Field(ge=0)]
# Long polls: the backend holds an answer at most this long; a larger `wait` is taken as this. Stated in the
# schema as `x-maximum-hold` and in the description, not as `maximum`: a schema maximum would make schema-driven
# clients and fuzzers send exactly it, holding each long poll 60 s, and a larger value is not an error.
MAX_WAIT_S = 60.0
WAIT_BOUND_TEXT = f"held at most {MAX_WAIT_S:g} s; a larger wait is taken as {MAX_WAIT_S:g}"
WaitSeconds = Annotated[float, Field(ge=0, json_schema_extra={"x-maximum-hold": MAX_WAIT_S})]
MAX_SEED = 2**63 - 1
# A position in a sequence the backend numbers (events, log lines): what SQLite's INTEGER holds, and more.
MAX_SEQ = 1 << 62
Cursor = Annotated[int, Field(ge=0, le=MAX_SEQ)]
Seed = Annotated[int, Field(ge=0, le=MAX_SEED)]


class ErrorDetail(Reply):
    code: str = Field(description="a stable code from the error table (cortex_nb/protocol/errors.py)")
    message: str = Field(description="what happened and what to do")
    detail: dict[str, Any] = Field(default_factory=dict, description="e.g. `field`, `missing_scopes`")


class ErrorReply(Reply):
    """Every error answer: `{"error": {"code", "message", "detail"}}`."""

    error: ErrorDetail


# --- turning a refused body into an ApiError ------------------------------------------------------

_ORDINARY_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def field_path(loc: tuple[Any, ...]) -> str:
    """`("sub_jobs", 0, "lora", "r")` -> `sub_jobs[0].lora.r` (union member tags left out)."""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif isinstance(part, str) and ("[" in part or "(" in part or part.startswith("function-")):
            continue  # pydantic's name for a union member or validator, not a field
        else:
            path += f".{part}" if path else str(part)
    return path


def _number(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def explain(error: dict[str, Any]) -> str:
    """One pydantic error in the words our API has always used."""
    kind, ctx, value = error["type"], error.get("ctx") or {}, error.get("input")
    if kind == "missing":
        return "is required"
    if kind == "extra_forbidden":
        return "unknown field"
    if kind in ("int_type", "int_parsing", "int_from_float"):
        return f"must be an integer, got {value!r}"
    if kind in ("float_type", "float_parsing"):
        return f"must be a number, got {value!r}"
    if kind == "finite_number":
        return f"must be a finite number, got {value!r}"
    if kind == "greater_than_equal":
        return f"must be at least {_number(ctx['ge'])}, got {value}"
    if kind == "less_than_equal":
        return f"must be at most {_number(ctx['le'])}, got {value}"
    if kind == "greater_than":
        return f"must be greater than {_number(ctx['gt'])}"
    if kind == "less_than":
        return f"must be less than {_number(ctx['lt'])}"
    if kind == "bool_type":
        return "must be true or false"
    if kind in ("string_type", "str_type"):
        return f"must be a string, got {type(value).__name__}"
    if kind == "string_too_long":
        return f"must be a string of at most {ctx['max_length']} characters"
    if kind == "string_too_short":
        return f"must be a string of at least {ctx['min_length']} character(s)"
    if kind == "string_pattern_mismatch":
        return PATTERN_MEANINGS.get(ctx.get("pattern"), f"must match {ctx.get('pattern')}")
    if kind in ("list_type", "tuple_type"):
        return f"must be a list, got {type(value).__name__}"
    if kind == "too_short":
        return f"must have at least {ctx['min_length']} item(s)"
    if kind == "too_long":
        return f"must have at most {ctx['max_length']} item(s)"
    if kind in ("dict_type", "model_type", "model_attributes_type"):
        return f"must be an object, got {type(value).__name__}"
    if kind in ("literal_error", "enum"):
        return f"must be one of {ctx.get('expected')}, got {value!r}"
    return str(error["msg"]).removeprefix("Value error, ")


def _allowed_keys(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str] | None:
    """The field names of the object at `loc` of `model`, where they can be found."""
    current: Any = model
    for part in loc:
        if isinstance(part, int) or current is None:
            continue
        fields = getattr(current, "model_fields", None)
        if not fields or part not in fields:
            return None
        current = model_of(fields[part].annotation)
    fields = getattr(current, "model_fields", None)
    return sorted(fields) if fields else None


def model_of(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = model_of(arg)
        if found is not None:
            return found
    return None


def refusal(exc: ValidationError, model: type[BaseModel], prefix: str = "") -> ApiError:
    """The first problem of a refused body as a stable error naming the field (`detail.field`).

    Unknown fields are reported before anything else, as they always were; a model's own rule may
    raise a code of the error table (a `PydanticCustomError` whose type is the code).
    """
    errors = exc.errors(include_url=False)
    errors.sort(key=lambda error: error["type"] != "extra_forbidden")
    error = errors[0]
    loc = tuple(error["loc"])
    path = field_path(loc)
    if error["type"] == "extra_forbidden" and len(loc) == 1 and getattr(model, "body_name", None):
        path = f"{model.body_name}.{path}"
    field = f"{prefix}.{path}" if prefix and path else (prefix or path)
    message = explain(error)
    if error["type"] == "extra_forbidden":
        allowed = _allowed_keys(model, loc[:-1])
        if allowed:
            message += f"; allowed: {allowed}"
    code = error["type"] if error["type"] in ERROR_CODES else "invalid_field"
    if not field:
        return ApiError(code, message[0].upper() + message[1:] if message else "the body was refused")
    return ApiError(code, f"{field}: {message}", {"field": field})


B = TypeVar("B", bound=BaseModel)


def parse(model: type[B], value: Any, prefix: str = "") -> B:
    """`value` (JSON already decoded) as a `model`, or the `ApiError` naming its first bad field."""
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        raise refusal(exc, model, prefix) from None


# --- rendering a reply ------------------------------------------------------------------------------------


def render(model: type[BaseModel], value: Any, *, strict: bool = False) -> str:
    """`value` (the service's dict, or a model) as JSON text of `model`: the fields it declares, as it
    types them; a non-finite number becomes null. With `strict`, a field of `value` the model does not
    declare raises instead of being left out (tests run the backend so)."""
    return render_bytes(model, value, strict=strict).decode()


def render_bytes(model: type[BaseModel], value: Any, *, strict: bool = False) -> bytes:
    """`render` as the UTF-8 bytes a handler sends: the model's own validator and serializer, called
    directly (no text copy, none of `model_validate`'s keyword handling on every reply)."""
    if isinstance(value, model):
        reply = value
    else:
        reply = model.__pydantic_validator__.validate_python(value)
        if strict and not isinstance(value, BaseModel):
            unknown = undeclared(reply, value)
            if unknown:
                raise TypeError(f"{model.__name__} does not declare {unknown}: add them to its schema")
    return type(reply).__pydantic_serializer__.to_json(reply, exclude_unset=True)


def undeclared(reply: Any, raw: Any, path: str = "") -> list[str]:
    """Paths of the keys in `raw` that the validated `reply` has no field for."""
    if isinstance(reply, BaseModel) and isinstance(raw, dict):
        fields = type(reply).model_fields
        found = [f"{path}{key}" for key in raw if key not in fields]
        for name in fields:
            if name in raw:
                found += undeclared(getattr(reply, name), raw[name], f"{path}{name}.")
        return found
    if isinstance(reply, list) and isinstance(raw, list):
        return [
            item for child, value in zip(reply, raw, strict=False) for item in undeclared(child, value, path)
        ]
    return []
