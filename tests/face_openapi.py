"""OpenAPI documents for the compatibility faces, generated from their route tables, so schemathesis can fuzz
them as it fuzzes /v1 (tests/test_openapi_fuzz.py). The faces publish no document of their own (their SDKs
define them); what is written by hand here is only the fields each operation reads, as loose hints: the
fuzzer sends those fields with generated values, and anything else besides. Every answer is described as
"JSON, any status": the check that matters for these is that none is a 5xx.
"""

from __future__ import annotations

from typing import Any

from cortex_backend.compat.cortex.routes import ROUTES as CORTEX_ROUTES
from cortex_backend.compat.tinker.routes import ROUTES as TINKER_ROUTES

ID = {"type": "string", "maxLength": 80}
INT = {"type": "integer"}
NUMBER = {"type": "number"}
ANY_OBJECT = {"type": "object"}
# Fields each Tinker operation reads (tinker SDK 0.38 request types), loosely typed.
TINKER_FIELDS: dict[str, dict[str, Any]] = {
    "create_session": {"user_metadata": ANY_OBJECT, "display_name": ID, "tags": {"type": "array"}},
    "session_heartbeat": {"session_id": ID},
    "finish_session": {"reason": ANY_OBJECT},
    "create_model": {
        "session_id": ID,
        "model_seq_id": INT,
        "base_model": ID,
        "lora_config": ANY_OBJECT,
        "optimizer_config": ANY_OBJECT,
    },
    "get_info": {"model_id": ID},
    "optim_step": {"model_id": ID, "seq_id": INT, "adam_params": ANY_OBJECT},
    "save_weights": {"model_id": ID, "seq_id": INT, "path": ID, "overwrite": {"type": "boolean"}},
    "save_weights_for_sampler": {
        "model_id": ID,
        "seq_id": INT,
        "path": ID,
        "sampling_session_seq_id": INT,
        "kind": ID,
    },
    "load_weights": {
        "model_id": ID,
        "seq_id": INT,
        "path": ID,
        "optimizer": {"type": "boolean"},
        "session_id": ID,
        "model_seq_id": INT,
    },
    "create_sampling_session": {
        "session_id": ID,
        "sampling_session_seq_id": INT,
        "base_model": ID,
        "model_path": ID,
    },
    "asample": {
        "sampling_session_id": ID,
        "seq_id": INT,
        "num_samples": INT,
        "prompt": ANY_OBJECT,
        "sampling_params": ANY_OBJECT,
        "prompt_logprobs": {"type": "boolean"},
        "prompt_logprobs_last_n": INT,
    },
    "retrieve_future": {"request_id": ID},
    "cancel_future": {"request_id": ID},
    "weights_info": {"tinker_path": ID},
    "save_weights_external": {"model_id": ID, "seq_id": INT, "path": ID, "ttl_seconds": INT},
    "copy_weights": {"source_path": ID, "session_id": ID, "model_seq_id": INT, "ttl_seconds": INT},
    "search_sessions": {
        "session_id": ID,
        "display_name": ID,
        "user_metadata": ANY_OBJECT,
        "project_ids": {"type": "array"},
        "statuses": {"type": "array"},
        "owner": ANY_OBJECT,
        "limit": INT,
        "cursor": ANY_OBJECT,
    },
}
CORTEX_FIELDS: dict[str, dict[str, Any]] = {
    "create_job": {"sub_jobs": {"type": "array"}, "idle_timeout_seconds": INT, "job_id": ID},
    "step": {"learning_rate": NUMBER},
    "save": {"checkpoint_id": ID, "checkpoint_type": ID},
    "load": {"checkpoint_id": ID, "source_job_id": ID, "target_sub_job_id": ID},
    "operation": {"operation": ID, "payload": ANY_OBJECT, "target_sub_job_id": ID},
}
BINARY = {"type": "string", "format": "binary"}
ANSWER = {"description": "any answer but a 5xx", "content": {"application/json": {"schema": {}}}}


def _json_body(fields: dict[str, Any]) -> dict[str, Any]:
    schema = {"type": "object", "properties": fields, "additionalProperties": True}
    return {"required": True, "content": {"application/json": {"schema": schema}}}


def _operation(operation_id: str, parameters: list[str], body: dict[str, Any] | None) -> dict[str, Any]:
    operation: dict[str, Any] = {
        "operationId": operation_id,
        "parameters": [
            {"name": name, "in": "path", "required": True, "schema": {"type": "string", "minLength": 1}}
            for name in parameters
        ],
        "responses": {"default": ANSWER},
    }
    if body is not None:
        operation["requestBody"] = body
    return operation


def _document(title: str, paths: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return {"openapi": "3.1.0", "info": {"title": title, "version": "1"}, "paths": paths}


def tinker_document() -> dict[str, Any]:
    paths: dict[str, dict[str, Any]] = {}
    for route in TINKER_ROUTES:
        name = route.name.removeprefix("tinker:")
        if name == "forward_backward":
            body = {"required": True, "content": {"application/x-protobuf": {"schema": BINARY}}}
        elif route.method == "POST":
            body = _json_body(TINKER_FIELDS.get(name, {}))
        else:
            body = None
        paths.setdefault(route.template, {})[route.method.lower()] = _operation(name, route.path_params, body)
    return _document("Tinker face", paths)


def cortex_document() -> dict[str, Any]:
    # The 501 refusals (routes.NOT_SUPPORTED) answer so on purpose (tests/test_cortex_sdk_errors.py).
    paths: dict[str, dict[str, Any]] = {}
    for route in CORTEX_ROUTES:
        name = route.name.removeprefix("cortex:")
        if name in ("forward_backward", "generate"):
            body = {"required": True, "content": {"application/octet-stream": {"schema": BINARY}}}
        elif route.method == "POST":
            body = _json_body(CORTEX_FIELDS.get(name, {}))
        else:
            body = None
        paths.setdefault(route.template, {})[route.method.lower()] = _operation(name, route.path_params, body)
    return _document("Cortex Training face", paths)
