"""What `GET {base_url}cortex/api/status` reports: which backend the server uses and how it found it,
can it reach it, does its token work there, and do the versions (this extension, the backend, their
API majors) match. The report's shape is `cortex_nb.protocol.schemas.server_extension.ExtensionStatus`.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from cortex_nb.protocol.errors import ApiError
from cortex_nb.protocol.schemas.base import ErrorDetail
from cortex_nb.protocol.schemas.server_extension import (
    BackendVersion,
    ExtensionStatus,
    ExtensionVersion,
    Identity,
)
from cortex_nb.protocol.versions import API_VERSION, __version__, api_major

from .backend import BackendConnection


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


async def status_report(connection: BackendConnection) -> ExtensionStatus:
    target = connection.target()
    report = ExtensionStatus(
        backend_url=target.url,
        source=target.source(),
        extension=ExtensionVersion(version=__version__, api_version=API_VERSION),
        backend=None,
        reachable=False,
        authenticated=False,
        identity=None,
        versions_match=False,
        api_compatible=False,
        error=None,
    )
    if not target.found:
        report.error = ErrorDetail(
            code="backend_unavailable",
            message=f"{target.description}: start one with Start"
            " local backend here, or %cortex connect --local in a notebook",
            detail={"local_backend": "not_running"},
        )
        return report
    try:
        status, version = await connection.get_json(target, "/version", authenticated=False)
    except (OSError, ConnectionError) as exc:
        report.error = ErrorDetail(
            code="backend_unavailable",
            message=f"cannot reach the backend at {target.url} ({target.description}): {exc}",
        )
        return report
    if status != 200 or not isinstance(version, dict):
        report.error = ErrorDetail(
            code="backend_unavailable",
            message=f"{target.url}/version answered HTTP {status}; is that a cortex-nb backend?",
        )
        return report
    report.reachable = True
    report.backend = BackendVersion(
        service=_text(version.get("service")),
        version=_text(version.get("version")),
        api_version=_text(version.get("api_version")),
    )
    report.versions_match = version.get("version") == __version__
    try:
        report.api_compatible = api_major(str(version.get("api_version"))) == api_major(API_VERSION)
    except ValueError:
        report.api_compatible = False
    try:
        status, whoami = await connection.get_json(target, "/v1/whoami")
    except ApiError as exc:  # no readable token file
        report.error = ErrorDetail(code=exc.code, message=exc.message)
        return report
    except (OSError, ConnectionError) as exc:
        report.error = ErrorDetail(code="backend_unavailable", message=str(exc))
        return report
    if status == 200 and isinstance(whoami, dict):
        report.authenticated = True
        scopes = whoami.get("scopes")
        report.identity = Identity(
            owner=_text(whoami.get("owner")),
            scopes=[str(scope) for scope in scopes] if isinstance(scopes, list) else None,
        )
    else:
        report.error = _backend_error(whoami) or ErrorDetail(
            code="unauthenticated", message=f"the backend refused the token (HTTP {status})"
        )
    return report


def _backend_error(answer: Any) -> ErrorDetail | None:
    """The backend's own `{"error": {...}}`, where it sent a readable one."""
    error = answer.get("error") if isinstance(answer, dict) else None
    try:
        return ErrorDetail.model_validate(error) if isinstance(error, dict) else None
    except ValidationError:
        return None
