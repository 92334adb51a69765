"""The process the local executor forks its CPU workers from: it imports torch, transformers and peft once.

Importing them costs a worker process about nine seconds of CPU before it can serve anything; a fork of a
process that already imported them costs milliseconds, and the forks share the libraries' pages
(copy-on-write) where each started process holds its own. The local executor starts this process
(`python -m cortex_backend.worker_forkserver --fd N`, executors/forkserver.py) and asks it for workers over
a packet socket: each request carries the worker's environment and, as passed descriptors, the worker's
channel and its stdout and stderr pipes; the reply is the new worker's pid, and each worker's exit is
reported with its return code (this process is the workers' parent and reaps them).

It never runs a torch operation and sees no GPU (the executor forks CPU workers only: the CUDA driver does
not survive a fork), so every fork starts as clean as a new process would, less the imports.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import selectors
import signal
import socket
import sys
import traceback
from typing import Any

# What workers import later anyway, imported here once (worker.py imports the engine lazily).
PRELOADED = (
    "peft",
    "torch",
    "transformers",
    "cortex_backend.worker_process",
    "cortex_backend.engine.trainer",
    "cortex_backend.engine.loading",
    "cortex_backend.engine.model_state",
    "cortex_backend.engine.sampling_engine",
    "cortex_backend.engine.checkpoint",
    "cortex_backend.engine.scoring",
    "cortex_backend.engine.training_loop",
    "cortex_backend.engine.weight_sync",
)
MAX_REQUEST_BYTES = 1 << 20
PASSED_FDS = 3  # the worker's channel, its stdout, its stderr


def name_process(name: str) -> None:
    """What `ps -o comm` and `top` show for this process (its command line stays the fork server's)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):
        return


def preload() -> None:
    import importlib

    from .library_noise import quiet_library_noise

    quiet_library_noise()
    for name in PRELOADED:
        importlib.import_module(name)


def reap(control: socket.socket) -> None:
    """Report every worker that exited since the last call."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        control.send(json.dumps({"exited": pid, "returncode": os.waitstatus_to_exitcode(status)}).encode())


def become_worker(
    control: socket.socket, wakeup: socket.socket, request: dict[str, Any], fds: list[int]
) -> int:
    """In the fork: take the passed descriptors as the worker's channel and stdio, its environment, then
    serve as a worker process does (worker_process.main). Returns the exit code."""
    channel_fd, stdout_fd, stderr_fd = fds
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    control.close()
    wakeup.close()
    os.setsid()
    name_process("cortex-worker")
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(stdout_fd, 1)
    os.dup2(stderr_fd, 2)
    for fd in (devnull, stdout_fd, stderr_fd):
        os.close(fd)
    os.environ.clear()
    os.environ.update(request["env"])
    # A fork inherits this process's random states: reseed as a new process would be seeded.
    random.seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    sys.argv = [sys.argv[0]]
    from .ipc import BlockingChannel
    from .worker_process import die_with_parent, serve_channel

    die_with_parent()  # this process's parent is the fork server, which dies with the backend
    try:
        serve_channel(BlockingChannel(socket.socket(fileno=channel_fd)))
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
        return 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    return 0


def serve(control: socket.socket) -> int:
    """Fork a worker per request until the backend closes the socket; report exits. Returns the exit code
    of this process, or of a worker when this is a fork that has served as one."""
    wakeup_in, wakeup_out = socket.socketpair()
    wakeup_in.setblocking(False)
    wakeup_out.setblocking(False)
    signal.set_wakeup_fd(wakeup_out.fileno())
    signal.signal(signal.SIGCHLD, lambda *_: None)
    selector = selectors.DefaultSelector()
    selector.register(control, selectors.EVENT_READ, "control")
    selector.register(wakeup_in, selectors.EVENT_READ, "wakeup")
    control.send(json.dumps({"ready": os.getpid()}).encode())
    while True:
        for key, _ in selector.select():
            if key.data == "wakeup":
                try:
                    wakeup_in.recv(4096)
                except BlockingIOError:
                    pass
                reap(control)
                continue
            data, fds, _, _ = socket.recv_fds(control, MAX_REQUEST_BYTES, PASSED_FDS)
            if not data:
                return 0  # the backend closed the socket: it is going away, and so are we
            request = json.loads(data)
            if len(fds) != PASSED_FDS:
                for fd in fds:
                    os.close(fd)
                control.send(json.dumps({"id": request.get("id"), "error": "descriptors missing"}).encode())
                continue
            pid = os.fork()
            if pid == 0:
                selector.close()
                wakeup_out.close()
                return become_worker(control, wakeup_in, request, fds)
            for fd in fds:
                os.close(fd)
            control.send(json.dumps({"id": request["id"], "pid": pid}).encode())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="cortex-nb worker fork server (started by the backend)")
    parser.add_argument("--fd", type=int, required=True)
    args = parser.parse_args(argv)
    from .worker_process import die_with_parent

    die_with_parent()
    name_process("cortex-forksrv")
    control = socket.socket(fileno=args.fd)
    try:
        preload()
    except Exception as exc:  # the executor starts workers as processes instead
        control.send(json.dumps({"failed": f"{type(exc).__name__}: {exc}"}).encode())
        return 1
    return serve(control)


if __name__ == "__main__":
    sys.exit(main())
