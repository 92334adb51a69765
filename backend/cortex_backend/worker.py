"""The worker process: one per sub-job, serving its requests in submission order.

Started warm (torch, transformers and peft already imported) and idle; an `init` message assigns it
a sub-job and a device. A reader thread takes messages off the socket so a `cancel` is seen while an
operation runs; the main thread runs operations one at a time, first in first out.
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
from typing import Any

from cortex_nb import wire

from .ipc import BlockingChannel
from .models import ModelInfo


class Worker:
    def __init__(self, channel: BlockingChannel) -> None:
        self.channel = channel
        self.requests: queue.Queue[tuple[dict[str, Any], bytes] | None] = queue.Queue()
        self.cancelled: set[str] = set()
        self.current: str | None = None
        self.state = None
        self.trainer = None
        self.sub_job_type = ""
        self.forward_backward_calls = 0
        self.operations: dict[str, Callable[[dict[str, Any], bytes], tuple[dict[str, Any], bytes]]] = {
            "noop": self.noop,
            "forward_backward": self.forward_backward,
            "step": self.step,
            "generate": self.generate,
            "forward": self.forward,
        }

    # set-up -------------------------------------------------------------------------------------
    def initialise(self, message: dict[str, Any]) -> None:
        os.environ.update(message.get("env") or {})
        import torch

        threads = message.get("threads")
        if threads:
            torch.set_num_threads(int(threads))
        from .engine.model_state import ModelState
        from .engine.trainer import Trainer

        spec = message["spec"]
        info = ModelInfo.from_wire(message["model"])
        self.sub_job_type = message["sub_job_type"]
        self.state = ModelState(info, spec)
        if self.sub_job_type == "training":
            self.trainer = Trainer(self.state, spec.get("optimizer"))
        described = {**self.state.describe(), "pid": os.getpid()}
        print(
            f"[engine] {message['sub_job_id']} ready: {info.name} on {described['device']} ({described['dtype']}),"
            f" {described['trainable_parameters']:,} trainable of {described['total_parameters']:,} parameters",
            flush=True,
        )
        self.channel.send({"type": "ready", "info": described})

    # operations -----------------------------------------------------------------------------------
    def noop(self, params: dict[str, Any], blob: bytes) -> tuple[dict[str, Any], bytes]:
        return {"ok": True}, b""

    def forward_backward(self, params: dict[str, Any], blob: bytes) -> tuple[dict[str, Any], bytes]:
        tensors, metadata = wire.decode_frame(blob)
        result, out = self.trainer.forward_backward(tensors, metadata["loss_fn"], metadata.get("loss_fn_config") or {})
        self.forward_backward_calls += 1
        speed = result.get("tokens_per_second")
        print(
            f"[engine] forward_backward={self.forward_backward_calls} loss={result['loss']:.4g}"
            f" tokens={result['metrics']['tokens:sum']} tokens/s={speed or 0:.0f}"
            f" peak_memory={result['peak_memory_bytes'] / 2**20:.0f}MiB",
            flush=True,
        )
        return result, wire.encode_frame(out)

    def step(self, params: dict[str, Any], blob: bytes) -> tuple[dict[str, Any], bytes]:
        result = self.trainer.step(params.get("learning_rate"))
        print(
            f"[engine] step={result['step']} grad_norm={result['grad_norm']:.4g} lr={result['learning_rate']:.3g}"
            f" tokens={result['tokens']} peak_memory={result['peak_memory_bytes'] / 2**20:.0f}MiB",
            flush=True,
        )
        return result, b""

    def generate(self, params: dict[str, Any], blob: bytes) -> tuple[dict[str, Any], bytes]:
        from .engine.sampler import generate

        request_id = self.current
        result = generate(self.state, params["prompt_tokens"], params["sampling_params"], lambda: request_id in self.cancelled)
        return result, b""

    def forward(self, params: dict[str, Any], blob: bytes) -> tuple[dict[str, Any], bytes]:
        from .engine.scoring import forward

        tensors, _ = wire.decode_frame(blob)
        result, out = forward(self.state, tensors)
        return result, wire.encode_frame(out)

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
                elif kind == "shutdown":
                    break
        except (EOFError, OSError):
            pass
        self.requests.put(None)

    def serve(self) -> None:
        from .engine.errors import OperationError

        while True:
            item = self.requests.get()
            if item is None:
                return
            header, blob = item
            request_id = header["request_id"]
            if request_id in self.cancelled:
                self.channel.send({"type": "finished", "request_id": request_id, "status": "cancelled"})
                continue
            self.current = request_id
            self.channel.send({"type": "started", "request_id": request_id, "at": time.time()})
            try:
                operation = self.operations.get(header["op"])
                if operation is None:
                    raise OperationError("unsupported_operation", f"this worker does not serve {header['op']!r}")
                result, out_blob = operation(header.get("params") or {}, blob)
                self.channel.send({"type": "finished", "request_id": request_id, "status": "succeeded", "result": result}, out_blob)
            except OperationError as exc:
                status = "cancelled" if exc.code == "cancelled" else "failed"
                self.channel.send({"type": "finished", "request_id": request_id, "status": status, "code": exc.code, "message": exc.message})
            except Exception as exc:  # report, never die: one bad request must not end the sub-job
                code = "out_of_memory" if "out of memory" in str(exc).lower() else "operation_failed"
                traceback.print_exc()
                self.channel.send({"type": "finished", "request_id": request_id, "status": "failed", "code": code,
                                   "message": f"{header['op']} failed: {type(exc).__name__}: {exc}"})
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
    channel = BlockingChannel(sock)
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
        channel.send({"type": "init_failed", "code": "worker_start_failed", "message": f"{type(exc).__name__}: {exc}"})
        return
    threading.Thread(target=worker.read_loop, name="cortex-worker-reader", daemon=True).start()
    worker.serve()
    sys.stdout.flush()


if __name__ == "__main__":
    main()
