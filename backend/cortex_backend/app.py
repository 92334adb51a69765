"""The Tornado application: every route in `cortex_nb.protocol.routes` mapped to its handler."""

from __future__ import annotations

import tornado.web

from cortex_nb.protocol import routes

from .handlers import (
    checkpoints,
    data_plane,
    datasets,
    jobs,
    logs,
    meta,
    observability,
    runs,
    speedtest,
    stats,
    uploads,
)
from .handlers.base import NotFoundHandler
from .service import Service

# One handler per route name; routes sharing a template must share the handler class.
HANDLERS: dict[str, type[tornado.web.RequestHandler]] = {
    "version": meta.VersionHandler,
    "openapi": meta.OpenApiHandler,
    "capacity": meta.CapacityHandler,
    "list_models": meta.ModelsHandler,
    "tokenize": meta.TokenizeHandler,
    "detokenize": meta.DetokenizeHandler,
    "whoami": meta.WhoAmIHandler,
    "create_job": jobs.JobsHandler,
    "list_jobs": jobs.JobsHandler,
    "get_job": jobs.JobHandler,
    "cancel_job": jobs.JobCancelHandler,
    "complete_job": jobs.JobCompleteHandler,
    "update_job": jobs.JobHandler,
    "delete_job": jobs.JobHandler,
    "job_lineage": jobs.JobLineageHandler,
    "forward_backward": data_plane.OperationHandler,
    "step": data_plane.OperationHandler,
    "generate": data_plane.OperationHandler,
    "forward": data_plane.OperationHandler,
    "noop": data_plane.OperationHandler,
    "reset_prefix_cache": data_plane.OperationHandler,
    "router_replay_discard": data_plane.RouterReplayDiscardHandler,
    "list_requests": data_plane.RequestsHandler,
    "get_request": data_plane.RequestHandler,
    "get_request_tensors": data_plane.RequestTensorsHandler,
    "cancel_request": data_plane.RequestCancelHandler,
    "upload_chunk": uploads.UploadChunkHandler,
    "put_dataset": datasets.DatasetHandler,
    "get_dataset": datasets.DatasetHandler,
    "job_logs": logs.JobLogsHandler,
    # source runs
    "create_run": runs.RunsHandler,
    "list_runs": runs.RunsHandler,
    "get_run": runs.RunHandler,
    "cancel_run": runs.RunCancelHandler,
    "run_logs": runs.RunLogsHandler,
    "run_report": runs.RunReportHandler,
    "list_run_outputs": runs.RunOutputsHandler,
    "get_run_output": runs.RunOutputHandler,
    "upload_run_chunk": runs.RunUploadChunkHandler,
    # observability
    "job_metrics": observability.JobMetricsHandler,
    "host_metrics": observability.HostMetricsHandler,
    "list_events": observability.EventsHandler,
    "stats": stats.StatsHandler,
    "speedtest_download": speedtest.SpeedtestHandler,
    "speedtest_upload": speedtest.SpeedtestHandler,
    "client_telemetry": observability.TelemetryHandler,
    "recent_telemetry": observability.TelemetryHandler,
    "operator_metrics": observability.OperatorMetricsHandler,
    # checkpoints and weight sync
    "save": data_plane.OperationHandler,
    "load": data_plane.OperationHandler,
    "weight_sync": data_plane.OperationHandler,
    "list_checkpoints": checkpoints.CheckpointsHandler,
    "get_checkpoint": checkpoints.CheckpointHandler,
    "delete_checkpoint": checkpoints.CheckpointHandler,
    "update_checkpoint": checkpoints.CheckpointHandler,
    "copy_checkpoint": checkpoints.CheckpointCopyHandler,
    "prune_checkpoints": checkpoints.CheckpointPruneHandler,
    "storage": checkpoints.StorageHandler,
    "export_checkpoint": checkpoints.CheckpointExportHandler,
}

# Hard cap on any body Tornado will read at all (larger connections are dropped).
MAX_STREAMED_BODY = 2 * 1024**3


def url_specs(service: Service) -> list[tornado.web.URLSpec]:
    specs: dict[str, tornado.web.URLSpec] = {}
    for route in routes.ROUTES:
        handler = HANDLERS[route.name]
        existing = specs.get(route.template)
        if existing is not None:
            if existing.handler_class is not handler:
                raise RuntimeError(f"routes on {route.template} map to different handlers")
            continue
        specs[route.template] = tornado.web.url(route.regex, handler, {"service": service})
    return list(specs.values())


def make_app(
    service: Service, face_specs: list[tornado.web.URLSpec] | None = None
) -> tornado.web.Application:
    """Our routes, plus those of any compatibility face (backend/cortex_backend/compat) the server runs."""
    return tornado.web.Application(
        url_specs(service) + list(face_specs or []),
        default_handler_class=NotFoundHandler,
        default_handler_args={"service": service},
        compress_response=False,
    )
