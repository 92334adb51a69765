"""The backend's REST routes: one table read by the backend (to serve), the client (to build URLs),
the Jupyter proxy (its allowlist) and the sidebar panel (a generated copy checked by a test).

A route is (name, method, template, scope). Templates use `{name}` placeholders that match one path
segment. `scope` is the token scope needed; None means no authentication (only `/version`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import quote

READ = "jobs:read"
WRITE = "jobs:write"
RUNS = "runs:write"
ADMIN = "admin"
SCOPES = (READ, WRITE, RUNS, ADMIN)


@dataclass(frozen=True)
class Route:
    name: str
    method: str
    template: str
    scope: str | None
    # Whether the Jupyter server proxy forwards this route for the browser and kernels.
    proxied: bool = True

    @property
    def regex(self) -> str:
        """Tornado URL pattern with named groups for the placeholders."""
        return "^" + re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", self.template) + "$"

    def url(self, **params: str) -> str:
        """Fill the placeholders, quoting each value as one path segment."""
        return re.sub(r"\{(\w+)\}", lambda m: quote(str(params[m.group(1)]), safe=""), self.template)


ROUTES: tuple[Route, ...] = (
    Route("version", "GET", "/version", None),
    # jobs
    Route("create_job", "POST", "/v1/jobs", WRITE),
    Route("list_jobs", "GET", "/v1/jobs", READ),
    Route("get_job", "GET", "/v1/jobs/{job_id}", READ),
    Route("cancel_job", "POST", "/v1/jobs/{job_id}/cancel", WRITE),
    Route("complete_job", "POST", "/v1/jobs/{job_id}/complete", WRITE),
    # data plane: each answers 202 {request_id}
    Route("forward_backward", "POST", "/v1/jobs/{job_id}/forward_backward", WRITE),
    Route("step", "POST", "/v1/jobs/{job_id}/step", WRITE),
    Route("generate", "POST", "/v1/jobs/{job_id}/generate", WRITE),
    Route("forward", "POST", "/v1/jobs/{job_id}/forward", WRITE),
    Route("noop", "POST", "/v1/jobs/{job_id}/noop", WRITE),
    Route("list_requests", "GET", "/v1/jobs/{job_id}/requests", READ),
    Route("get_request", "GET", "/v1/jobs/{job_id}/requests/{request_id}", READ),
    Route("get_request_tensors", "GET", "/v1/jobs/{job_id}/requests/{request_id}/tensors", READ),
    Route("cancel_request", "POST", "/v1/jobs/{job_id}/requests/{request_id}/cancel", WRITE),
    # checkpoints and weight sync: save, load and weight_sync answer 202 {request_id} like the data plane
    Route("save", "POST", "/v1/jobs/{job_id}/save", WRITE),
    Route("load", "POST", "/v1/jobs/{job_id}/load", WRITE),
    Route("weight_sync", "POST", "/v1/jobs/{job_id}/weight_sync", WRITE),
    Route("list_checkpoints", "GET", "/v1/jobs/{job_id}/checkpoints", READ),
    Route("get_checkpoint", "GET", "/v1/jobs/{job_id}/checkpoints/{checkpoint_id}", READ),
    Route("delete_checkpoint", "DELETE", "/v1/jobs/{job_id}/checkpoints/{checkpoint_id}", WRITE),
    Route("export_checkpoint", "GET", "/v1/jobs/{job_id}/checkpoints/{checkpoint_id}/export", READ),
    # managed training: datasets uploaded once, named by their SHA-256
    Route("put_dataset", "PUT", "/v1/datasets/{dataset_id}", WRITE),
    Route("get_dataset", "GET", "/v1/datasets/{dataset_id}", READ),
    # chunked uploads for large frames
    Route("upload_chunk", "PUT", "/v1/uploads/{upload_id}/chunks/{index}", WRITE),
    # logs
    Route("job_logs", "GET", "/v1/jobs/{job_id}/logs", READ),
    # host and models
    Route("capacity", "GET", "/v1/capacity", READ),
    Route("list_models", "GET", "/v1/models", READ),
    Route("tokenize", "POST", "/v1/models/{model}/tokenize", READ),
    Route("detokenize", "POST", "/v1/models/{model}/detokenize", READ),
    # source runs: a user's own code on the backend host, with verified outputs (docs/job-spec.md)
    Route("create_run", "POST", "/v1/runs", RUNS),
    Route("list_runs", "GET", "/v1/runs", READ),
    Route("get_run", "GET", "/v1/runs/{run_id}", READ),
    Route("cancel_run", "POST", "/v1/runs/{run_id}/cancel", RUNS),
    Route("run_logs", "GET", "/v1/runs/{run_id}/logs", READ),
    Route("run_report", "GET", "/v1/runs/{run_id}/report", READ),
    Route("list_run_outputs", "GET", "/v1/runs/{run_id}/outputs", READ),
    Route("get_run_output", "GET", "/v1/runs/{run_id}/outputs/{name}", READ),
    Route("upload_run_chunk", "PUT", "/v1/runs/uploads/{upload_id}/chunks/{index}", RUNS),
    # tokens: never through the proxy
    Route("whoami", "GET", "/v1/whoami", READ, proxied=False),
    # observability: device metrics, the event feed, client telemetry, operator metrics
    Route("job_metrics", "GET", "/v1/jobs/{job_id}/metrics", READ),
    Route("host_metrics", "GET", "/v1/host/metrics", READ),
    Route("list_events", "GET", "/v1/events", READ),
    Route("client_telemetry", "POST", "/v1/telemetry", READ),
    Route("recent_telemetry", "GET", "/v1/telemetry", ADMIN, proxied=False),
    Route("operator_metrics", "GET", "/metrics", READ, proxied=False),
)

ROUTES_BY_NAME: dict[str, Route] = {route.name: route for route in ROUTES}


def route(name: str) -> Route:
    return ROUTES_BY_NAME[name]


def match(method: str, path: str) -> tuple[Route, dict[str, str]] | None:
    """The route serving `method path`, with its placeholder values; None if no route does."""
    for candidate in ROUTES:
        if candidate.method != method:
            continue
        found = re.match(candidate.regex, path)
        if found:
            return candidate, found.groupdict()
    return None
