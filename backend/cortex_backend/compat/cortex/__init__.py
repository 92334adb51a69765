"""The Cortex Training REST surface (`/api/v2/databases/{database}/schemas/{schema}/cortex-training`),
so the published `cortex-training` SDK drives a cortex-nb backend unchanged. Handlers translate to the
service; the surface has its own codec (DSSST1) and no engine, store or scheduler. docs/cortex-sdk.md."""

from __future__ import annotations

import tornado.web

from ...service import Service
from ..face import face_url_specs
from .base import CortexFace
from .handlers import HANDLERS
from .routes import NOT_SUPPORTED, ROUTES
from .unsupported import NotSupportedHandler


def url_specs(service: Service) -> list[tornado.web.URLSpec]:
    face = CortexFace(service)
    refusals = [
        tornado.web.url(f"^{pattern}$", NotSupportedHandler, {"service": service, "face": face, "what": what})
        for pattern, what in NOT_SUPPORTED
    ]
    return [*face_url_specs(ROUTES, HANDLERS, service, face), *refusals]
