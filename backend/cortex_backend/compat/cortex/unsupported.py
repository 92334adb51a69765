"""Calls of the SDK that reach parts of Snowflake which do not exist on a cortex-nb backend: answered
at once with 501 `not_supported` and the cortex-nb way to get the same thing (the SDK does not retry 501)."""

from __future__ import annotations

from typing import Any

from cortex_nb.protocol.routes import READ, WRITE

from ...auth import authenticate
from .base import CortexHandler
from .errors import not_supported

EQUIVALENTS = {
    "experiment-run": "experiment runs and their artifact stage are Snowflake's; on cortex-nb read a job's logs with"
    " cortex_nb.Client.download_stdout_logs(job_id, dir) or tail_logs/stream_logs here, and its"
    " device metrics with Client.download_metrics(job_id, dir)",
    "statements": "Snowflake SQL statements do not exist on cortex-nb; fetch logs with"
    " cortex_nb.Client.download_stdout_logs(job_id, dir) and metrics with Client.download_metrics",
    "sessions": "Snowflake sessions (used for the SDK's OTLP telemetry) do not exist on cortex-nb; client telemetry"
    " goes to POST /v1/telemetry (cortex_nb.Client sends it), and CORTEX_TRAINING_DISABLE_TELEMETRY=1"
    " silences the SDK's",
    "observability": "Snowflake's OTLP collector does not exist on cortex-nb; see GET /metrics (Prometheus) and"
    " POST /v1/telemetry",
}


class NotSupportedHandler(CortexHandler):
    """Every method of a path that cannot exist here; `what` picks the explanation."""

    unmatched_name = "cortex:not_supported"

    def initialize(self, service, face, what: str) -> None:  # type: ignore[override]
        super().initialize(service, face)
        self.what = what

    def prepare(self) -> None:
        """No route of the table serves these paths: authenticate as its routes do, then refuse."""
        self.principal = authenticate(self.service.store, self.request.headers.get("Authorization"))
        self.principal.require(READ if self.request.method in ("GET", "HEAD") else WRITE)
        self._refuse()

    def _refuse(self, *args: Any, **kwargs: Any) -> None:
        if self.what in EQUIVALENTS:
            raise not_supported(f"{self.request.method} {self.request.path}: {EQUIVALENTS[self.what]}")
        raise not_supported(
            f"{self.request.method} {self.request.path} is not part of the Cortex Training API this backend"
            " serves; see docs/cortex-sdk.md for what it does"
        )

    get = post = put = delete = patch = _refuse
