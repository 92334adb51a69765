"""Which backend the server forwards to, and how it found it.

A backend named in the server's configuration (the `backend_url` trait, else env `CORTEX_URL`) is used
as given. With none named, the server uses the user's local backend: the one `%cortex connect --local`
also uses, found through its state file (`cortex_nb.local.default_local_dir() / "backend.json"`), with
the non-admin token that file names. The state file is read again on every call (a small read and a
look at the process in /proc, far cheaper than the forwarded call), so a backend that starts or dies is
seen on the next call. No token goes to it before its listener has proved it is the backend the file
names (cortex_nb/local_identity.py): that proof is made once per backend start and kept, while every
call checks that the same process (pid and start time) still runs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from cortex_nb.local import proven_problem, running_endpoint
from cortex_nb.local_identity import LocalDirUnsafe, ensure_private_dir
from cortex_nb.protocol.schemas.server_extension import (
    SOURCE_CONFIG,
    SOURCE_ENVIRONMENT,
    SOURCE_LOCAL,
    BackendSource,
)


@dataclass(frozen=True)
class BackendTarget:
    """Where requests go now. `url` is None when no local backend is running."""

    kind: str
    url: str | None
    token_file: str | None
    description: str
    state_file: str | None = None
    pid: int | None = None

    @property
    def found(self) -> bool:
        return self.url is not None

    def source(self) -> BackendSource:
        """How it was found, as the status report tells it."""
        return BackendSource(
            kind=self.kind,
            description=self.description,
            state_file=self.state_file,
            pid=self.pid,
            can_start_local=self.kind == SOURCE_LOCAL,
        )


class BackendLocator(Protocol):
    kind: str

    def current(self) -> BackendTarget: ...


class ConfiguredBackend:
    """A backend named in the configuration or the environment: always the same target."""

    def __init__(self, url: str, token_file: str, kind: str) -> None:
        self.kind = kind
        where = (
            "CortexServerApp.backend_url"
            if kind == SOURCE_CONFIG
            else "CORTEX_URL in the server's environment"
        )
        self._target = BackendTarget(kind, url.rstrip("/"), token_file, f"{url.rstrip('/')}, set by {where}")

    def current(self) -> BackendTarget:
        return self._target


class LocalBackend:
    """The user's local backend, looked up in its state file on every call."""

    kind = SOURCE_LOCAL

    def __init__(self, local_dir: Path) -> None:
        self.local_dir = local_dir
        self.state_file = local_dir / "backend.json"
        # (nonce, pid, start time, url) of the backend whose listener last proved itself.
        self._proven: tuple | None = None

    def _absent(self, why: str) -> BackendTarget:
        return BackendTarget(SOURCE_LOCAL, None, None, why, state_file=str(self.state_file))

    def current(self) -> BackendTarget:
        try:
            ensure_private_dir(self.local_dir.expanduser().resolve())
        except (LocalDirUnsafe, OSError) as exc:
            return self._absent(f"the local backend is not used: {exc}")
        endpoint = running_endpoint(self.state_file)
        url = endpoint.get("url") if endpoint else None
        token_file = endpoint.get("token_file") if endpoint else None
        if not isinstance(url, str) or not isinstance(token_file, str):
            return self._absent(f"no local backend is running (none found through {self.state_file})")
        if Path(token_file).expanduser().resolve().parent != self.local_dir.expanduser().resolve():
            return self._absent(f"{self.state_file} names a token file outside {self.local_dir}; not used")
        identity = (endpoint.get("nonce"), endpoint["pid"], endpoint.get("pid_start"), url)
        if self._proven != identity:
            problem = proven_problem(endpoint)
            if problem is not None:
                return self._absent(
                    f"the local backend found through {self.state_file} is not used: {problem}"
                )
            self._proven = identity
        return BackendTarget(
            SOURCE_LOCAL,
            url.rstrip("/"),
            token_file,
            f"the local backend found through {self.state_file}",
            state_file=str(self.state_file),
            pid=int(endpoint["pid"]),
        )


def locate(backend_url: str, token_file: str, local_dir: Path) -> BackendLocator:
    """The configured backend if one is named (trait first, then CORTEX_URL), else the local one."""
    if backend_url:
        return ConfiguredBackend(backend_url, token_file, SOURCE_CONFIG)
    if os.environ.get("CORTEX_URL"):
        return ConfiguredBackend(os.environ["CORTEX_URL"], token_file, SOURCE_ENVIRONMENT)
    return LocalBackend(local_dir)
