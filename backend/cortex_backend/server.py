"""Run the backend: start the service, listen on loopback (or the given host), write backend.json."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
from pathlib import Path

import tornado.httpserver
import tornado.netutil

from cortex_nb.version import API_VERSION, __version__

from . import log_limits
from .app import MAX_STREAMED_BODY, make_app
from .compat import url_specs as face_url_specs
from .config import BackendSettings
from .connections import GuardedHTTPServer, raise_descriptor_limit
from .service import Service
from .tls import SELF_SIGNED, TlsFiles, plaintext_warning, self_signed_files, server_context

log = logging.getLogger("cortex_backend")


def _listen(server: tornado.httpserver.HTTPServer, host: str, port: int) -> int:
    sockets = tornado.netutil.bind_sockets(port, address=host, family=socket.AF_INET if host.count(".") == 3 else socket.AF_UNSPEC)
    server.add_sockets(sockets)
    return sockets[0].getsockname()[1]


def tls_files(settings: BackendSettings) -> TlsFiles | None:
    """The certificate and key to serve with, if any (a self-signed pair is made on first use)."""
    if settings.tls == SELF_SIGNED:
        return self_signed_files(settings.data_dir, settings.host)
    if settings.tls_cert is not None and settings.tls_key is not None:
        return TlsFiles(settings.tls_cert, settings.tls_key)
    return None


async def run(settings: BackendSettings) -> None:
    files = tls_files(settings)
    ssl_options = server_context(files) if files is not None else None
    warning = plaintext_warning(settings.host) if files is None else None
    if warning:
        log.warning(warning)
        print(warning, flush=True)
    descriptors = raise_descriptor_limit()
    service = Service(settings)
    await service.start()
    server = GuardedHTTPServer(
        make_app(service, face_url_specs(service)), max_body_size=MAX_STREAMED_BODY, ssl_options=ssl_options,
        # A header block, or a whole body, that has not arrived by then closes the connection.
        idle_connection_timeout=settings.http_idle_timeout_s, body_timeout=settings.http_body_timeout_s,
    )
    # Leave descriptors for the store, workers and runs whatever the cap says.
    server.max_connections = max(16, min(settings.max_connections, descriptors // 2))
    port = _listen(server, settings.host, settings.port)
    url = f"{'https' if files else 'http'}://{settings.host}:{port}"
    endpoint = {"url": url, "pid": os.getpid(), "version": __version__, "api_version": API_VERSION,
                "token_file": str(settings.admin_token_path)}
    if files is not None:
        # Local clients (Client.local(), the Jupyter extension) pin this instead of trusting any certificate.
        endpoint["tls_fingerprint"] = files.fingerprint()
    temporary = settings.endpoint_path.with_suffix(".tmp")
    with os.fdopen(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as handle:
        handle.write(json.dumps(endpoint))
    temporary.replace(settings.endpoint_path)
    devices = ", ".join(f"{d.id} ({d.name}, {d.slots} slots)" for d in service.devices)
    log.info("cortex-nb backend %s listening on %s; devices: %s; models: %s", __version__, url, devices, service.catalog.names())
    print(f"cortex-nb backend listening on {url} (admin token in {settings.admin_token_path})", flush=True)
    if files is not None:
        print(f"TLS certificate {files.cert}; clients pin it with verify = \"{endpoint['tls_fingerprint']}\"", flush=True)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    watcher = asyncio.create_task(_stop_when_parent_exits(settings.parent_pid, stop)) if settings.parent_pid else None
    await stop.wait()
    if watcher is not None:
        watcher.cancel()
    server.stop()
    await service.stop()
    settings.endpoint_path.unlink(missing_ok=True)


async def _stop_when_parent_exits(pid: int, stop: asyncio.Event, interval_s: float = 2.0) -> None:
    """An embedded backend must not outlive its kernel, even one killed without cleanup."""
    while True:
        await asyncio.sleep(interval_s)
        if _has_exited(pid):
            log.info("parent process %d exited: stopping", pid)
            stop.set()
            return


def _has_exited(pid: int) -> bool:
    """Gone, or a zombie: a process that has exited but was not reaped (yet, or ever, under a container
    init that does not reap) still answers signal 0."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state in ("Z", "X")


def serve(settings: BackendSettings) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for handler in logging.getLogger().handlers:
        log_limits.install(handler)
    # One line per HTTP request drowns what matters; errors still log.
    logging.getLogger("tornado.access").setLevel(logging.WARNING)
    asyncio.run(run(settings))
