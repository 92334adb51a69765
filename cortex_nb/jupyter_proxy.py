"""Reach the backend from a kernel through the Jupyter server it runs under (the cortex_server proxy).

The kernel authenticates to Jupyter with Jupyter's own token (from the server's runtime file, or the
JupyterHub API token in the kernel's environment); the Jupyter server adds the backend token. So the
backend token never enters the kernel.

    from cortex_nb.jupyter_proxy import find_proxy_endpoint
    endpoint = find_proxy_endpoint()          # None when this kernel runs under no Jupyter server
    client = cortex_nb.Client(endpoint.url, endpoint.token, **endpoint.client_kwargs())
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import errors

# Where the server extension is mounted under the Jupyter server's base_url.
PROXY_PATH = "cortex/api"


@dataclass(frozen=True)
class ProxyEndpoint:
    """What `cortex_nb.Client` needs to talk to the backend through a Jupyter server's proxy.

    `url`, `token` and `source` mean what they mean on `profiles.Endpoint`; `token` is the Jupyter
    token (sent as `Authorization: token ...`), never the backend's.
    """

    url: str
    token: str | None
    source: str
    auth_scheme: str = "token"
    extra_headers: dict[str, str] = field(default_factory=dict)
    cookies: dict[str, str] = field(default_factory=dict)
    server_url: str = ""
    server_pid: int | None = None

    def client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for `Client(endpoint.url, endpoint.token, **endpoint.client_kwargs())`."""
        return {
            "auth_scheme": self.auth_scheme,
            "extra_headers": dict(self.extra_headers),
            "cookies": dict(self.cookies),
        }


def runtime_dir() -> Path:
    """Jupyter's runtime directory, where each running server writes `jpserver-<pid>.json`."""
    try:
        from jupyter_core.paths import jupyter_runtime_dir

        return Path(jupyter_runtime_dir())
    except ImportError:  # a kernel environment without jupyter_core
        explicit = os.environ.get("JUPYTER_RUNTIME_DIR")
        if explicit:
            return Path(explicit)
        data = os.environ.get("JUPYTER_DATA_DIR") or os.path.join(
            os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share"),
            "jupyter",
        )
        return Path(data) / "runtime"


def running_servers(directory: Path | None = None) -> list[dict[str, Any]]:
    """The server info files of Jupyter servers whose process is still alive."""
    servers = []
    for path in sorted((directory or runtime_dir()).glob("jpserver-*.json")):
        try:
            info = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if (
            isinstance(info, dict)
            and isinstance(info.get("pid"), int)
            and _alive(info["pid"])
            and info.get("url")
        ):
            servers.append(info)
    return servers


def ancestor_pids(pid: int | None = None) -> list[int]:
    """This process's parent, grandparent, ... (Linux /proc; empty where it is not available)."""
    pids: list[int] = []
    current = pid or os.getpid()
    for _ in range(64):
        try:
            stat = Path(f"/proc/{current}/stat").read_text()
        except OSError:
            break
        # The command name (field 2) may hold spaces and parentheses; the fields after its last ')' don't.
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        if parent <= 1:
            break
        pids.append(parent)
        current = parent
    if not pids and os.getppid() > 1:
        pids.append(os.getppid())
    return pids


def find_proxy_endpoint(*, probe: bool = True, timeout_s: float = 10.0) -> ProxyEndpoint | None:
    """The backend through the Jupyter server this kernel runs under, or None if there is no such server.

    Picks the running Jupyter server (from Jupyter's runtime files) that is an ancestor process of this
    kernel, or the only running server if none is. Jupyter auth: the server's token from its runtime
    file, else `JUPYTERHUB_API_TOKEN` (JupyterHub single-user servers).

    With `probe` (the default) it asks `{server}cortex/api/status` first and raises `ConnectionError`
    (code `backend_unavailable` or `proxy_not_configured`) with the reason when a server was found but
    its proxy cannot serve: the extension is not enabled there, or it cannot reach its backend.
    """
    servers = running_servers()
    if not servers:
        return None
    by_pid = {server["pid"]: server for server in servers}
    chosen = next((by_pid[pid] for pid in ancestor_pids() if pid in by_pid), None)
    how = "the Jupyter server running this kernel"
    if chosen is None:
        if len(servers) != 1:
            return None
        chosen, how = servers[0], "the only running Jupyter server"
    if chosen.get("sock"):
        return None  # a server on a UNIX socket; not supported here
    server_url = chosen["url"] if chosen["url"].endswith("/") else chosen["url"] + "/"
    token = chosen.get("token") or os.environ.get("JUPYTERHUB_API_TOKEN") or None
    endpoint = ProxyEndpoint(
        url=server_url + PROXY_PATH,
        token=token,
        source=f"{how} ({server_url}, pid {chosen['pid']}), through its cortex-nb proxy",
        server_url=server_url,
        server_pid=chosen["pid"],
    )
    if probe:
        check_proxy(endpoint, timeout_s)
    return endpoint


def check_proxy(endpoint: ProxyEndpoint, timeout_s: float = 10.0) -> dict[str, Any]:
    """The proxy's status report; raises `ConnectionError` saying why the proxy cannot serve."""
    from .api import probe_status  # the HTTP layer, loaded only when a kernel asks

    headers = {"Authorization": f"{endpoint.auth_scheme} {endpoint.token}"} if endpoint.token else {}
    try:
        code, status = probe_status(
            endpoint.url,
            "/status",
            headers={**headers, **endpoint.extra_headers},
            cookies=endpoint.cookies,
            timeout_s=timeout_s,
        )
    except errors.ConnectionError as exc:
        raise errors.ConnectionError(
            f"cannot reach the Jupyter server at {endpoint.server_url}: {exc}", code="backend_unavailable"
        ) from exc
    if code == 404:
        raise errors.ConnectionError(
            f"the Jupyter server at {endpoint.server_url} has no cortex-nb proxy; install cortex-nb[lab] in the"
            " server's environment (it enables the cortex_server extension) and restart it",
            code="proxy_not_configured",
        )
    if code in (401, 403):
        raise errors.ConnectionError(
            f"the Jupyter server at {endpoint.server_url} refused this kernel's credentials (HTTP"
            f" {code}); connect with a URL and token instead",
            code="unauthenticated",
        )
    if code != 200 or not isinstance(status, dict):
        raise errors.ConnectionError(
            f"the cortex-nb proxy at {endpoint.url} answered HTTP {code}",
            code="backend_unavailable",
        )
    if not status.get("reachable") or not status.get("authenticated"):
        error = status.get("error") or {}
        raise errors.ConnectionError(
            f"the Jupyter server's cortex-nb proxy cannot use its backend ({status.get('backend_url')}):"
            f" {error.get('message', 'unknown reason')}",
            code=error.get("code") or "backend_unavailable",
        )
    return status


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
