"""Which handler serves each Cortex SDK route (routes.py)."""

from __future__ import annotations

from . import checkpoints, control, data_plane, operations, polling, streaming
from .base import CortexHandler

HANDLERS: dict[str, type[CortexHandler]] = {
    "cortex:list_jobs": control.JobsHandler,
    "cortex:create_job": control.JobsHandler,
    "cortex:capacity": control.CapacityHandler,
    "cortex:cancel_job": control.JobCancelHandler,
    "cortex:get_job": control.JobHandler,
    "cortex:forward_backward": data_plane.FrameOperationHandler,
    "cortex:generate": data_plane.FrameOperationHandler,
    "cortex:step": data_plane.JsonOperationHandler,
    "cortex:save": data_plane.JsonOperationHandler,
    "cortex:load": data_plane.JsonOperationHandler,
    "cortex:operation": operations.OperationHandler,
    "cortex:generate_stream": streaming.GenerateStreamHandler,
    "cortex:get_request": polling.RequestHandler,
    "cortex:list_checkpoints": checkpoints.CheckpointsHandler,
    "cortex:export_checkpoint": checkpoints.CheckpointExportHandler,
    "cortex:delete_checkpoint": checkpoints.CheckpointHandler,
    "cortex:checkpoint_file": checkpoints.CheckpointFileHandler,
}
