"""The Cortex Training REST surface (`/api/v2/databases/{database}/schemas/{schema}/cortex-training`),
so the published `cortex-training` SDK drives a cortex-nb backend unchanged. Handlers translate to the
service; the surface has its own codec (DSSST1) and no engine, store or scheduler. docs/cortex-sdk.md."""

from __future__ import annotations

import tornado.web

from ...service import Service
from . import checkpoints, control, data_plane, operations, polling
from .base import CortexFace
from .unsupported import NotSupportedHandler

PREFIX = r"/api/v2/databases/(?P<database>[^/]+)/schemas/(?P<schema>[^/]+)/cortex-training"
JOB = r"(?P<job_id>[^/:]+)"
CHECKPOINT = r"(?P<checkpoint_id>[^/:]+)"

ROUTES: list[tuple[str, type[tornado.web.RequestHandler], dict]] = [
    (PREFIX, control.JobsHandler, {}),
    (PREFIX + "/capacity", control.CapacityHandler, {}),
    (PREFIX + f"/{JOB}", control.JobHandler, {}),
    (PREFIX + f"/{JOB}:cancel", control.JobCancelHandler, {}),
    (PREFIX + f"/{JOB}/(?P<operation>forward-backward|generate)", data_plane.FrameOperationHandler, {}),
    (PREFIX + f"/{JOB}/(?P<operation>step|save|load)", data_plane.JsonOperationHandler, {}),
    (PREFIX + f"/{JOB}/operation", operations.OperationHandler, {}),
    (PREFIX + f"/{JOB}/requests/(?P<request_id>[^/]+)", polling.RequestHandler, {}),
    (PREFIX + f"/{JOB}/checkpoints", checkpoints.CheckpointsHandler, {}),
    (PREFIX + f"/{JOB}/checkpoints/{CHECKPOINT}:export", checkpoints.CheckpointExportHandler, {}),
    (PREFIX + f"/{JOB}/checkpoints/{CHECKPOINT}", checkpoints.CheckpointHandler, {}),
    (
        PREFIX + f"/{JOB}/checkpoints/{CHECKPOINT}/files/(?P<filename>[^/]+)",
        checkpoints.CheckpointFileHandler,
        {},
    ),
    (PREFIX + f"/{JOB}/experiment-run", NotSupportedHandler, {"what": "experiment-run"}),
    (PREFIX + f"/{JOB}/generate-stream", NotSupportedHandler, {"what": "generate-stream"}),
    (PREFIX + "/.*", NotSupportedHandler, {"what": "unknown"}),
    (r"/api/v2/statements", NotSupportedHandler, {"what": "statements"}),
    (r"/api/v2/sessions", NotSupportedHandler, {"what": "sessions"}),
    (r"/observability/.*", NotSupportedHandler, {"what": "observability"}),
]


def url_specs(service: Service) -> list[tornado.web.URLSpec]:
    face = CortexFace(service)
    return [
        tornado.web.url(f"^{pattern}$", handler, {"service": service, "face": face, **extra})
        for pattern, handler, extra in ROUTES
    ]
