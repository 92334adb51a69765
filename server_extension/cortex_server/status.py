"""What `GET {base_url}cortex/api/status` reports: which backend the server uses and how it found it,
can it reach it, does its token work there, and do the versions (this extension, the backend, their
API majors) match.
"""

from __future__ import annotations

from typing import Any

from cortex_nb.protocol.errors import ApiError
from cortex_nb.protocol.versions import API_VERSION, __version__, api_major

from .backend import BackendConnection


async def status_report(connection: BackendConnection) -> dict[str, Any]:
    target = connection.target()
    report: dict[str, Any] = {
        "backend_url": target.url,
        "source": target.to_json(),
        "extension": {"version": __version__, "api_version": API_VERSION},
        "backend": None,
        "reachable": False,
        "authenticated": False,
        "identity": None,
        "versions_match": False,
        "api_compatible": False,
        "error": None,
    }
    if not target.found:
        report["error"] = {
            "code": "backend_unavailable",
            "message": f"{target.description}: start one with Start"
            " local backend here, or %cortex connect --local in a notebook",
            "detail": {"local_backend": "not_running"},
        }
        return report
    try:
        status, version = await connection.get_json(target, "/version", authenticated=False)
    except (OSError, ConnectionError) as exc:
        report["error"] = {
            "code": "backend_unavailable",
            "message": f"cannot reach the backend at {target.url} ({target.description}): {exc}",
        }
        return report
    if status != 200 or not isinstance(version, dict):
        report["error"] = {
            "code": "backend_unavailable",
            "message": f"{target.url}/version answered HTTP {status}; is that a cortex-nb backend?",
        }
        return report
    report["reachable"] = True
    report["backend"] = {key: version.get(key) for key in ("service", "version", "api_version")}
    report["versions_match"] = version.get("version") == __version__
    try:
        report["api_compatible"] = api_major(str(version.get("api_version"))) == api_major(API_VERSION)
    except ValueError:
        report["api_compatible"] = False
    try:
        status, whoami = await connection.get_json(target, "/v1/whoami")
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
        report["error"] = error or {
            "code": "unauthenticated",
            "message": f"the backend refused the token (HTTP {status})",
        }
    return report
