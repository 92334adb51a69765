"""The extension app: its settings (typed traitlets with laptop defaults) and its two routes."""

from __future__ import annotations

import os

from jupyter_server.extension.application import ExtensionApp
from jupyter_server.utils import url_path_join
from traitlets import Float, Unicode, default

from .backend import BackendConnection, default_token_file
from .handlers import ProxyHandler, StatusHandler

API_PATH = "cortex/api"


class CortexServerApp(ExtensionApp):
    """Forwards allowlisted backend routes for the JupyterLab panel and kernels, holding the token."""

    name = "cortex_server"
    load_other_extensions = True

    backend_url = Unicode(
        config=True,
        help="The cortex-nb backend's URL (env CORTEX_URL; default http://127.0.0.1:8765).",
    )
    token_file = Unicode(
        config=True,
        help="A file holding the backend token the server uses (env CORTEX_TOKEN_FILE; default: the admin"
        " token a backend with default settings writes, ~/.local/share/cortex-nb/backend/admin.token).",
    )
    backend_verify = Unicode(
        config=True,
        help="For an https backend_url: a 'sha256:...' fingerprint to pin (what `cortex-nb backend serve --tls"
        " self-signed` prints) or a CA file; empty: the system's CAs (env CORTEX_VERIFY).",
    )
    connect_timeout_s = Float(10.0, config=True, help="Seconds to wait for a connection to the backend.")
    request_timeout_s = Float(
        300.0, config=True, help="Seconds a forwarded call may take, long-polls included (they ask for at most 60 s)."
    )

    @default("backend_url")
    def _default_backend_url(self) -> str:
        return os.environ.get("CORTEX_URL") or "http://127.0.0.1:8765"

    @default("backend_verify")
    def _default_backend_verify(self) -> str:
        return os.environ.get("CORTEX_VERIFY", "")

    @default("token_file")
    def _default_token_file(self) -> str:
        return os.environ.get("CORTEX_TOKEN_FILE") or default_token_file()

    def initialize_handlers(self) -> None:
        self.connection = BackendConnection(
            self.backend_url, self.token_file,
            connect_timeout_s=self.connect_timeout_s, request_timeout_s=self.request_timeout_s,
            verify=self.backend_verify or None,
        )
        # ExtensionApp prepends base_url to these patterns (JupyterHub's /user/NAME/ included).
        api_prefix = url_path_join(self.serverapp.base_url, API_PATH)
        arguments = {"connection": self.connection, "api_prefix": api_prefix}
        self.handlers.extend([
            (url_path_join("/", API_PATH, "status"), StatusHandler, arguments),
            # Every other path under cortex/api goes through the allowlist, which names what it refuses.
            (url_path_join("/", API_PATH, r"(.+)"), ProxyHandler, arguments),
        ])
        self.log.info("cortex_server: forwarding %s to %s", api_prefix, self.connection.url)

    async def stop_extension(self) -> None:
        self.connection.close()
