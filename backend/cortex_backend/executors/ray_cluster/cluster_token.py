"""Ray's token authentication for every Ray process cortex-nb starts or connects from.

A Ray cluster without it runs any code anyone who reaches one of its ports sends, as the user that
started it. So the backend's head runs with `RAY_AUTH_MODE=token` and a token it generates into its
data dir (0600); hosts join with that token (`host join --token-file`, or typed at a prompt), and the
backend refuses a cluster of someone else's that takes clients without one (`--ray-address`) unless
the operator says `--ray-insecure`. The token reaches Ray's processes through the environment (a file
path, or the value itself for a typed token), never through a command line others can read in ps.
"""

from __future__ import annotations

import os
import secrets
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

AUTH_MODE_ENV = "RAY_AUTH_MODE"
TOKEN_PATH_ENV = "RAY_AUTH_TOKEN_PATH"
TOKEN_ENV = "RAY_AUTH_TOKEN"
TOKEN_FILE_NAME = "ray-auth-token"
# What the probe's exit code says about a cluster.
PROBE_OPEN, PROBE_NEEDS_TOKEN = 0, 3
PROBE_TIMEOUT_S = 120.0
# A GCS read with no token: it succeeds only on a cluster that lets anyone in.
PROBE_SCRIPT = """
import sys
from ray._raylet import GcsClient
try:
    GcsClient(address=sys.argv[1]).internal_kv_keys(b"", b"cortex-nb", timeout=30)
except Exception as exc:
    print(f"{type(exc).__name__}: {exc}"[:400])
    sys.exit(3 if type(exc).__name__ == "AuthenticationError" else 4)
"""


class ClusterTokenError(Exception):
    """The token is missing, unreadable or exposed; the message says what to do."""


def ensure_token_file(path: Path) -> Path:
    """The head's token: made once (random, 0600, this user's), kept across restarts so hosts stay valid."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        read_token_file(path)  # refuse one that others can read or that is empty
        return path
    with os.fdopen(fd, "w") as handle:
        handle.write(secrets.token_hex(32))
    return path


def read_token_file(path: Path) -> str:
    """A token file's value, refusing a file another user owns or may read (as ssh refuses such a key)."""
    try:
        info = path.stat()
        token = path.read_text().strip()
    except OSError as exc:
        raise ClusterTokenError(f"cannot read the Ray token file {path}: {exc.strerror}") from None
    if info.st_uid != os.getuid() or stat.S_IMODE(info.st_mode) & 0o077:
        raise ClusterTokenError(
            f"the Ray token file {path} must belong to this user and be readable by it alone (chmod 600 {path})"
        )
    if not token or any(char.isspace() for char in token):
        raise ClusterTokenError(f"the Ray token file {path} holds no token (one line, no spaces)")
    return token


def token_environment(token_file: Path | None = None, token: str | None = None) -> dict[str, str]:
    """The variables that make a Ray process use token authentication with this token."""
    env = {AUTH_MODE_ENV: "token"}
    if token_file is not None:
        env[TOKEN_PATH_ENV] = str(token_file.resolve())
    elif token is not None:
        env[TOKEN_ENV] = token
    return env


def disabled_environment() -> dict[str, str]:
    """For a cluster the operator chose to run without authentication (`--ray-insecure`)."""
    return {AUTH_MODE_ENV: "disabled"}


def apply_to_this_process(env: dict[str, str]) -> None:
    """Make this process (a driver, a GCS client) and the Ray processes it starts use `env`'s mode and token.
    Ray reads the mode once into its config: re-read it, as Ray does when it turns token mode on itself."""
    for key in (AUTH_MODE_ENV, TOKEN_PATH_ENV, TOKEN_ENV):
        os.environ.pop(key, None)
    os.environ.update(env)
    from ray._raylet import AuthenticationTokenLoader, Config

    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


def cluster_takes_anyone(address: str) -> bool:
    """Whether the Ray cluster at `address` answers a client that has no token. Asked from a fresh process
    with authentication off (this process's Ray settings are process-wide)."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("RAY_AUTH")}
    env.update(disabled_environment())
    with tempfile.TemporaryDirectory(prefix="cortex-ray-probe-") as home:
        env["HOME"] = home  # no ~/.ray/auth_token either
        try:
            probe = subprocess.run(
                [sys.executable, "-c", PROBE_SCRIPT, address],
                env=env,
                capture_output=True,
                text=True,
                timeout=PROBE_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired:
            raise ClusterTokenError(f"the Ray cluster at {address} did not answer") from None
    if probe.returncode == PROBE_OPEN:
        return True
    if probe.returncode == PROBE_NEEDS_TOKEN:
        return False
    raise ClusterTokenError(
        f"cannot reach the Ray cluster at {address}: {(probe.stdout or probe.stderr).strip()[-400:]}"
    )
