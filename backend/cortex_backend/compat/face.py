"""The template every compatibility face follows (Tinker's, the Cortex SDK's; docs/contributing.md).

A face declares its `Route`s (cortex_nb.protocol.routes.Route: name, method, path template, scope), one
handler per route name, and how its SDK wants errors: the status (derived from the error table's
category: compat/face_errors.py) and any header or reason phrase its SDK reads. Authentication, scopes,
body limits, the JSON error body and the request counters are then the /v1 handlers' own
(handlers/base.py), never copied.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import tornado.web

from cortex_nb.protocol.routes import Route

from ..handlers.base import BaseHandler
from ..service import Service


class FaceHandler(BaseHandler):
    """A handler of a face: its face's route table and bookkeeping object, and its SDK's error statuses."""

    face: Any
    # Set by each face: (code, our status) -> the status its SDK should see.
    sdk_status: Callable[[str, int], int]

    def initialize(self, service: Service, face: Any) -> None:  # type: ignore[override]
        super().initialize(service)
        self.face = face

    def error_status(self, code: str, status: int) -> int:
        return type(self).sdk_status(code, status)


def face_url_specs(
    routes: tuple[Route, ...],
    handlers: Mapping[str, type[FaceHandler]],
    service: Service,
    face: Any,
) -> list[tornado.web.URLSpec]:
    """One URL spec per path template, in table order, served by the handler of its routes (every route
    of one template must name the same handler: Tornado picks the handler by path, the route by method)."""
    specs: dict[str, type[FaceHandler]] = {}
    for route in routes:
        handler = handlers[route.name]
        if specs.setdefault(route.regex, handler) is not handler:
            raise ValueError(f"{route.template}: its routes name two handlers")
    return [
        tornado.web.url(regex, handler, {"service": service, "face": face})
        for regex, handler in specs.items()
    ]
