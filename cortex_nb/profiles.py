"""Where a client finds its backend: env `CORTEX_URL`/`CORTEX_TOKEN`, or a named profile in
`~/.config/cortex-nb/config.toml` (override the path with `CORTEX_CONFIG`).

    default = "gpu"
    [profiles.gpu]
    url = "https://gpu-host:8765"
    token_env = "GPU_TOKEN"        # or token = "...", or token_file = "~/gpu.token"
    verify = "sha256:..."          # https: a pinned fingerprint, or a CA file path (default: system CAs)
    reconnect_s = 300              # how long waits ride through a backend restart (default 180)

`CORTEX_VERIFY` does for `CORTEX_URL` what `verify` does in a profile.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from .errors import CortexError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


@dataclass(frozen=True)
class Endpoint:
    url: str
    token: str | None
    source: str  # where it came from, for messages
    # How an https URL's certificate is checked (cortex_nb/tls.py); None: $CORTEX_VERIFY, else system CAs.
    verify: bool | str | None = None
    # How long waits on a job ride through a backend that does not answer; None: the client's default.
    reconnect_s: float | None = None


def config_path() -> Path:
    explicit = os.environ.get("CORTEX_CONFIG")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "cortex-nb" / "config.toml"


def read_token_file(path: str | Path) -> str:
    return Path(path).expanduser().read_text().strip()


def from_env() -> Endpoint | None:
    url = os.environ.get("CORTEX_URL")
    if not url:
        return None
    token = os.environ.get("CORTEX_TOKEN")
    if not token and os.environ.get("CORTEX_TOKEN_FILE"):
        token = read_token_file(os.environ["CORTEX_TOKEN_FILE"])
    return Endpoint(url, token, "environment (CORTEX_URL)", os.environ.get("CORTEX_VERIFY") or None)


def load_profiles() -> tuple[str | None, dict[str, dict]]:
    path = config_path()
    if not path.exists():
        return None, {}
    with path.open("rb") as handle:
        data = tomllib.load(handle)
    return data.get("default"), dict(data.get("profiles") or {})


def from_profile(name: str | None = None) -> Endpoint | None:
    default, profiles = load_profiles()
    chosen = name or default
    if chosen is None:
        return None
    profile = profiles.get(chosen)
    if profile is None:
        raise CortexError(
            f"no profile {chosen!r} in {config_path()}; profiles there: {sorted(profiles) or 'none'}",
            code="invalid_request",
        )
    if "url" not in profile:
        raise CortexError(f"profile {chosen!r} in {config_path()} has no url", code="invalid_request")
    token = profile.get("token")
    if not token and profile.get("token_env"):
        token = os.environ.get(profile["token_env"])
        if not token:
            raise CortexError(
                f"profile {chosen!r} reads its token from ${profile['token_env']}, which is not set",
                code="invalid_request",
            )
    if not token and profile.get("token_file"):
        token = read_token_file(profile["token_file"])
    verify = profile.get("verify")
    if verify is not None and not isinstance(verify, (bool, str)):
        raise CortexError(
            f"profile {chosen!r} in {config_path()}: verify must be true, false, a sha256: pin or a CA file path",
            code="invalid_request",
        )
    reconnect_s = profile.get("reconnect_s")
    if reconnect_s is not None and (
        isinstance(reconnect_s, bool) or not isinstance(reconnect_s, (int, float)) or reconnect_s < 0
    ):
        raise CortexError(
            f"profile {chosen!r} in {config_path()}: reconnect_s must be a number of seconds >= 0",
            code="invalid_request",
        )
    return Endpoint(
        profile["url"],
        token,
        f"profile {chosen!r} in {config_path()}",
        verify,
        float(reconnect_s) if reconnect_s is not None else None,
    )


def save_profile(
    name: str,
    url: str,
    token: str | None = None,
    token_env: str | None = None,
    make_default: bool = False,
    verify: str | None = None,
) -> Path:
    """Write (or replace) a profile; the file is created with mode 0600 as it may hold a token."""
    default, profiles = load_profiles()
    values = {"url": url, "token": token, "token_env": token_env, "verify": verify}
    profiles[name] = {key: value for key, value in values.items() if value}
    default = name if make_default or default is None else default
    lines = [f"default = {_quote(default)}", ""]
    for profile_name, values in sorted(profiles.items()):
        lines.append(f"[profiles.{_quote(profile_name)}]")
        lines.extend(f"{key} = {_quote(str(value))}" for key, value in values.items())
        lines.append("")
    path = config_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write("\n".join(lines))
    return path


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
