"""The `cortex.yaml` run spec on the kernel side: read it from YAML and check it with its one definition,
`cortex_nb.protocol.schemas.run_spec.RunSpec` (the backend checks it again with the same model).

A spec that breaks a rule raises `BadRequestError` with code `spec_invalid` and `detail.field` naming
the offending field (dotted: `outputs.metrics.max_bytes`). Unknown keys are refused, never ignored.
"""

from __future__ import annotations

from typing import Any

from .errors import BadRequestError
from .protocol.errors import ApiError
from .protocol.schemas import run_spec as _rules
from .protocol.schemas.run_spec import (  # noqa: F401  (their SDK names)
    DEFAULT_OUTPUT_BYTES,
    DEFAULT_TIMEOUT_S,
    GIB,
    ISOLATION_BEST_EFFORT,
    ISOLATION_MODES,
    ISOLATION_REQUIRED,
    LABEL_KEY_PATTERN,
    MAX_BACKOFF_S,
    MAX_COMMAND_ARGS,
    MAX_GPUS,
    MAX_INCLUDES,
    MAX_INPUT_BYTES,
    MAX_INPUTS,
    MAX_LABELS,
    MAX_MODELS,
    MAX_OUTPUT_BYTES,
    MAX_OUTPUTS,
    MAX_OUTPUTS_TOTAL_BYTES,
    MAX_RETRIES,
    MAX_SOURCE_BYTES,
    MAX_SOURCE_FILES,
    MAX_TIMEOUT_S,
    MIB,
    MODELS_DIR,
    NAME_PATTERN,
    RETRY_REASONS,
    SPEC_VERSION,
    RunSpec,
)


def _bad_request(error: ApiError) -> BadRequestError:
    return BadRequestError(error.message, code=error.code, status=400, detail=error.detail)


def spec_error(field: str, message: str) -> BadRequestError:
    return _bad_request(_rules.spec_error(field, message))


def relative_path(value: Any, field: str) -> str:
    """A clean relative POSIX path inside the work dir (no '..', no absolute path, not under models/)."""
    try:
        return _rules.relative_path(value, field)
    except ApiError as exc:
        raise _bad_request(exc) from None


def validate_spec(raw: Any) -> dict[str, Any]:
    """Check a parsed spec and return it normalised (defaults filled in, paths cleaned)."""
    try:
        return RunSpec.parse(raw).normalised()
    except ApiError as exc:
        raise _bad_request(exc) from None


def parse_spec_text(text: str) -> dict[str, Any]:
    """Parse YAML (JSON is YAML too) and validate it."""
    import yaml

    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise BadRequestError(
            f"the spec is not valid YAML: {exc}", code="spec_invalid", status=400, detail={"field": ""}
        ) from None
    return validate_spec(raw)
