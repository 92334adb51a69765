"""Run the backend: start the service, listen on loopback (or the given host), write backend.json.

backend.json (mode 0600, in the data dir) is how a user's processes find a running backend: its URL,
pid, the user token's file (`user.token`: what kernels and the Jupyter server connect with), the admin
token's file, versions, when it started and its data dir. For the per-user local backend, that data
dir is `cortex_nb.local.default_local_dir()`: the one state file every notebook and the sidebar share.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path

import tornado.httpserver
import tornado.netutil

from cortex_nb.protocol.process_identity import process_start
from cortex_nb.protocol.versions import API_VERSION, __version__

from . import log_limits
from .app import MAX_STREAMED_BODY, make_app
from .auth import ensure_user_token
from .compat import url_specs as face_url_specs
from .config import BackendSettings
from .connections import GuardedHTTPServer, raise_descriptor_limit
from .sampler_choice import sampler_note
from .service import Service
from .tls import SELF_SIGNED, TlsFiles, plaintext_warning, self_signed_files, server_context

log = logging.getLogger("cortex_backend")


def _listen(server: tornado.httpserver.HTTPServer, host: str, port: int) -> int:
    sockets = tornado.netutil.bind_sockets(
        port, address=host, family=socket.AF_INET if host.count(".") == 3 else socket.AF_UNSPEC
    )
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
    ensure_user_token(service.store, settings.user_token_path)
    server = GuardedHTTPServer(
        make_app(service, face_url_specs(service)),
        max_body_size=MAX_STREAMED_BODY,
        ssl_options=ssl_options,
        # A header block, or a whole body, that has not arrived by then closes the connection.
        idle_connection_timeout=settings.http_idle_timeout_s,
        body_timeout=settings.http_body_timeout_s,
    )
    # Leave descriptors for the store, workers and runs whatever the cap says.
    server.max_connections = max(16, min(settings.max_connections, descriptors // 2))
    server.max_connections_per_address = settings.max_connections_per_address
    server.first_line_timeout_s = settings.http_first_line_timeout_s
    port = _listen(server, settings.host, settings.port)
    url = f"{'https' if files else 'http'}://{settings.host}:{port}"
    devices = ", ".join(f"{d.id} ({d.name}, {d.slots} slots)" for d in service.devices)
    log.info(
        "cortex-nb backend %s listening on %s; devices: %s; models: %s",
        __version__,
        url,
        devices,
        service.catalog.names(),
    )
    log.info("%s", sampler_note(settings.sampler, service.devices))
    print(f"cortex-nb backend listening on {url} (admin token in {settings.admin_token_path})", flush=True)
    if files is not None:
        print(
            f'TLS certificate {files.cert}; clients pin it with verify = "{files.fingerprint()}"', flush=True
        )
    # Published last, so whoever waits for the endpoint file also finds the lines above already printed.
    # Local clients (Client.local(), the Jupyter extension) pin the fingerprint instead of trusting any certificate.
    write_endpoint(
        settings, url, files.fingerprint() if files is not None else None, service.executor.describe()
    )

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    watchers = []
    if settings.idle_exit_s is not None:
        watchers.append(asyncio.create_task(_stop_when_idle(service.has_work, settings.idle_exit_s, stop)))
    await stop.wait()
    for watcher in watchers:
        watcher.cancel()
    await _drain(service, settings.drain_grace_s)
    server.stop()
    await service.stop()
    _remove_own_endpoint(settings.endpoint_path)


async def _drain(service: Service, grace_s: float) -> None:
    """Drain before stopping (drain.py), still answering HTTP meanwhile; a second SIGTERM or SIGINT
    cuts the drain short."""
    loop = asyncio.get_running_loop()
    again = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, again.set)
    print(f"cortex-nb backend draining (at most {grace_s:.0f}s; signal again to stop now)", flush=True)
    draining = asyncio.create_task(service.drain.run(grace_s))
    interrupted = asyncio.create_task(again.wait())
    await asyncio.wait((draining, interrupted), return_when=asyncio.FIRST_COMPLETED)
    interrupted.cancel()
    if not draining.done():
        log.warning("stopping now: the drain was interrupted by a second signal")
        draining.cancel()


def write_endpoint(
    settings: BackendSettings, url: str, tls_fingerprint: str | None = None, executor: dict | None = None
) -> None:
    """backend.json, atomically and readable by this user only (it names the token files). `executor`
    describes the executor (a Ray backend's gives the address hosts join)."""
    endpoint = {
        "url": url,
        "pid": os.getpid(),
        # Who a client may trust with a token, and signal: this process (by its start time) and a listener
        # that proves it knows the nonce (cortex_nb/local_identity.py, cortex_nb/protocol/backend_proof.py).
        "pid_start": process_start(os.getpid()),
        "nonce": settings.endpoint_nonce,
        "token_file": str(settings.user_token_path),
        "admin_token_file": str(settings.admin_token_path),
        "version": __version__,
        "api_version": API_VERSION,
        "started_at": time.time(),
        "data_dir": str(settings.data_dir),
    }
    if tls_fingerprint is not None:
        endpoint["tls_fingerprint"] = tls_fingerprint
    if executor is not None:
        endpoint["executor"] = executor
    temporary = settings.endpoint_path.with_name(f".{settings.endpoint_path.name}.{os.getpid()}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(json.dumps(endpoint))
    temporary.replace(settings.endpoint_path)


def _remove_own_endpoint(path: Path) -> None:
    """Remove backend.json unless a newer backend has written its own there meanwhile."""
    try:
        if json.loads(path.read_text()).get("pid") == os.getpid():
            path.unlink(missing_ok=True)
    except (OSError, ValueError):
        pass


async def _stop_when_idle(has_work: Callable[[], bool], idle_exit_s: float, stop: asyncio.Event) -> None:
    """The per-user local backend belongs to no kernel: it stops itself after `idle_exit_s` seconds with
    no job queued or running and no source run."""
    idle_since = time.monotonic()
    interval = min(5.0, max(idle_exit_s / 10, 0.2))
    while True:
        await asyncio.sleep(interval)
        if has_work():
            idle_since = time.monotonic()
        elif time.monotonic() - idle_since >= idle_exit_s:
            log.info("no jobs or runs for %.0fs: stopping (--idle-exit)", idle_exit_s)
            stop.set()
            return


def serve(settings: BackendSettings) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for handler in logging.getLogger().handlers:
        log_limits.install(handler)
    # One line per HTTP request drowns what matters; errors still log.
    logging.getLogger("tornado.access").setLevel(logging.WARNING)
    asyncio.run(run(settings))
