"""Starting the user's local backend for the sidebar's "Start local backend" button.

The same `ensure_local_backend` that `%cortex connect --local` calls: it finds a running one or starts
one as its own session (it belongs to no kernel and not to this server; it stops by itself after an
idle period), safe against a kernel starting it at the same moment. It blocks until the backend
answers, so it runs off the IO loop, and clicks that arrive while a start is under way share it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from cortex_nb.errors import ApiError, CortexError


class LocalBackendStarter:
    def __init__(self, local_dir: Path) -> None:
        self.local_dir = local_dir
        self._start: asyncio.Future | None = None

    async def start(self) -> None:
        """Return once the local backend answers; ApiError `backend_unavailable` saying why if it cannot start."""
        if self._start is None or self._start.done():
            self._start = asyncio.get_running_loop().run_in_executor(None, self._ensure)
        try:
            # Shielded: a caller that goes away does not cancel the start the others wait on.
            await asyncio.shield(self._start)
        except CortexError as exc:
            raise ApiError("backend_unavailable", f"the local backend did not start: {exc.message}") from None

    def _ensure(self) -> None:
        from cortex_nb.local import ensure_local_backend

        ensure_local_backend(self.local_dir)
