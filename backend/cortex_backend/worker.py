"""The worker process: one per sub-job, serving its requests in submission order.

Started warm (torch, transformers and peft already imported) and idle; an `init` message assigns it
a sub-job and a device. A reader thread takes messages off the socket so a `cancel` is seen while an
operation runs; the main thread runs operations one at a time, first in first out. A managed
training loop (`train_loop`) is one long operation that serves the requests queued meanwhile
between its steps, and reports its progress as `loop` messages.
"""

from __future__ import annotations

import argparse
import os
import queue
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from cortex_nb.protocol import wire

from .faults import Faults
from .ipc import BlockingChannel
from .models import ModelInfo


class Channel(Protocol):
    """How a worker talks to the service: thread-safe sends, blocking receives (EOFError when closed)."""

    def send(self, header: dict[str, Any], blob: bytes = b"") -> None: ...

    def receive(self) -> tuple[dict[str, Any], bytes]: ...


class Worker:
    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        self.requests: queue.Queue[tuple[dict[str, Any], bytes] | None] = queue.Queue()
        self.cancelled: set[str] = set()
        self.current: str | None = None
        self.state = None
        self.trainer = None
        self.sampler = None  # the sampling engine of a training or sampling sub-job
        self.sub_job_type = ""
        self.forward_backward_calls = 0
        # checkpoints and weight sync
        self.sub_job_id = ""
        self.faults = Faults()
        self.mailbox = None
        self.sync_source = None
        self.saved_adapters = None
        self.operations: dict[str, Callable[[dict[str, Any], bytes], tuple[dict[str, Any], bytes]]] = {
            "noop": self.noop,
            "forward_backward": self.forward_backward,
            "step": self.step,
            "generate": self.generate,
            "forward": self.forward,
            "save": self.save,
            "load": self.load,
            "weight_sync": self.weight_sync,
            "weight_sync_apply": self.weight_sync_apply,
            "train_loop": self.train_loop,
        }
        self._shutting_down = False

    # set-up -------------------------------------------------------------------------------------
    def initialise(self, message: dict[str, Any]) -> None:
        os.environ.update(message.get("env") or {})
        import torch

        threads = message.get("threads")
        if threads:
            torch.set_num_threads(int(threads))
        from .engine.adapter import signature
        from .engine.model_state import ModelState
        from .engine.saved_adapters import SavedAdapters
        from .engine.trainer import Trainer
        from .engine.weight_sync import SyncMailbox, SyncSource

        spec = message["spec"]
        info = ModelInfo.from_wire(message["model"])
        self.sub_job_type = message["sub_job_type"]
        self.state = ModelState(info, spec)
        if self.sub_job_type == "training":
            self.trainer = Trainer(self.state, spec.get("optimizer"))
        self.sub_job_id = message["sub_job_id"]
        self.faults = Faults(message.get("faults") or (), self.sub_job_id)
        self.mailbox = SyncMailbox()
        self.saved_adapters = SavedAdapters()
        if self.trainer is not None:
            self.sync_source = SyncSource(self.state)
        described = {**self.state.describe(), "pid": os.getpid()}
        described["adapter"] = signature(self.state.model, info.name)
        if self.sub_job_type in ("training", "sampling"):
            from .engine.sampling_engine import open_engine

            self.sampler = open_engine(
                message.get("sampler") or "transformers",
                self.state,
                self.sub_job_type,
                message.get("sampler_options"),
            )
            described["sampler"] = self.sampler.describe()
        print(
            f"[engine] {message['sub_job_id']} ready: {info.name} on {described['device']} ({described['dtype']}),"
            f" {described['trainable_parameters']:,} trainable of {described['total_parameters']:,} parameters"
            + (f", sampling with {self.sampler.name}" if self.sampler is not None else ""),
            flush=True,
        )
        self.channel.send({"type": "ready", "info": described})

    # operations -----------------------------------------------------------------------------------
    def noop(self, params: dict[str, Any], blob: bytes) -> tuple[dict[str, Any], bytes]:
        return {"ok": True}, b""

    def forward_backward(self, params: dict[str, Any], blob: bytes) -> tuple[dict[str, Any], bytes]:
        tensors, _ = wire.decode_frame(blob)
        result, out = self.trainer.forward_backward(tensors, params["loss_fn"], params["loss_fn_config"])
        self.forward_backward_calls += 1
        speed = result.get("tokens_per_second")
        print(
            f"[engine] forward_backward={self.forward_backward_calls} summed_loss={result['loss']:.4g}"
            f" tokens={result['metrics']['tokens:sum']} tokens/s={speed or 0:.0f}"
            f" peak_memory={result['peak_memory_bytes'] / 2**20:.0f}MiB",
            flush=True,
        )
        return result, wire.encode_frame(out)

    def step(self, params: dict[str, Any], blob: bytes) -> tuple[dict[str, Any], bytes]:
        result = self.trainer.step(
            params.get("learning_rate"),
            betas=params.get("betas"),
            eps=params.get("eps"),
            weight_decay=params.get("weight_decay"),
            grad_clip=params.get("grad_clip"),
        )
        print(
            f"[engine] step={result['step']} grad_norm={result['grad_norm']:.4g} lr={result['learning_rate']:.3g}"
            f" tokens={result['tokens']} peak_memory={result['peak_memory_bytes'] / 2**20:.0f}MiB",
            flush=True,
        )
        return result, b""

    def generate(self, params: dict[str, Any], blob: bytes) -> tuple[dict[str, Any], bytes]:
        request_id = self.current
        with self.saved_adapters.applied(self.state, params.get("adapter")):
            result = self.sampler.generate(
                params["prompt_tokens"], params["sampling_params"], lambda: request_id in self.cancelled
            )
        return result, b""

    def forward(self, params: dict[str, Any], blob: bytes) -> tuple[dict[str, Any], bytes]:
        from .engine.scoring import forward

        tensors, _ = wire.decode_frame(blob)
        with self.saved_adapters.applied(self.state, params.get("adapter")):
            result, out = forward(
                self.state, tensors, params.get("loss_fn"), params.get("loss_fn_config") or {}
            )
        return result, wire.encode_frame(out)

    # checkpoints and weight sync -------------------------------------------------------------------
    def save(self, params: dict[str, Any], blob: bytes) -> tuple[dict[str, Any], bytes]:
        from .engine.checkpoint import write_checkpoint

        manifest = write_checkpoint(
            self.state, self.trainer, Path(params["directory"]), params["type"], self.faults
        )
        print(f"[engine] saved a {params['type']} checkpoint at step {manifest['step']}", flush=True)
        return {"manifest": manifest}, b""

    def load(self, params: dict[str, Any], blob: bytes) -> tuple[dict[str, Any], bytes]:
        from .engine.checkpoint import load_checkpoint

        result = load_checkpoint(
            self.state,
            self.trainer,
            Path(params["directory"]),
            params["manifest"],
            bool(params.get("restore_optimizer", True)),
        )
        print(
            f"[engine] loaded checkpoint {params['checkpoint_id']} from {params['source_job_id']} (step {result['step']})",
            flush=True,
        )
        return {
            **result,
            "checkpoint_id": params["checkpoint_id"],
            "source_job_id": params["source_job_id"],
        }, b""

    def _sync_sender(self, sync_id: str) -> Callable[[str, str, dict[str, Any], bytes], None]:
        def send(to: str, kind: str, fields: dict[str, Any], blob: bytes) -> None:
            self.channel.send({**fields, "type": "sync", "request_id": sync_id, "to": to, "kind": kind}, blob)

        return send

    def weight_sync(self, params: dict[str, Any], blob: bytes) -> tuple[dict[str, Any], bytes]:
        """The trainer's side of a sync (the service queued each target's side as `weight_sync_apply`)."""
        from .engine.errors import OperationError

        if self.sync_source is None:
            raise OperationError("unsupported_operation", "only a training sub-job is a weight-sync source")
        sync_id = self.current
        try:
            result = self.sync_source.run(
                sync_id,
                list(params["targets"]),
                params["format"],
                self.trainer.step_count,
                self.mailbox,
                self._sync_sender(sync_id),
                lambda: sync_id in self.cancelled,
            )
        finally:
            self.mailbox.close(sync_id)
        print(
            f"[engine] weight_sync step={result['weight_version']} path={result['path']} bytes={result['bytes']}"
            f" ms={result['ms']:.1f}",
            flush=True,
        )
        return result, b""

    def weight_sync_apply(self, params: dict[str, Any], blob: bytes) -> tuple[dict[str, Any], bytes]:
        from .engine.weight_sync import run_target

        barrier_id = self.current
        result = run_target(
            self.state,
            params["sync_id"],
            params["source"],
            self.mailbox,
            self._sync_sender(params["sync_id"]),
            lambda: barrier_id in self.cancelled,
            self.faults,
        )
        if (
            self.sampler is not None
        ):  # the engine takes the new weights now, so the next generate needs nothing more
            started = time.perf_counter()
            self.sampler.refresh()
            result["sampler"] = self.sampler.name
            result["sampler_refresh_ms"] = (time.perf_counter() - started) * 1000
        return result, b""

    # managed training ---------------------------------------------------------------------------------
    def train_loop(self, params: dict[str, Any], blob: bytes) -> tuple[dict[str, Any], bytes]:
        from .engine.errors import OperationError
        from .engine.training_loop import TrainingLoop

        if self.trainer is None:
            raise OperationError("unsupported_operation", "only a training sub-job runs a training loop")
        loop_id = self.current

        def report(event: dict[str, Any]) -> None:
            self.channel.send({**event, "type": "loop", "request_id": loop_id})

        def stop_requested() -> bool:
            return loop_id in self.cancelled or self._shutting_down

        loop = TrainingLoop(
            self.state, self.trainer, params, blob, report, self._serve_waiting, stop_requested, self.faults
        )
        return loop.run(), b""

    def _serve_waiting(self) -> None:
        """Serve the requests queued behind a running loop, without waiting for more."""
        loop_id = self.current
        while True:
            try:
                item = self.requests.get_nowait()
            except queue.Empty:
                break
            if item is None:  # the channel closed: let the loop end, then stop
                self._shutting_down = True
                self.requests.put(None)
                break
            self._serve_one(*item)
        self.current = loop_id

    # loop -----------------------------------------------------------------------------------------
    def read_loop(self) -> None:
        """Runs on its own thread: cancels take effect at once, requests queue in order."""
        try:
            while True:
                header, blob = self.channel.receive()
                kind = header.get("type")
                if kind == "request":
                    self.requests.put((header, blob))
                elif kind == "cancel":
                    self.cancelled.add(header["request_id"])
                    if self.mailbox is not None:  # a cancelled sync takes no more messages
                        self.mailbox.close(header["request_id"])
                elif kind == "sync" and self.mailbox is not None:
                    self.mailbox.put(header, blob)
                elif kind == "shutdown":
                    break
        except (EOFError, OSError):
            pass
        self.requests.put(None)

    def serve(self) -> None:
        while True:
            item = self.requests.get()
            if item is None:
                return
            self._serve_one(*item)

    def _serve_one(self, header: dict[str, Any], blob: bytes) -> None:
        from .engine.errors import OperationError

        request_id = header["request_id"]
        if request_id in self.cancelled:
            self.channel.send({"type": "finished", "request_id": request_id, "status": "cancelled"})
            self.cancelled.discard(request_id)
            return
        self.current = request_id
        self.channel.send({"type": "started", "request_id": request_id, "at": time.time()})
        try:
            operation = self.operations.get(header["op"])
            if operation is None:
                raise OperationError("unsupported_operation", f"this worker does not serve {header['op']!r}")
            self.faults.raise_in(header["op"])
            if self.sampler is not None and header["op"] == "forward":
                # Follow an adapter changed by the last operation (a sync or load) before scoring with the
                # sub-job's weights; generate refreshes by itself, and no other operation reads merged weights.
                self.sampler.refresh()
            result, out_blob = operation(header.get("params") or {}, blob)
            self.channel.send(
                {"type": "finished", "request_id": request_id, "status": "succeeded", "result": result},
                out_blob,
            )
        except OperationError as exc:
            status = "cancelled" if exc.code == "cancelled" else "failed"
            self.channel.send(
                {
                    "type": "finished",
                    "request_id": request_id,
                    "status": status,
                    "code": exc.code,
                    "message": exc.message,
                }
            )
        except Exception as exc:  # report, never die: one bad request must not end the sub-job
            code = "out_of_memory" if "out of memory" in str(exc).lower() else "operation_failed"
            traceback.print_exc()
            self.channel.send(
                {
                    "type": "finished",
                    "request_id": request_id,
                    "status": "failed",
                    "code": code,
                    "message": f"{header['op']} failed: {type(exc).__name__}: {exc}",
                }
            )
        finally:
            self.current = None
            self.cancelled.discard(request_id)


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
    channel.send({"type": "hello", "pid": os.getpid()})
    # Import the heavy libraries before being asked, so an assignment starts fast.
    import peft  # noqa: F401
    import torch  # noqa: F401
    import transformers  # noqa: F401

    channel.send({"type": "warm"})
    worker = Worker(channel)
    try:
        header, _ = channel.receive()
    except (EOFError, OSError):
        return
    if header.get("type") != "init":
        return
    try:
        worker.initialise(header)
    except Exception as exc:
        traceback.print_exc()
        channel.send(
            {"type": "init_failed", "code": "worker_start_failed", "message": f"{type(exc).__name__}: {exc}"}
        )
        return
    threading.Thread(target=worker.read_loop, name="cortex-worker-reader", daemon=True).start()
    worker.serve()
    sys.stdout.flush()


if __name__ == "__main__":
    main()
