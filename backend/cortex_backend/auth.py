"""Tokens with scopes. Tokens are stored only as SHA-256 hashes and shown once at creation.

A token arrives as `Authorization: Bearer <token>` or as `X-API-Key: <token>` (how the Tinker SDK sends its
keys). A token created with the Tinker prefix (`tml-`, which that SDK requires) is an ordinary token: same
table, same scopes, same owner isolation.
"""

from __future__ import annotations

import getpass
import hashlib
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from cortex_nb.protocol.errors import ApiError
from cortex_nb.protocol.routes import ADMIN, READ, RUNS, SCOPES, WRITE

from .store import Store

TOKEN_PREFIX = "ctx_"
TINKER_TOKEN_PREFIX = "tml-"
API_KEY_HEADER = "X-API-Key"


@dataclass(frozen=True)
class Principal:
    """Who is calling: the owner whose jobs they see, and what they may do."""

    token_id: str
    owner: str
    scopes: frozenset[str]
    # The highest queue priority this token may ask (None: the backend's --token-max-priority).
    max_priority: int | None = None

    @property
    def is_admin(self) -> bool:
        return ADMIN in self.scopes

    def has(self, scope: str) -> bool:
        return self.is_admin or scope in self.scopes

    def require(self, *scopes: str) -> None:
        missing = [scope for scope in scopes if not self.has(scope)]
        if missing:
            raise ApiError(
                "forbidden",
                f"this token lacks the scope(s) {', '.join(missing)}; create a token with them"
                " (cortex-nb backend token create --scopes ...)",
                {"missing_scopes": missing},
            )

    def can_see(self, owner: str) -> bool:
        return self.is_admin or owner == self.owner


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def create_token(
    store: Store,
    name: str,
    scopes: list[str],
    owner: str | None = None,
    prefix: str = TOKEN_PREFIX,
    max_priority: int | None = None,
) -> str:
    """Create a token and return it; only its hash is kept. `prefix` only changes how the token reads."""
    unknown = sorted(set(scopes) - set(SCOPES))
    if unknown:
        raise ValueError(f"unknown scope(s) {unknown}; choose from {list(SCOPES)}")
    if not scopes:
        raise ValueError(f"give at least one scope from {list(SCOPES)}")
    if prefix not in (TOKEN_PREFIX, TINKER_TOKEN_PREFIX):
        raise ValueError(f"unknown token prefix {prefix!r}")
    token = prefix + secrets.token_urlsafe(32)
    token_id = "tok_" + secrets.token_hex(6)
    store.add_token(token_id, name, owner or name, hash_token(token), scopes, max_priority)
    return token


def authenticate(store: Store, header: str | None, api_key: str | None = None) -> Principal:
    """Resolve an `Authorization: Bearer ...` header (or else an `X-API-Key` header), or raise `unauthenticated`."""
    if header and header.startswith("Bearer "):
        token = header[len("Bearer ") :].strip()
    elif api_key and not header:
        token = api_key.strip()
    else:
        raise ApiError(
            "unauthenticated",
            f"send 'Authorization: Bearer <token>' (or '{API_KEY_HEADER}: <token>'); the backend's admin token is in DATA_DIR/admin.token",
        )
    row = store.token_by_hash(hash_token(token))
    if row is None:
        raise ApiError(
            "unauthenticated",
            "the token is unknown or revoked; create one with 'cortex-nb backend token create'",
        )
    return Principal(
        token_id=row["id"],
        owner=row["owner"],
        scopes=frozenset(row["scopes"]),
        max_priority=row.get("max_priority"),
    )


def ensure_admin_token(store: Store, path: Path) -> None:
    """On first start, create an admin token and write it to `path` with mode 0600."""
    _ensure_token_file(store, path, "admin", [ADMIN])


# What the OS user's own processes (kernels, the Jupyter server) may do with the user token: their own
# jobs and runs, nothing of anyone else's.
USER_SCOPES = [READ, WRITE, RUNS]


def ensure_user_token(store: Store, path: Path, owner: str | None = None) -> None:
    """On first start, create a token for the OS user running the backend (owner = their user name,
    not admin) and write it to `path` with mode 0600: every kernel and the Jupyter server of that user
    connect with it, so they all see the same jobs."""
    _ensure_token_file(store, path, owner or os_user_name(), USER_SCOPES)


def os_user_name() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return f"uid-{os.getuid()}"


def _ensure_token_file(store: Store, path: Path, owner: str, scopes: list[str]) -> None:
    if path.exists():
        token = path.read_text().strip()
        if store.token_by_hash(hash_token(token)) is not None:
            return
    token = create_token(store, owner, scopes)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(token + "\n")
    os.chmod(path, 0o600)
