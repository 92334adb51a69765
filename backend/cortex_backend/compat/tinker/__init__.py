"""The Tinker API face: the published `tinker` SDK (and tinker-cookbook) against this backend (docs/tinker.md).

`face.py` (sessions, models, training) and `sampling.py` translate each operation into service calls, `messages.py` and `protobuf_wire.py` are its codec,
`handlers.py` and `routes.py` serve it.
"""

from __future__ import annotations

import tornado.web

from ...service import Service
from .face import TinkerFace
from .handlers import handler_specs


def url_specs(service: Service) -> list[tornado.web.URLSpec]:
    return handler_specs(service, TinkerFace(service, service.settings.tinker_session_timeout_s))


__all__ = ["TinkerFace", "url_specs"]
