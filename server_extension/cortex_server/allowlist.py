"""Which backend routes the proxy forwards: exactly those in `cortex_nb.protocol.routes` marked `proxied`.

Derived from the route table, never a second list of paths, so a route added there (and marked
proxied) reaches the panel and kernels with no change here, and a route marked not proxied (tokens,
whoami) can never be reached through Jupyter.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import unquote

from cortex_nb.protocol import routes
from cortex_nb.protocol.errors import ApiError


@dataclass(frozen=True)
class Allowed:
    route: routes.Route
    path: str  # the backend path to request, exactly as the caller sent it


def proxied_routes() -> tuple[routes.Route, ...]:
    return tuple(route for route in routes.ROUTES if route.proxied)


def check(method: str, path: str) -> Allowed:
    """The route serving `method path` if the proxy may forward it; raises ApiError otherwise.

    `path` is the raw (still percent-encoded) backend path, e.g. `/v1/jobs/job-1/logs`; the backend
    matches the same raw path against the same table, so both sides agree on which route it is.
    """
    segments = path.split("/")[1:]
    if any(unquote(segment) in (".", "..", "") for segment in segments):
        raise ApiError("invalid_request", f"the path {path!r} has an empty, '.' or '..' segment")
    found = routes.match(method, path)
    if found is None:
        if any(re.match(route.regex, path) for route in routes.ROUTES):
            raise ApiError("method_not_allowed", f"{method} is not allowed on {path}")
        raise ApiError("route_not_found", f"no backend route {method} {path}; docs/api.md lists them")
    route = found[0]
    if not route.proxied:
        raise ApiError(
            "route_not_proxied",
            f"{route.name} ({method} {route.template}) is not forwarded by the Jupyter proxy;"
            " call the backend directly with a token for it",
        )
    return Allowed(route, path)
