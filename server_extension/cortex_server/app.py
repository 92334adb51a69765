"""The extension app: its settings (typed traitlets with laptop defaults) and its routes."""

from __future__ import annotations

import os
from pathlib import Path

from jupyter_server.extension.application import ExtensionApp
from jupyter_server.utils import url_path_join
from traitlets import Float, Unicode, default

from cortex_nb.local import default_local_dir

from .backend import BackendConnection, default_token_file
from .discovery import locate
from .handlers import LocalBackendStartHandler, ProxyHandler, RecordHandler, StatusHandler
from .local_start import LocalBackendStarter

API_PATH = "cortex/api"


class CortexServerApp(ExtensionApp):
    """Forwards allowlisted backend routes for the JupyterLab panel and kernels, holding the token."""

    name = "cortex_server"
    load_other_extensions = True

    backend_url = Unicode(
        "",
        config=True,
        help="The cortex-nb backend's URL (else env CORTEX_URL). With neither, the server uses the user's local"
        " backend, found through its state file in local_dir, and the sidebar can start it.",
    )
    token_file = Unicode(
        config=True,
        help="For a configured backend_url: a file holding the backend token the server uses (env"
        " CORTEX_TOKEN_FILE; default: the user token, not admin, that a backend with default settings writes,"
        " ~/.local/share/cortex-nb/backend/user.token). The local backend's token is the one its state file names.",
    )
    local_dir = Unicode(
        config=True,
        help="Where the user's local backend keeps its state file, backend.json (default: env CORTEX_LOCAL_DIR,"
        " else $XDG_DATA_HOME/cortex-nb/local), the same place %cortex connect --local looks.",
    )
    backend_verify = Unicode(
        config=True,
        help="For an https backend_url: a 'sha256:...' fingerprint to pin (what `cortex-nb backend serve --tls"
        " self-signed` prints) or a CA file; empty: the system's CAs (env CORTEX_VERIFY).",
    )
    connect_timeout_s = Float(10.0, config=True, help="Seconds to wait for a connection to the backend.")
    request_timeout_s = Float(
        300.0,
        config=True,
        help="Seconds a forwarded call may take, long-polls included (they ask for at most 60 s).",
    )

    @default("backend_verify")
    def _default_backend_verify(self) -> str:
        return os.environ.get("CORTEX_VERIFY", "")

    @default("token_file")
    def _default_token_file(self) -> str:
        return os.environ.get("CORTEX_TOKEN_FILE") or default_token_file()

    @default("local_dir")
    def _default_local_dir(self) -> str:
        return str(default_local_dir())

    def initialize_handlers(self) -> None:
        local_dir = Path(self.local_dir).expanduser()
        locator = locate(self.backend_url, self.token_file, local_dir)
        self.connection = BackendConnection(
            locator,
            connect_timeout_s=self.connect_timeout_s,
            request_timeout_s=self.request_timeout_s,
            verify=self.backend_verify or None,
        )
        # ExtensionApp prepends base_url to these patterns (JupyterHub's /user/NAME/ included).
        api_prefix = url_path_join(self.serverapp.base_url, API_PATH)
        arguments = {
            "connection": self.connection,
            "api_prefix": api_prefix,
            "starter": LocalBackendStarter(local_dir),
        }
        self.handlers.extend(
            [
                (url_path_join("/", API_PATH, "status"), StatusHandler, arguments),
                (url_path_join("/", API_PATH, "local", "start"), LocalBackendStartHandler, arguments),
                (url_path_join("/", API_PATH, "record", r"([A-Za-z0-9_.-]+)"), RecordHandler, arguments),
                # Every other path under cortex/api goes through the allowlist, which names what it refuses.
                (url_path_join("/", API_PATH, r"(.+)"), ProxyHandler, arguments),
            ]
        )
        self.log.info("cortex_server: forwarding %s to %s", api_prefix, self.connection.target().description)

    async def stop_extension(self) -> None:
        self.connection.close()
