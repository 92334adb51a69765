"""What `GET {base_url}cortex/api/status` reports: can the server reach the backend, does its token
work there, and do the versions (this extension, the backend, their API majors) match.
"""

from __future__ import annotations

from typing import Any

from cortex_nb.protocol.errors import ApiError
from cortex_nb.protocol.versions import API_VERSION, __version__, api_major

from .backend import BackendConnection


async def status_report(connection: BackendConnection) -> dict[str, Any]:
    report: dict[str, Any] = {
        "backend_url": connection.url,
        "extension": {"version": __version__, "api_version": API_VERSION},
        "backend": None,
        "reachable": False,
        "authenticated": False,
        "identity": None,
        "versions_match": False,
        "api_compatible": False,
        "error": None,
    }
    try:
        status, version = await connection.get_json("/version", authenticated=False)
    except (OSError, ConnectionError) as exc:
        report["error"] = {"code": "backend_unavailable",
                           "message": f"cannot reach the backend at {connection.url}: {exc}"}
        return report
    if status != 200 or not isinstance(version, dict):
        report["error"] = {"code": "backend_unavailable",
                           "message": f"{connection.url}/version answered HTTP {status}; is that a cortex-nb backend?"}
        return report
    report["reachable"] = True
    report["backend"] = {key: version.get(key) for key in ("service", "version", "api_version")}
    report["versions_match"] = version.get("version") == __version__
    try:
        report["api_compatible"] = api_major(str(version.get("api_version"))) == api_major(API_VERSION)
    except ValueError:
        report["api_compatible"] = False
    try:
        status, whoami = await connection.get_json("/v1/whoami")
    except ApiError as exc:  # no readable token file
        report["error"] = {"code": exc.code, "message": exc.message}
        return report
    except (OSError, ConnectionError) as exc:
        report["error"] = {"code": "backend_unavailable", "message": str(exc)}
        return report
    if status == 200 and isinstance(whoami, dict):
        report["authenticated"] = True
        report["identity"] = {"owner": whoami.get("owner"), "scopes": whoami.get("scopes")}
    else:
        error = (whoami or {}).get("error") if isinstance(whoami, dict) else None
        report["error"] = error or {"code": "unauthenticated", "message": f"the backend refused the token (HTTP {status})"}
    return report
