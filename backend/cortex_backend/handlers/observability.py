"""Job and host metrics, the event feed, client telemetry and the Prometheus endpoint."""

from __future__ import annotations

from cortex_nb.protocol.schemas.base import MAX_WAIT_S

from .base import BaseHandler


class JobMetricsHandler(BaseHandler):
    def get(self, job_id: str) -> None:
        query = self.query_args()
        self.write_json(
            self.service.device_metrics.for_job(self.principal, job_id, query.since, min(query.limit, 10_000))
        )


class HostMetricsHandler(BaseHandler):
    def get(self) -> None:
        self.write_json(self.service.device_metrics.host(self.query_args().since))


class EventsHandler(BaseHandler):
    async def get(self) -> None:
        query = self.query_args()
        self.write_json(
            await self.service.events.follow(
                self.principal, query.after, min(query.limit, 1000), min(query.wait, MAX_WAIT_S)
            )
        )


class TelemetryHandler(BaseHandler):
    def post(self) -> None:
        accepted = self.service.telemetry.receive(self.principal, self.parse_body().records)
        self.write_json({"accepted": accepted}, 202)

    def get(self) -> None:
        self.write_json({"records": self.service.telemetry.latest(min(self.query_args().limit, 1000))})


class OperatorMetricsHandler(BaseHandler):
    def get(self) -> None:
        body, content_type = self.service.operator_metrics.render()
        self.set_header("Content-Type", content_type)
        self.finish(body)
