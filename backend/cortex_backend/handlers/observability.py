"""Job and host metrics, the event feed, client telemetry and the Prometheus endpoint."""

from __future__ import annotations

from .base import BaseHandler


class JobMetricsHandler(BaseHandler):
    def get(self, job_id: str) -> None:
        since = self.float_argument("since", 0.0, 0.0, float("inf"))
        limit = self.int_argument("limit", 1000, 1, 10_000)
        self.write_json(self.service.device_metrics.for_job(self.principal, job_id, since, limit))


class HostMetricsHandler(BaseHandler):
    def get(self) -> None:
        since = self.float_argument("since", 0.0, 0.0, float("inf"))
        self.write_json(self.service.device_metrics.host(since))


class EventsHandler(BaseHandler):
    async def get(self) -> None:
        after = self.int_argument("after", 0)
        limit = self.int_argument("limit", 100, 1, 1000)
        wait_s = self.float_argument("wait", 0.0)
        self.write_json(await self.service.events.follow(self.principal, after, limit, wait_s))


class TelemetryHandler(BaseHandler):
    def post(self) -> None:
        accepted = self.service.telemetry.receive(self.principal, self.json_body())
        self.write_json({"accepted": accepted}, 202)

    def get(self) -> None:
        limit = self.int_argument("limit", 100, 1, 1000)
        self.write_json({"records": self.service.telemetry.latest(limit)})


class OperatorMetricsHandler(BaseHandler):
    def get(self) -> None:
        body, content_type = self.service.operator_metrics.render()
        self.set_header("Content-Type", content_type)
        self.finish(body)
