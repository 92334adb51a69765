"""Operator metrics in Prometheus text format (GET /metrics), built with prometheus_client.

One registry per service instance (tests and the embedded backend can run several in one process).
Labels are bounded and carry no per-user data: route names from the route table, HTTP methods and
statuses, device ids, and for client telemetry the operation, outcome, error type and HTTP status.
Gauges about live state (queue, slots, jobs, devices) are read when scraped, not kept in sync.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
CLIENT_BUCKETS = (0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 60.0, 300.0, 1800.0)
METHODS = frozenset({"GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"})

# Monitor sample field -> (metric name, help). Absent fields (no NVML) produce no series.
DEVICE_GAUGES: dict[str, tuple[str, str]] = {
    "gpu_utilization_percent": (
        "cortex_gpu_utilization_percent",
        "GPU utilisation over the last NVML period",
    ),
    "gpu_memory_used_bytes": ("cortex_gpu_memory_used_bytes", "GPU memory in use (all processes)"),
    "gpu_memory_total_bytes": ("cortex_gpu_memory_total_bytes", "GPU memory in total"),
    "gpu_temperature_c": ("cortex_gpu_temperature_celsius", "GPU temperature"),
    "gpu_power_watts": ("cortex_gpu_power_watts", "GPU power draw"),
}
HOST_GAUGES: dict[str, tuple[str, str]] = {
    "cpu_percent": ("cortex_host_cpu_percent", "host CPU use across all cores"),
    "ram_used_bytes": ("cortex_host_ram_used_bytes", "host RAM in use (total - available)"),
    "ram_total_bytes": ("cortex_host_ram_total_bytes", "host RAM in total"),
}


class LiveState:
    """What the state collector reads at scrape time; the service fills these in."""

    def __init__(
        self,
        capacity: Callable[[], dict[str, Any]],
        job_counts: Callable[[], dict[str, int]],
        latest_samples: Callable[[], list[dict[str, Any]]],
        gpu_unavailable_reason: Callable[[], str | None],
        log_counts: Callable[[], dict[str, int]],
        active_sub_jobs: Callable[[], int],
    ) -> None:
        self.capacity = capacity
        self.active_sub_jobs = active_sub_jobs
        self.job_counts = job_counts
        self.latest_samples = latest_samples
        self.gpu_unavailable_reason = gpu_unavailable_reason
        self.log_counts = log_counts


class _StateCollector:
    def __init__(self, state: LiveState) -> None:
        self.state = state

    def collect(self) -> Iterator[Metric]:
        capacity = self.state.capacity()
        queue = GaugeMetricFamily("cortex_queue_depth", "jobs and source runs waiting for a device slot")
        queue.add_metric([], capacity.get("pending", 0))
        yield queue
        active = GaugeMetricFamily(
            "cortex_active_sub_jobs", "sub-jobs and source runs placed on a device (starting or running)"
        )
        active.add_metric([], self.state.active_sub_jobs())
        yield active
        in_use = GaugeMetricFamily(
            "cortex_device_slots_in_use", "slots in use per device (sub-jobs and runs)", labels=["device"]
        )
        total = GaugeMetricFamily("cortex_device_slots", "slots per device", labels=["device"])
        adapter_in_use = GaugeMetricFamily(
            "cortex_device_adapter_slots_in_use",
            "adapter-host slots in use per device (sub-jobs sharing its adapter host)",
            labels=["device"],
        )
        adapter_total = GaugeMetricFamily(
            "cortex_device_adapter_slots",
            "adapter-host slots per device (0: it has no adapter host)",
            labels=["device"],
        )
        for device in capacity.get("devices", []):
            in_use.add_metric([device["id"]], device["slots_in_use"])
            total.add_metric([device["id"]], device["slots"])
            adapter_in_use.add_metric([device["id"]], device.get("adapter_slots_in_use", 0))
            adapter_total.add_metric([device["id"]], device.get("adapter_slots", 0))
        yield in_use
        yield total
        yield adapter_in_use
        yield adapter_total

        jobs = GaugeMetricFamily("cortex_jobs", "jobs in the store by status", labels=["status"])
        for status, count in sorted(self.state.job_counts().items()):
            jobs.add_metric([status], count)
        yield jobs

        samples = self.state.latest_samples()
        for field, (name, help_text) in {**DEVICE_GAUGES, **HOST_GAUGES}.items():
            family = GaugeMetricFamily(name, help_text, labels=["device"])
            for sample in samples:
                if field in sample:
                    family.add_metric([sample["device"]], sample[field])
            yield family
        available = GaugeMetricFamily(
            "cortex_gpu_metrics_available", "1 when NVML answers for the served GPUs"
        )
        available.add_metric([], 0 if self.state.gpu_unavailable_reason() else 1)
        yield available

        logs = self.state.log_counts()
        appended = CounterMetricFamily("cortex_log_lines", "log lines captured from workers")
        appended.add_metric([], logs.get("appended", 0))
        yield appended
        dropped = CounterMetricFamily("cortex_log_lines_dropped", "log lines dropped by per-job retention")
        dropped.add_metric([], logs.get("dropped", 0))
        yield dropped


class OperatorMetrics:
    def __init__(self, state: LiveState) -> None:
        # `*_created` timestamps double the output and no dashboard here reads them (process-wide switch).
        disable_created_metrics()
        self.registry = CollectorRegistry(auto_describe=False)
        self.http_requests = Counter(
            "cortex_http_requests",
            "HTTP requests answered, by route name, method and status",
            ["route", "method", "status"],
            registry=self.registry,
        )
        self.http_latency = Histogram(
            "cortex_http_request_duration_seconds",
            "time to answer, by route name (long-polls and log streams that waited are not observed)",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        # The children of the two above by label values (route names, methods and statuses are few).
        self._answered: dict[tuple[str, str, int], Any] = {}
        self._timed: dict[str, Any] = {}
        self.client_operations = Counter(
            "cortex_client_operations",
            "client SDK operation outcomes reported by telemetry",
            ["operation", "outcome", "error_type", "http_status"],
            registry=self.registry,
        )
        self.client_duration = Histogram(
            "cortex_client_operation_duration_seconds",
            "client SDK operation duration reported by telemetry",
            ["operation", "outcome"],
            buckets=CLIENT_BUCKETS,
            registry=self.registry,
        )
        self.client_retries = Counter(
            "cortex_client_retries",
            "HTTP retries inside client operations reported by telemetry",
            ["operation"],
            registry=self.registry,
        )
        self.telemetry_rejected = Counter(
            "cortex_telemetry_records_rejected",
            "telemetry records refused as malformed",
            registry=self.registry,
        )
        self.registry.register(_StateCollector(state))

    def observe_request(self, route: str, method: str, status: int, seconds: float, waited: bool) -> None:
        method = method if method in METHODS else "OTHER"
        # Every answer is counted: the labelled children are looked up once per label set, not per request
        # (prometheus_client's `labels()` checks and locks on each call, a good part of a small answer's cost).
        counted = self._answered.get((route, method, status))
        if counted is None:
            counted = self._answered[(route, method, status)] = self.http_requests.labels(
                route, method, str(status)
            )
        counted.inc()
        if not waited:
            timed = self._timed.get(route)
            if timed is None:
                timed = self._timed[route] = self.http_latency.labels(route)
            timed.observe(seconds)

    def observe_client_operation(self, record: dict[str, Any]) -> None:
        """A validated telemetry record (see telemetry.py): every label is already bounded."""
        outcome = "success" if record["success"] else "failure"
        status = str(record["http_status"]) if record.get("http_status") else "none"
        self.client_operations.labels(
            record["operation"], outcome, record.get("error_type") or "none", status
        ).inc()
        self.client_duration.labels(record["operation"], outcome).observe(record["duration_ms"] / 1000.0)
        if record.get("retries"):
            self.client_retries.labels(record["operation"]).inc(record["retries"])

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
