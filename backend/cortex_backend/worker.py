"""The worker of one sub-job, serving its requests in submission order: a process's only job
(worker_process.py), or one slot of an adapter host (adapter_host.py).

Started warm (torch, transformers and peft already imported) and idle; an `init` message assigns it
a sub-job and a device. A reader thread takes messages off the socket so a `cancel` is seen while an
operation runs; the main thread runs operations one at a time, first in first out. A managed
training loop (`train_loop`) is one long operation that serves the requests queued meanwhile
between its steps, and reports its progress as `loop` messages.
"""

from __future__ import annotations

import dataclasses
import os
import queue
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from cortex_nb.protocol import wire

from . import sample_batching
from . import worker_messages as messages
from .faults import Faults
from .models import ModelInfo
from .operations import CATALOG, reads_merged_weights


class Channel(Protocol):
    """How a worker talks to the service: thread-safe sends, blocking receives (EOFError when closed)."""

    def send(self, header: dict[str, Any], blob: bytes = b"") -> None: ...

    def receive(self) -> tuple[dict[str, Any], bytes]: ...


class SharedBases(Protocol):
    """Base models built once and shared among an adapter host's slots (adapter_host.BaseModels)."""

    def share(self, info: ModelInfo) -> Any: ...


class Worker:
    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        self.requests: queue.Queue[tuple[messages.Request, bytes] | None] = queue.Queue()
        self.cancelled: set[str] = set()
        self.current: str | None = None
        self.state = None
        self.trainer = None
        self.sampler = None  # the sampling engine of a training or sampling sub-job
        # Queued compatible generates run in one engine pass (sample_batching.py).
        self.gatherer = sample_batching.GenerateGatherer()
        self.sub_job_type = ""
        self.forward_backward_calls = 0
        # checkpoints and weight sync
        self.sub_job_id = ""
        self.faults = Faults()
        self.mailbox = None
        self.sync_source = None
        self.saved_adapters = None
        # Each operation of the catalog is the method of its name.
        self.operations: dict[str, Callable[[dict[str, Any], bytes], tuple[dict[str, Any], bytes]]] = {
            name: getattr(self, name) for name in CATALOG
        }
        self._shutting_down = False
        # The backend is draining (drain.py): a managed loop stops after its step and saves a resumable
        # checkpoint for the next start to resume from.
        self._draining = False

    # set-up -------------------------------------------------------------------------------------
    def initialise(self, message: messages.Init, base_models: SharedBases | None = None) -> dict[str, Any]:
        """Load the sub-job's model (`base_models`, an adapter host's, shares one base among slots); return
        what users are shown about it."""
        os.environ.update(message.env or {})
        import torch

        if message.threads:
            torch.set_num_threads(int(message.threads))
        from .engine import sharding
        from .engine.adapter import signature
        from .engine.loading import pick_device
        from .engine.model_state import ModelState
        from .engine.saved_adapters import SavedAdapters
        from .engine.trainer import Trainer
        from .engine.weight_sync import SyncMailbox, SyncSource

        spec = message.spec
        info = ModelInfo.from_wire(message.model)
        self.sub_job_type = message.sub_job_type
        base = base_models.share(info) if base_models is not None else None
        if sharding.is_sharded():  # one rank of a sub-job across devices: join its group before loading
            sharding.start_process_group(pick_device())
        self.state = ModelState(info, spec, base=base)
        if sharding.is_sharded():  # before the optimizer is built: it holds the shards
            sharding.shard(self.state.model, self.state.device)
        if self.sub_job_type == "training":
            self.trainer = Trainer(
                self.state, spec.get("optimizer"), bool(spec.get("gradient_checkpointing"))
            )
        self.sub_job_id = message.sub_job_id
        self.faults = Faults(message.faults or (), self.sub_job_id, message.job_id)
        self.mailbox = SyncMailbox()
        self.saved_adapters = SavedAdapters()
        if self.trainer is not None:
            self.sync_source = SyncSource(self.state)
            self.trainer.nan_loss = self.faults.active("nan_loss")
        described = {**self.state.describe(), "pid": os.getpid()}
        described["adapter"] = signature(self.state.model, info.name)
        if self.trainer is not None:
            described["gradient_checkpointing"] = bool(spec.get("gradient_checkpointing"))
        if sharding.is_sharded():
            from .engine.memory import peak_memory

            # Each rank's own: the executor lists every rank's in the sub-job's `ranks`.
            described["sharding"] = {"strategy": "fsdp2", **sharding.describe()}
            described.update(peak_memory(self.state.device))
        if self.sub_job_type in ("training", "sampling"):
            self.sampler = self._open_sampler(message)
            described["sampler"] = self.sampler.describe()
        print(
            f"[engine] {message.sub_job_id} ready: {info.name} on {described['device']} ({described['dtype']}),"
            f" {described['trainable_parameters']:,} trainable of {described['total_parameters']:,} parameters"
            + (f", sampling with {self.sampler.name}" if self.sampler is not None else ""),
            flush=True,
        )
        return described

    def _open_sampler(self, message: messages.Init) -> Any:
        from .engine.sampling_engine import open_engine

        return open_engine(
            message.sampler or "transformers", self.state, self.sub_job_type, message.sampler_options
        )

    # operations -----------------------------------------------------------------------------------
    def noop(self, params: dict[str, Any], blob: bytes) -> tuple[dict[str, Any], bytes]:
        return {"ok": True}, b""

    def reset_prefix_cache(self, params: dict[str, Any], blob: bytes) -> tuple[dict[str, Any], bytes]:
        result = self.sampler.reset_prefix_cache()
        print(f"[engine] prefix cache reset ({result['engine']}): {result['detail']}", flush=True)
        return result, b""

    def forward_backward(self, params: dict[str, Any], blob: bytes) -> tuple[dict[str, Any], bytes]:
        from .engine.router_replay import REPLAY_TENSOR

        tensors, _ = wire.decode_frame(blob)
        replay = tensors.pop(REPLAY_TENSOR, None)
        result, out = self.trainer.forward_backward(
            tensors,
            params["loss_fn"],
            params["loss_fn_config"],
            replay,
            bool(params.get("record_routes")),
        )
        self.report_forward_backward(result)
        return result, wire.encode_frame(out)

    def report_forward_backward(self, result: dict[str, Any]) -> None:
        """Count a forward_backward done and say so in the sub-job's log."""
        self.forward_backward_calls += 1
        speed = result.get("tokens_per_second")
        print(
            f"[engine] forward_backward={self.forward_backward_calls} summed_loss={result['loss']:.4g}"
            f" tokens={result['metrics']['tokens:sum']} tokens/s={speed or 0:.0f}"
            f" peak_memory={result['peak_memory_bytes'] / 2**20:.0f}MiB",
            flush=True,
        )

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
        on_tokens = None
        if params.get("stream"):  # a streamed generate: each look's new tokens go out as `tokens` messages

            def on_tokens(samples: list[dict[str, Any]]) -> None:
                self.channel.send(messages.encode(messages.Tokens(request_id, samples)))

        with self.saved_adapters.applied(self.state, params.get("adapter")):
            result = self.sampler.generate(
                params["prompt_tokens"],
                params["sampling_params"],
                lambda: request_id in self.cancelled,
                on_tokens,
            )
            routes = b""
            if params["sampling_params"].get("record_routes"):
                routes = self._sample_routes(params["prompt_tokens"], result["samples"])
        return result, routes

    def _sample_routes(self, prompts: list[list[int]], samples: list[dict[str, Any]]) -> bytes:
        """The experts each sample's whole sequence routes to, as a frame the service keeps for replay
        (router_replays.py): `tokens.{i}` and `experts.{i}` (layers, tokens, top_k) per sample, in order."""
        import numpy as np

        from .engine.router_replay import sequence_routes

        sequences = [prompts[sample["prompt_index"]] + sample["tokens"] for sample in samples]
        with self.state.inference():
            experts = sequence_routes(self.state.model, sequences, self.state.device)
        frame: dict[str, Any] = {}
        for i, (sequence, routed) in enumerate(zip(sequences, experts, strict=True)):
            frame[f"tokens.{i}"] = np.asarray(sequence, dtype=np.int32)
            frame[f"experts.{i}"] = routed.astype(np.int32)
        return wire.encode_frame(frame)

    def forward(self, params: dict[str, Any], blob: bytes) -> tuple[dict[str, Any], bytes]:
        from .engine.router_replay import REPLAY_TENSOR
        from .engine.scoring import forward

        tensors, _ = wire.decode_frame(blob)
        replay = tensors.pop(REPLAY_TENSOR, None)
        with self.saved_adapters.applied(self.state, params.get("adapter")):
            result, out = forward(
                self.state,
                tensors,
                params.get("loss_fn"),
                params.get("loss_fn_config") or {},
                replay,
                bool(params.get("record_routes")),
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
            self.channel.send(messages.encode(messages.Sync(sync_id, to, kind, fields)), blob)

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
            self.channel.send(messages.encode(messages.Loop(loop_id, event)))

        def stop_requested() -> bool:
            return loop_id in self.cancelled or self._shutting_down or self._draining

        loop = TrainingLoop(
            self.state,
            self.trainer,
            params,
            blob,
            report,
            self._serve_waiting,
            stop_requested,
            self.faults,
            drain_requested=lambda: self._draining,
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
                try:
                    message = messages.decode(header)
                except messages.UnknownMessage:  # refused, loudly: the sender has a bug
                    traceback.print_exc()
                    continue
                if not self.take(header, message, blob):
                    break
        except (EOFError, OSError):
            pass
        self.requests.put(None)

    def take(self, header: dict[str, Any], message: messages.Message, blob: bytes) -> bool:
        """Act on a message from the service at once (requests queue); False when told to stop."""
        if isinstance(message, messages.Request):
            self.requests.put((message, blob))
        elif isinstance(message, messages.Cancel):
            self.cancelled.add(message.request_id)
            if self.mailbox is not None:  # a cancelled sync takes no more messages
                self.mailbox.close(message.request_id)
        elif isinstance(message, messages.Sync):
            if self.mailbox is not None:
                self.mailbox.put(header, blob)
        elif isinstance(message, messages.Drain):
            self._draining = True
        elif isinstance(message, messages.Shutdown):
            return False
        return True

    def send_message(self, message: messages.Message, blob: bytes = b"") -> None:
        self.channel.send(messages.encode(message), blob)

    def serve(self) -> None:
        while True:
            item = self.requests.get()
            if item is None:
                return
            self._serve_one(*item)

    def _serve_one(self, request: messages.Request, blob: bytes) -> None:
        from .engine.errors import OperationError

        request_id = request.request_id
        if request_id in self.cancelled:
            self.send_message(messages.Finished(request_id, "cancelled"))
            self.cancelled.discard(request_id)
            return
        if request.op == "generate":
            together = self.gatherer.take(self.requests, request, self.sampler, self.cancelled)
            if self._generates_together([request, *(queued for queued, _ in together)]):
                return
        self.current = request_id
        self.send_message(messages.Started(request_id, time.time()))
        try:
            operation = self.operations.get(request.op)
            if operation is None:
                raise OperationError("unsupported_operation", f"this worker does not serve {request.op!r}")
            self.faults.raise_in(request.op)
            if self.sampler is not None and reads_merged_weights(request.op):
                # Follow an adapter changed by the last operation (a sync or load) before scoring with the
                # sub-job's weights; generate refreshes by itself, and no other operation reads merged weights.
                self.sampler.refresh()
            result, out_blob = operation(request.params or {}, blob)
            self.send_message(messages.succeeded(request_id, result), out_blob)
        except Exception as exc:  # report, never die: one bad request must not end the sub-job
            self.send_message(failure_of(request_id, request.op, exc))
        finally:
            self.current = None
            self.cancelled.discard(request_id)

    def _generates_together(self, requests: list[messages.Request]) -> bool:
        """Serve `requests` (compatible generates) in one pass if there are several; False if not served."""
        if len(requests) < 2:
            return False
        self._serve_generates(requests)
        return True

    def _serve_generates(self, requests: list[messages.Request]) -> None:
        """Queued compatible generates in one engine pass, each answered as if it had run alone
        (sample_batching.py). A request cancelled meanwhile is answered as cancelled; the pass stops only
        when all are."""
        request_ids = [request.request_id for request in requests]
        started = time.time()
        for request_id in request_ids:
            self.send_message(messages.Started(request_id, started))
        self.current = request_ids[0]
        print(f"[engine] generate: {len(requests)} queued requests sampled in one pass", flush=True)
        try:
            with self.saved_adapters.applied(self.state, requests[0].params.get("adapter")):
                results = sample_batching.generate_together(
                    self.sampler, requests, lambda: all(rid in self.cancelled for rid in request_ids)
                )
            for request_id, result in zip(request_ids, results, strict=True):
                if request_id in self.cancelled:
                    self.send_message(messages.failed(request_id, "cancelled", "the request was cancelled"))
                else:
                    self.send_message(messages.succeeded(request_id, result))
        except Exception as exc:  # report, never die: one bad pass must not end the sub-job
            failure = failure_of(request_ids[0], "generate", exc)
            for request_id in request_ids:
                self.send_message(dataclasses.replace(failure, request_id=request_id))
        finally:
            self.current = None
            for request_id in request_ids:
                self.cancelled.discard(request_id)


def failure_of(request_id: str, op: str, exc: Exception) -> messages.Finished:
    """How a request that raised ends: an engine's OperationError as it says, anything else (a bug, or
    memory) with its type and message, its traceback in the sub-job's log."""
    from .engine.errors import OperationError

    if isinstance(exc, OperationError):
        return messages.failed(request_id, exc.code, exc.message)
    traceback.print_exc()
    code = "out_of_memory" if "out of memory" in str(exc).lower() else "operation_failed"
    return messages.failed(request_id, code, f"{op} failed: {type(exc).__name__}: {exc}")
