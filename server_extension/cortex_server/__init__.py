"""cortex_server: the Jupyter server extension that lets the browser panel and kernels reach the
cortex-nb backend through Jupyter's own authentication, while the backend token stays on the server.

Enabled on install (etc/jupyter/jupyter_server_config.d/cortex_server.json); configure with
`--CortexServerApp.backend_url=...` and `--CortexServerApp.token_file=...` or env `CORTEX_URL` /
`CORTEX_TOKEN_FILE`. docs/jupyter.md describes it.
"""

from __future__ import annotations

from typing import Any

from cortex_nb.protocol.versions import __version__

from .app import CortexServerApp

__all__ = ["CortexServerApp", "__version__"]


def _jupyter_server_extension_points() -> list[dict[str, Any]]:
    return [{"module": "cortex_server", "app": CortexServerApp}]
