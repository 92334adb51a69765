"""The Ray actor that serves one sub-job: the local executor's worker code (worker.py), fed through queues.

The head calls `send` for everything the local executor writes to a worker's socket (the init message,
requests, cancels, weight-sync messages) and keeps one `next_messages` call waiting for everything the
worker writes back (ready, started, finished, sync, log lines). The actor runs several calls at once so
a waiting `next_messages` never blocks a `send`; Ray may then run two `send`s out of order, so each
carries a sequence number and the inbox hands them to the worker in order.
"""

from __future__ import annotations

import os
import queue
import socket
import threading
import time
import traceback
import warnings
from collections import deque
from typing import Any

from ... import worker_messages as messages
from ..environment import WORKER_ENV, WORKER_ENV_DEFAULTS
from ..rank_groups import free_port
from .checkpoint_transfer import CheckpointStaging
from .output_capture import OutputCapture

MAX_BATCH_MESSAGES = 512
MAX_BATCH_BYTES = 256 * 2**20
# Threads for the actor's calls: the waiting next_messages, sends, and a close.
ACTOR_CONCURRENCY = 4


class OrderedInbox:
    """Messages from the head in the order the head sent them, whatever order their calls ran in."""

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._next = 0
        self._held: dict[int, Any] = {}
        self._ready: deque[Any] = deque()
        self._closed = False

    def put(self, sequence: int, item: Any) -> None:
        with self._condition:
            self._held[sequence] = item
            while self._next in self._held:
                self._ready.append(self._held.pop(self._next))
                self._next += 1
            self._condition.notify_all()

    def get(self) -> Any:
        with self._condition:
            while not self._ready:
                if self._closed:
                    raise EOFError("the head closed the sub-job")
                self._condition.wait()
            return self._ready.popleft()

    def close(self) -> None:
        with self._condition:
            self._closed = True
            self._condition.notify_all()


class ActorChannel:
    """The worker's channel inside an actor: sends go to the outbox, receives come from the inbox.
    Checkpoint directories are swapped for staging directories on the way in and out; a weight-sync
    payload is put in Ray's object store, so it moves from this host straight to the target's."""

    def __init__(self, inbox: OrderedInbox, outbox: queue.Queue, staging: CheckpointStaging) -> None:
        self.inbox = inbox
        self.outbox = outbox
        self.staging = staging

    def send(self, header: dict[str, Any], blob: bytes = b"") -> None:
        header = self.staging.outbound(header)
        if header.get("type") == "sync" and blob:
            import ray

            header = {**header, "blob_bytes": len(blob)}
            blob = ray.put(blob)
        self.outbox.put((header, blob))

    def receive(self) -> tuple[dict[str, Any], bytes]:
        header, blob, files = self.inbox.get()
        return self.staging.inbound(header, files), blob


class SubJobActor:
    def __init__(self) -> None:
        for key, value in WORKER_ENV.items():
            os.environ[key] = value
        for key, value in WORKER_ENV_DEFAULTS.items():
            os.environ.setdefault(key, value)
        # This process started before PYTHONWARNINGS was set: apply its filter here.
        warnings.filterwarnings("ignore", category=FutureWarning)
        self.outbox: queue.Queue = queue.Queue()
        self.inbox = OrderedInbox()
        self.staging = CheckpointStaging()
        self.capture = OutputCapture(
            lambda stream, lines: self.outbox.put((messages.encode(messages.Log(stream, lines)), b""))
        )
        self.capture.start()
        channel = ActorChannel(self.inbox, self.outbox, self.staging)
        self.thread = threading.Thread(target=self._serve, args=(channel,), name="cortex-worker", daemon=True)
        self.thread.start()

    def _serve(self, channel: ActorChannel) -> None:
        from ...worker_process import serve_channel

        reason = "it stopped"
        try:
            serve_channel(channel)
        except BaseException as exc:  # a bug in the worker loop: say so, as a crashed process would
            traceback.print_exc()
            reason = f"{type(exc).__name__}: {exc}"
        channel.outbox.put((messages.encode(messages.WorkerExited(reason)), b""))

    def placement(self) -> dict[str, Any]:
        """Where Ray placed this actor (node, process, the GPUs it reserved)."""
        import ray

        context = ray.get_runtime_context()
        return {
            "node_id": context.get_node_id(),
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            "gpu_ids": [str(gpu) for gpu in ray.get_gpu_ids()],
        }

    def rendezvous(self) -> tuple[str, int]:
        """This node's address as Ray knows it and a port free on it: where rank 0 of a rank group listens."""
        import ray

        address = ray.util.get_node_ip_address()
        return address, free_port(address)

    def send(
        self, sequence: int, header: dict[str, Any], blob: bytes = b"", files: dict[str, bytes] | None = None
    ) -> None:
        self.inbox.put(sequence, (header, blob, files))

    def next_messages(self, wait_s: float) -> list[tuple[dict[str, Any], Any]]:
        """What the worker sent since the last call; waits up to `wait_s` for the first message."""
        try:
            first = self.outbox.get(timeout=wait_s)
        except queue.Empty:
            return []
        batch, size = [first], len(first[1]) if isinstance(first[1], bytes) else 0
        while len(batch) < MAX_BATCH_MESSAGES and size < MAX_BATCH_BYTES:
            try:
                item = self.outbox.get_nowait()
            except queue.Empty:
                break
            batch.append(item)
            size += len(item[1]) if isinstance(item[1], bytes) else 0
        return batch

    def close(self, wait_s: float) -> None:
        """Let the worker finish (it was sent `shutdown`), then remove this host's staging directories."""
        self.inbox.close()
        deadline = time.monotonic() + wait_s
        self.thread.join(max(0.0, deadline - time.monotonic()))
        self.staging.remove()
