"""Other services' APIs served by the same backend (docs/cortex-sdk.md): each face is a folder of
handlers and its own codec over the one service; jobs made through any face are ordinary jobs."""

from __future__ import annotations

import tornado.web

from ..service import Service


def url_specs(service: Service) -> list[tornado.web.URLSpec]:
    from .cortex import url_specs as cortex_url_specs

    return [*cortex_url_specs(service)]
