"""What the Jupyter server extension answers itself, not forwarded from the backend: its status report
(`GET {base_url}cortex/api/status`, also the answer of `POST .../local/start`). The extension builds
the report from these classes, and the panel's TypeScript and the kernel's proxy check read it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .base import ErrorDetail, Reply

# How the extension found its backend (`source.kind`).
SOURCE_CONFIG = "config"  # CortexServerApp.backend_url
SOURCE_ENVIRONMENT = "environment"  # CORTEX_URL in the server's environment
SOURCE_LOCAL = "local"  # the per-user local backend's state file
BACKEND_SOURCES = (SOURCE_CONFIG, SOURCE_ENVIRONMENT, SOURCE_LOCAL)


class BackendSource(Reply):
    """How the server extension found its backend."""

    kind: Literal[BACKEND_SOURCES] = Field(  # type: ignore[valid-type]
        description="`config`: CortexServerApp.backend_url; `environment`: CORTEX_URL;"
        " `local`: the local backend's state file"
    )
    description: str
    state_file: str | None
    pid: int | None
    can_start_local: bool = Field(
        description='whether "Start local backend" may be offered (only when no backend is configured)'
    )


class ExtensionVersion(Reply):
    """The versions of the server extension itself."""

    version: str
    api_version: str


class BackendVersion(Reply):
    """What the backend's `GET /version` said (a field it left out is null)."""

    service: str | None
    version: str | None
    api_version: str | None


class Identity(Reply):
    """Who the server's backend token is (`GET /v1/whoami`)."""

    owner: str | None
    scopes: list[str] | None


class ExtensionStatus(Reply):
    """`GET {base_url}cortex/api/status`: which backend the server uses and how it found it, can it reach
    it, does its token work there, and do the versions match."""

    backend_url: str | None = Field(description="null while no local backend runs")
    source: BackendSource
    extension: ExtensionVersion
    backend: BackendVersion | None = Field(description="null until the backend answered `/version`")
    reachable: bool
    authenticated: bool
    identity: Identity | None
    versions_match: bool = Field(description="the backend runs the extension's package version")
    api_compatible: bool = Field(description="the backend speaks the extension's API major")
    error: ErrorDetail | None = Field(description="why the backend cannot be used, or null")
