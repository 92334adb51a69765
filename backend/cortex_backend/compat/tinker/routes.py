"""The Tinker API's routes (paths as the `tinker` SDK 0.38 sends them), served beside our /v1 routes."""

from __future__ import annotations

from cortex_nb.protocol.routes import READ, WRITE, Route

PREFIX = "/api/v1"


def _route(name: str, method: str, path: str, scope: str | None) -> Route:
    # Named "tinker:<operation>" (as they show in the request counters of GET /metrics); not forwarded by the
    # Jupyter proxy: the SDK talks to the backend itself.
    return Route(f"tinker:{name}", method, PREFIX + path, scope, proxied=False)


ROUTES: tuple[Route, ...] = (
    _route("healthz", "GET", "/healthz", None),
    # start-up: flags, capabilities, the session and its heartbeats, telemetry (accepted and dropped)
    _route("client_config", "POST", "/client/config", READ),
    _route("client_dynamic_config", "POST", "/client/dynamic_config", READ),
    _route("get_server_capabilities", "GET", "/get_server_capabilities", READ),
    _route("create_session", "POST", "/create_session", WRITE),
    _route("session_heartbeat", "POST", "/session_heartbeat", WRITE),
    _route("finish_session", "POST", "/sessions/{session_id}/finish", WRITE),
    # (before get_session, whose pattern would take /sessions/search)
    _route("search_sessions", "POST", "/sessions/search", READ),
    _route("export_session_trace", "GET", "/sessions/{session_id}/trace_export", READ),
    _route("assign_session_project", "PUT", "/sessions/{session_id}/project", WRITE),
    _route("get_session", "GET", "/sessions/{session_id}", READ),
    _route("list_sessions", "GET", "/sessions", READ),
    _route("telemetry", "POST", "/telemetry", READ),
    # models and training
    _route("create_model", "POST", "/create_model", WRITE),
    _route("get_info", "POST", "/get_info", READ),
    _route("forward_backward", "POST", "/forward_backward", WRITE),
    _route("optim_step", "POST", "/optim_step", WRITE),
    _route("save_weights", "POST", "/save_weights", WRITE),
    _route("save_weights_for_sampler", "POST", "/save_weights_for_sampler", WRITE),
    _route("load_weights", "POST", "/load_weights", WRITE),
    _route("save_weights_external", "POST", "/save_weights_external", WRITE),
    # sampling
    _route("create_sampling_session", "POST", "/create_sampling_session", WRITE),
    _route("asample", "POST", "/asample", WRITE),
    _route("get_sampler", "GET", "/samplers/{sampler_id}", READ),
    # futures
    _route("retrieve_future", "POST", "/retrieve_future", READ),
    _route("cancel_future", "POST", "/cancel_future", WRITE),
    # checkpoints and training runs (RestClient)
    _route("list_training_runs", "GET", "/training_runs", READ),
    _route("get_training_run", "GET", "/training_runs/{training_run_id}", READ),
    _route("list_checkpoints", "GET", "/training_runs/{training_run_id}/checkpoints", READ),
    _route(
        "delete_checkpoint", "DELETE", "/training_runs/{training_run_id}/checkpoints/{kind}/{name}", WRITE
    ),
    _route("list_user_checkpoints", "GET", "/checkpoints", READ),
    _route("weights_info", "POST", "/weights_info", READ),
    _route(
        "get_external_weights_urls",
        "GET",
        "/training_runs/{training_run_id}/checkpoints/{kind}/{name}/external_weights_urls",
        READ,
    ),
    # lifecycle: copy, publish, unpublish, TTL
    _route("copy_weights", "POST", "/copy_weights", WRITE),
    _route(
        "publish_checkpoint",
        "POST",
        "/training_runs/{training_run_id}/checkpoints/{kind}/{name}/publish",
        WRITE,
    ),
    _route(
        "unpublish_checkpoint",
        "DELETE",
        "/training_runs/{training_run_id}/checkpoints/{kind}/{name}/publish",
        WRITE,
    ),
    _route(
        "set_checkpoint_ttl", "PUT", "/training_runs/{training_run_id}/checkpoints/{kind}/{name}/ttl", WRITE
    ),
    # a signed URL's file: no key (the URL's signature is the credential), as the SDK's CLI downloads it
    _route("external_weights_file", "GET", "/external_weights/{job_id}/{checkpoint_id}/{file_name}", None),
    _route("session_trace_file", "GET", "/session_traces/{session_id}", None),
    _route("get_checkpoint_storage_usage", "GET", "/billing/usage/checkpoints/current", READ),
    _route("create_custom_loss", "POST", "/create_custom_loss", WRITE),
    # parts of the API this backend does not offer: a clear refusal rather than a 404
    _route("get_billing_usage", "GET", "/billing/usage/events", READ),
    _route("get_audit_log", "GET", "/audit", READ),
    _route("auth_token", "POST", "/auth/token", READ),
)
