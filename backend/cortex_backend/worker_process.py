"""The entry point of a worker process: started warm, then told what to be.

A warm worker imports torch, transformers and peft before it is asked, then takes one message: `init`
makes it the worker of one sub-job (worker.py), `host_adapters` an adapter host serving many training
sub-jobs as slots (adapter_host.py). The local executor runs `python -m cortex_backend.worker_process`;
a Ray actor calls `serve_channel` on its own thread.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import threading
import traceback

from . import worker_messages as messages
from .adapter_host import serve_adapter_host
from .ipc import BlockingChannel, ChannelClosed
from .library_noise import quiet_library_noise
from .worker import Channel, Worker


def die_with_parent() -> None:
    """A worker must not outlive a backend killed without cleanup (it would hold a GPU and compute for no
    one): ask Linux to SIGKILL it when its parent dies. Elsewhere the closed socket still ends it."""
    try:
        import ctypes
        import signal

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:  # the parent died before the request took effect
        os._exit(1)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="cortex-nb worker (started by the backend)")
    parser.add_argument("--fd", type=int, required=True)
    args = parser.parse_args(argv)
    die_with_parent()
    sock = socket.socket(fileno=args.fd)
    serve_channel(BlockingChannel(sock))


def serve_channel(channel: Channel) -> None:
    """Serve one sub-job over `channel`: the local executor's socket, or a Ray actor's queues."""
    channel.send(messages.encode(messages.Hello(os.getpid())))
    quiet_library_noise()
    # Import the heavy libraries before being asked, so an assignment starts fast.
    import peft  # noqa: F401
    import torch  # noqa: F401
    import transformers  # noqa: F401

    channel.send(messages.encode(messages.Warm()))
    try:
        header, _ = channel.receive()
    except (EOFError, OSError):
        return
    assignment = messages.decode(header)
    if isinstance(assignment, messages.HostAdapters):
        serve_adapter_host(channel, assignment)
        return
    if not isinstance(assignment, messages.Init):
        return
    worker = Worker(channel)
    try:
        channel.send(messages.encode(messages.Ready(worker.initialise(assignment))))
    except ChannelClosed:
        return
    except Exception as exc:
        traceback.print_exc()
        channel.send(
            messages.encode(messages.InitFailed("worker_start_failed", f"{type(exc).__name__}: {exc}"))
        )
        return
    threading.Thread(target=worker.read_loop, name="cortex-worker-reader", daemon=True).start()
    try:
        worker.serve()
    except ChannelClosed:
        # The service went away mid-operation: nobody is left to report to, and nothing to say.
        print("[engine] the backend closed the channel; stopping", flush=True)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
