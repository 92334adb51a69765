"""The Cortex Training SDK's routes (paths as `cortex-training` 0.0.3 sends them), served beside /v1.

Routes of one path are listed together, and a path with a `:verb` suffix before the bare path it extends
(Tornado picks the first path that matches; `{job_id}` alone would take `abc:cancel`)."""

from __future__ import annotations

from cortex_nb.protocol.routes import READ, WRITE, Route

PREFIX = "/api/v2/databases/{database}/schemas/{schema}/cortex-training"
JOB = PREFIX + "/{job_id}"
CHECKPOINT = JOB + "/checkpoints/{checkpoint_id}"


def _route(name: str, method: str, path: str, scope: str | None = "") -> Route:
    # Named "cortex:<operation>" (as they show in the request counters of GET /metrics); a read needs the
    # read scope, anything else the write scope. Not forwarded by the Jupyter proxy.
    if scope == "":
        scope = READ if method == "GET" else WRITE
    return Route(f"cortex:{name}", method, path, scope, proxied=False)


ROUTES: tuple[Route, ...] = (
    _route("list_jobs", "GET", PREFIX),
    _route("create_job", "POST", PREFIX),
    _route("capacity", "GET", PREFIX + "/capacity"),
    _route("cancel_job", "POST", JOB + ":cancel"),
    _route("get_job", "GET", JOB),
    _route("forward_backward", "POST", JOB + "/forward-backward"),
    _route("generate", "POST", JOB + "/generate"),
    _route("step", "POST", JOB + "/step"),
    _route("save", "POST", JOB + "/save"),
    _route("load", "POST", JOB + "/load"),
    _route("operation", "POST", JOB + "/operation"),
    _route("generate_stream", "POST", JOB + "/generate-stream"),
    _route("get_request", "GET", JOB + "/requests/{request_id}"),
    _route("list_checkpoints", "GET", JOB + "/checkpoints"),
    _route("export_checkpoint", "POST", CHECKPOINT + ":export"),
    _route("delete_checkpoint", "DELETE", CHECKPOINT),
    # a signed download link's file: no token (the link's signature is the credential)
    _route("checkpoint_file", "GET", CHECKPOINT + "/files/{filename}", None),
)

# Paths of the SDK that reach parts of Snowflake a cortex-nb backend does not have: every method answers
# 501 `not_supported` naming the cortex-nb way (unsupported.py). Regexes: some are catch-alls.
NOT_SUPPORTED: tuple[tuple[str, str], ...] = (
    ("/api/v2/databases/[^/]+/schemas/[^/]+/cortex-training/[^/:]+/experiment-run", "experiment-run"),
    ("/api/v2/databases/[^/]+/schemas/[^/]+/cortex-training/.*", "unknown"),
    ("/api/v2/statements", "statements"),
    ("/api/v2/sessions", "sessions"),
    ("/observability/.*", "observability"),
)
