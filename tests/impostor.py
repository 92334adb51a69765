"""An impostor backend: a listener run as a second uid (setpriv) that answers /version as a backend would
and writes down every Authorization header it is sent. What a stale backend.json could point at."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from cortex_nb.protocol.versions import API_VERSION, __version__

from .unprivileged import SYSTEM_PYTHON, UNPRIVILEGED_UID, as_user

# A listener that looks like a backend on /version and writes down every Authorization header it is sent.
IMPOSTOR = """
import json, sys
from http.server import BaseHTTPRequestHandler, HTTPServer

port, log, version, api_version, ready = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]

class Handler(BaseHTTPRequestHandler):
    def _answer(self):
        if self.headers.get("Authorization"):
            with open(log, "a") as handle:
                handle.write(self.headers["Authorization"] + "\\n")
        body = {"service": "cortex-nb-backend", "version": version, "api_version": api_version}
        if not self.path.startswith("/version"):
            body = {"owner": "victim", "token_id": "t", "scopes": []}
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = _answer

    def log_message(self, *args):
        pass

server = HTTPServer(("127.0.0.1", port), Handler)
open(ready, "w").write(str(server.server_address[1]))
server.serve_forever()
"""


@contextmanager
def attacker_folder() -> Iterator[Path]:
    """A scratch dir the second uid can use (pytest's tmp_path lies under a root-only dir)."""
    path = Path(tempfile.mkdtemp(prefix="cortex-impostor-", dir="/tmp"))
    path.chmod(0o777)
    (path / "impostor.py").write_text(IMPOSTOR)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def start_impostor(folder: Path, port: int) -> tuple[subprocess.Popen, Path]:
    """The impostor as uid 4242 on `port` (0: any); (its process, the file of headers it received)."""
    log, ready = folder / "received.txt", folder / "port.txt"
    ready.unlink(missing_ok=True)
    process = subprocess.Popen(
        [
            *as_user(UNPRIVILEGED_UID),
            SYSTEM_PYTHON,
            str(folder / "impostor.py"),
            str(port),
            str(log),
            __version__,
            API_VERSION,
            str(ready),
        ],
        env={"PATH": "/usr/bin:/bin"},
    )
    deadline = time.monotonic() + 30
    while not (ready.exists() and ready.read_text()):
        assert process.poll() is None, "the impostor could not listen"
        assert time.monotonic() < deadline
        time.sleep(0.05)
    return process, log


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.kill()
    process.wait(10)


def received(log: Path) -> str:
    return log.read_text() if log.exists() else ""
