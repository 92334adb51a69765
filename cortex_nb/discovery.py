"""How `%cortex connect` finds a backend: explicit target, or the chain env -> default profile ->
the proxy of the Jupyter server this kernel runs under -> instructions.

An explicit source that is configured but unreachable is an error, never a silent fall-through:
a user who set CORTEX_URL wants that backend, not another one.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import profiles
from .client import Client


@dataclass
class Connection:
    client: Client
    source: str  # where the endpoint came from, for messages
    local: bool = False  # this user's local backend (`%cortex connect --local`)

    def describe(self) -> str:
        version = (self.client.backend_version or {}).get("version", "?")
        return f"connected to {self.client.url} (backend {version}) via {self.source}"


def how_to_connect() -> str:
    """What to do when nothing is configured."""
    return "\n".join(
        [
            "no cortex backend is configured. Connect with one of:",
            "  %cortex connect --local                           your local backend on this machine (started if none runs)",
            "  %cortex connect http://HOST:8765 --token-env VAR  a backend URL; the token is read from $VAR",
            "  %cortex connect https://HOST:8765 --verify sha256:...  an https backend, its certificate pinned",
            f"  %cortex connect PROFILE                           a profile in {profiles.config_path()}",
            "  or set CORTEX_URL and CORTEX_TOKEN in the kernel's environment, then %cortex connect;",
            "  or run the kernel under a Jupyter server with the cortex-nb server extension configured",
            "  (docs/jupyter.md): %cortex connect then goes through its proxy.",
        ]
    )


def discover(**client_options: Any) -> Connection | None:
    """The first configured source: env CORTEX_URL/CORTEX_TOKEN, the default profile, then the proxy
    of the Jupyter server running this kernel (the backend token then never enters the kernel)."""
    endpoint = profiles.from_env() or profiles.from_profile(None)
    if endpoint is not None:
        return Connection(
            Client(endpoint.url, endpoint.token, verify=endpoint.verify, **client_options), endpoint.source
        )
    from .jupyter_proxy import find_proxy_endpoint

    proxy = find_proxy_endpoint()  # raises, saying why, when a server was found but its proxy cannot serve
    if proxy is not None:
        return Connection(
            Client(proxy.url, proxy.token, **proxy.client_kwargs(), **client_options), proxy.source
        )
    return None


def connect_profile(name: str, **client_options: Any) -> Connection:
    endpoint = profiles.from_profile(name)
    assert endpoint is not None  # from_profile raises for a missing name
    return Connection(
        Client(endpoint.url, endpoint.token, verify=endpoint.verify, **client_options), endpoint.source
    )


def connect_url(
    url: str, token_env: str | None = None, verify: str | None = None, **client_options: Any
) -> Connection:
    """A URL, with the token from `$token_env` (default CORTEX_TOKEN, if set); `verify` checks an https
    URL's certificate (a sha256: pin or a CA file; default $CORTEX_VERIFY, else the system's CAs)."""
    from .errors import CortexError

    variable = token_env or "CORTEX_TOKEN"
    token = os.environ.get(variable)
    if token_env and not token:
        raise CortexError(
            f"${token_env} is not set in the kernel's environment; set it or pass --token-env",
            code="invalid_request",
        )
    source = f"{url} with the token from ${variable}" if token else f"{url} without a token"
    return Connection(Client(url, token, verify=verify, **client_options), source)


def connect_local(data_dir: str | Path | None = None, **client_options: Any) -> Connection:
    """This user's local backend, found through its state file or started (it outlives the kernel)."""
    client = Client.local(data_dir, **client_options)
    return Connection(client, f"your local backend in {client.local_backend.data_dir}", local=True)
