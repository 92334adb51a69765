"""The adapter host: one worker process per (device, base model) serving many sub-jobs as slots.

The base model is built once; each slot gets its own module tree whose base parameters and buffers are
the very tensors of that one base (so the weights are held once), wrapped in its own peft LoRA adapter
(its own rank, alpha, targets), its own optimizer, its own RNG state and weight version. A slot is the
ordinary worker (worker.py) of its sub-job, on its own thread; the host only routes messages to it by
the header's `slot`, gives the compute to one slot at a time, and tags each slot's log lines.

Why separate module trees over shared tensors rather than peft's several adapters on one model: a slot's
forward then runs exactly the code of a job alone (no active-adapter switching to get wrong, no other
adapter's parameters in its graph), so its numerics equal the job alone bitwise, and a slot's checkpoint,
weight sync and sampler code are the single-job code unchanged.

Sampling and log-probability sub-jobs are slots too. No slot may write to the shared base: the base's
tensors are marked (engine/shared_base.py), so a hosted sampler runs its LoRA unmerged (as a trainer's
does) instead of merging it into the base weights, and anything that would merge refuses. A weight sync
into a hosted sampler writes its adapter tensors only.

Fairness: slots take turns in the order they asked (a FIFO ticket lock), one operation per turn; a
managed training loop hands its turn on after each step. Either side of a weight sync waits for the other
(which may be a slot of the same host) without holding the turn. Whichever slot holds the turn has its own RNG
state swapped into torch (LoRA dropout draws from the process RNG), so a neighbour's draws never shift it.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import functools
import itertools
import os
import random
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from typing import Any, TextIO

from . import worker_messages as messages
from .host_budget import Refusal, admit_slot, check_slot
from .ipc import ChannelClosed
from .models import ModelInfo
from .operations import waits_on_peers
from .slot_batching import Entry, SlotBatches, batched_operations, sample_across_slots, train_across_slots
from .slot_logs import tag_line
from .worker import Channel, Worker


class BaseModels:
    """The base models this host has built, each once, and module trees that share their weights."""

    def __init__(self) -> None:
        self._bases: dict[str, Any] = {}
        self._lock = threading.Lock()

    def share(self, info: ModelInfo) -> Any:
        """A module tree of `info`'s base whose parameters and buffers are the host's single copy."""
        with self._lock:
            base = self._bases.get(info.name)
            if base is None:
                from .engine.loading import load_base_model, pick_device, pick_dtype
                from .engine.shared_base import mark_shared

                device = pick_device()
                base = self._bases[info.name] = load_base_model(info, device, pick_dtype(device))
                mark_shared(base)  # no slot may write to it: its sampler runs the adapter unmerged
        shared = {id(tensor): tensor for tensor in itertools.chain(base.parameters(), base.buffers())}
        return copy.deepcopy(base, memo=shared)

    def base_bytes(self) -> int:
        with self._lock:
            return sum(
                tensor.numel() * tensor.element_size()
                for base in self._bases.values()
                for tensor in itertools.chain(base.parameters(), base.buffers())
            )


class Turns:
    """Who computes now: slots wait in the order they asked (a FIFO ticket lock), one holder at a time."""

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._waiting: collections.deque[object] = collections.deque()
        self._holder: object | None = None

    def acquire(self, who: object, until: Callable[[], bool] | None = None) -> bool:
        """Wait for the turn and take it; with `until`, stop waiting (False) once it says so (a slot whose
        generate another slot took into its pass, slot_batching.py). Whoever ends a turn notifies."""
        with self._condition:
            self._waiting.append(who)
            while True:
                if until is not None and until():
                    self._waiting.remove(who)
                    self._condition.notify_all()
                    return False
                if self._holder is None and self._waiting[0] is who:
                    break
                self._condition.wait()
            self._waiting.popleft()
            self._holder = who
            return True

    def release(self) -> None:
        with self._condition:
            self._holder = None
            self._condition.notify_all()

    def others_waiting(self) -> bool:
        with self._condition:
            return bool(self._waiting)


class RandomState:
    """One slot's random number generators (torch's, and Python's and numpy's global ones)."""

    def __init__(self) -> None:
        self._saved: tuple[Any, ...] | None = None

    def swap_in(self) -> None:
        if self._saved is None:
            return
        import numpy as np
        import torch

        cpu, cuda, python, numpy_state = self._saved
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)
        random.setstate(python)
        np.random.set_state(numpy_state)

    def save(self) -> None:
        import numpy as np
        import torch

        cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
        self._saved = (torch.get_rng_state(), cuda, random.getstate(), np.random.get_state())


class SlotChannel:
    """A slot's end of the host's channel: what the slot sends is addressed from it."""

    def __init__(self, channel: Channel, slot: str) -> None:
        self._channel = channel
        self.slot = slot

    def send(self, header: dict[str, Any], blob: bytes = b"") -> None:
        self._channel.send({**header, messages.SLOT_KEY: self.slot}, blob)

    def receive(self) -> tuple[dict[str, Any], bytes]:
        raise RuntimeError("a slot receives through its host")


class SlotWorker(Worker):
    """One sub-job of an adapter host: the ordinary worker, computing only while it holds the host's turn."""

    def __init__(self, host: AdapterHost, channel: SlotChannel) -> None:
        super().__init__(channel)
        self.host = host
        self.slot = channel.slot
        self.random_state = RandomState()
        self.holding_turn = False  # read and written only by this slot's own thread

    @functools.cached_property
    def groupable(self) -> bool:
        """Whether this slot's adapter can share a decoding pass with other slots' (grouped_lora.py)."""
        from .engine.grouped_lora import groupable

        return groupable(self.state.model.get_base_model())

    @functools.cached_property
    def trains_together(self) -> bool:
        """Whether this slot's forward_backward can share a pass with other slots' (grouped_training.py)."""
        from .engine.grouped_training import trains_together

        return self.trainer is not None and trains_together(self.trainer)

    @contextlib.contextmanager
    def turn(self) -> Iterator[None]:
        self.host.turns.acquire(self)
        with self._holding():
            yield

    @contextlib.contextmanager
    def _holding(self) -> Iterator[None]:
        """This slot has just taken the turn: compute with its RNG, then give the turn back (unless the body
        already did: a hosted vLLM sampler whose outputs another slot's engine steps handed it)."""
        try:
            self._took_turn()
            yield
        finally:
            if self.holding_turn:
                self._give_turn()

    def _took_turn(self) -> None:
        self.holding_turn = True
        self.random_state.swap_in()

    def _give_turn(self) -> None:
        self.random_state.save()
        self.holding_turn = False
        self.host.turns.release()

    @contextlib.contextmanager
    def turn_handed_on(self) -> Iterator[None]:
        """The body runs without the turn (given back if this slot held it, taken again afterwards)."""
        if not self.holding_turn:
            yield
            return
        self._give_turn()
        try:
            yield
        finally:
            self.take_turn()

    def others_waiting(self) -> bool:
        return self.host.turns.others_waiting()

    def yield_turn(self, until: Callable[[], bool]) -> bool:
        """Give the turn back if held, then take it again unless `until` says first (a hosted vLLM sampler
        waiting for another slot's engine step to hand it outputs, engine/hosted_vllm.py)."""
        if self.holding_turn:
            self._give_turn()
        if not self.host.turns.acquire(self, until):
            return False
        self._took_turn()
        return True

    def take_turn(self) -> None:
        """Hold the turn, waiting for it if another slot holds it."""
        if not self.holding_turn:
            self.host.turns.acquire(self)
            self._took_turn()

    def _open_sampler(self, message: messages.Init) -> Any:
        """A vLLM sampling slot samples on its host's shared vLLM engine (engine/hosted_vllm.py)."""
        if message.sampler == "vllm" and self.sub_job_type == "sampling":
            from .engine.hosted_vllm import open_hosted_sampler

            return open_hosted_sampler(self.state, message.sampler_options, self.host.vllm_engines, self)
        return super()._open_sampler(message)

    def _serve_one(self, request: messages.Request, blob: bytes) -> None:
        """A request computes holding the host's turn. One that waits on another sub-job (either side of a
        weight sync) runs without it: the other side may be a slot of this host, waiting for the turn."""
        if waits_on_peers(request.op):
            with self.turn_handed_on():
                super()._serve_one(request, blob)
        elif self.holding_turn:  # served between a managed loop's steps, in the loop's turn
            super()._serve_one(request, blob)
        else:
            offer = self.host.batches.offer(self, request, blob)
            if offer is None:
                with self.turn():
                    self._serve_in_turn(request, blob)
            elif not self.host.turns.acquire(self, until=lambda: offer.taken):
                offer.done.wait()  # another slot took it into its pass and answered it
            else:
                with self._holding():
                    if self.host.batches.withdraw(offer):
                        self._serve_in_turn(request, blob)

    def _serve_in_turn(self, request: messages.Request, blob: bytes) -> None:
        """A request served holding the turn: a forward_backward with those other slots offered meanwhile
        in one pass (slot_batching.py), anything else as the worker serves it."""
        if request.op == "forward_backward" and self._with_offers(
            [(self, request, blob)], train_across_slots
        ):
            return
        super()._serve_one(request, blob)

    def _generates_together(self, requests: list[messages.Request]) -> bool:
        """This slot's generates, and those other slots offered meanwhile, in one pass (slot_batching.py)."""
        entries = [(self, request, b"") for request in requests]
        return self._with_offers(entries, sample_across_slots) or super()._generates_together(requests)

    def _with_offers(self, entries: list[Entry], run: Callable[[SlotWorker, list[Entry]], None]) -> bool:
        """`run` this slot's `entries` and the compatible requests other slots offered meanwhile in one
        pass, each offering slot released once it is answered; False (nothing run) if none were offered."""
        requests = [request for _, request, _ in entries]
        offers = self.host.batches.take(self, requests, entries[0][2], self.host.other_slots(self))
        if not offers:
            return False
        try:
            run(self, entries + [offer.entry for offer in offers])
        finally:
            for offer in offers:
                offer.done.set()
        return True

    def _serve_waiting(self) -> None:
        """Between a managed loop's steps: let the other slots have a turn, then serve this slot's queue."""
        if self.host.turns.others_waiting():
            with self.turn_handed_on():
                pass
        super()._serve_waiting()

    def stop(self) -> None:
        self._shutting_down = True
        self.requests.put(None)

    def memory(self) -> dict[str, int]:
        """Bytes this slot adds to the host: its adapter, and for a trainer its gradients and the optimizer's
        two moments (AdamW), each as large as the adapter once the first step has run (the moments in host
        memory when offloaded, host_budget.py)."""
        from .engine.model_state import adapter_bytes

        adapter = adapter_bytes(self.state.model)
        training = self.trainer is not None
        offloaded = self.optimizer_offloaded
        return {
            "adapter_bytes": adapter,
            "gradient_bytes": adapter if training else 0,
            "optimizer_bytes": 2 * adapter if training else 0,
            # What it holds on its host's device: its moments are in host memory between steps when offloaded.
            "slot_bytes": adapter * ((2 if offloaded else 4) if training else 1),
            **({"optimizer_offloaded": True} if offloaded else {}),
        }

    @property
    def optimizer_offloaded(self) -> bool:
        return self.trainer is not None and self.trainer.offload is not None


class SlotTaggedStream:
    """sys.stdout / sys.stderr of the host: each line a slot's thread prints is tagged with that slot."""

    def __init__(self, stream: TextIO, host: AdapterHost) -> None:
        self._stream = stream
        self._host = host
        self._pending = threading.local()

    def write(self, text: str) -> int:
        slot = self._host.current_slot()
        if slot is None:
            return self._stream.write(text)
        pending = getattr(self._pending, "text", "") + text
        *lines, rest = pending.split("\n")
        self._pending.text = rest
        for line in lines:
            self._stream.write(tag_line(slot, line) + "\n")
        return len(text)

    def flush(self) -> None:
        self._stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class AdapterHost:
    def __init__(
        self,
        channel: Channel,
        memory_budget_bytes: int | None = None,
        batched_ops: frozenset[str] = frozenset(),
    ) -> None:
        self.channel = channel
        self.memory_budget_bytes = memory_budget_bytes
        self.bases = BaseModels()
        self.turns = Turns()
        self.batches = SlotBatches(batched_ops)
        self._vllm_engines: Any = None  # built when the first vLLM sampling slot opens
        self.slots: dict[str, SlotWorker] = {}
        self._slots_lock = threading.Lock()
        self._local = threading.local()

    def held_bytes(self) -> int:
        """What the host holds once for all its slots: its bases, and its vLLM engines' weights and KV cache."""
        engines = self._vllm_engines
        return self.bases.base_bytes() + (engines.held_bytes() if engines is not None else 0)

    @property
    def vllm_engines(self) -> Any:
        """The host's vLLM engines (engine/hosted_vllm.py), one per base its vLLM sampling slots use."""
        if self._vllm_engines is None:
            from .engine.hosted_vllm import HostVllmEngines

            self._vllm_engines = HostVllmEngines()
        return self._vllm_engines

    def current_slot(self) -> str | None:
        return getattr(self._local, "slot", None)

    def other_slots(self, worker: SlotWorker) -> int:
        with self._slots_lock:
            return sum(1 for slot in self.slots.values() if slot is not worker)

    @contextlib.contextmanager
    def speaking_as(self, slot: str) -> Iterator[None]:
        """What this thread prints meanwhile goes to `slot`'s log (a pass answering several slots)."""
        own = self.current_slot()
        self._local.slot = slot
        try:
            yield
        finally:
            self._local.slot = own

    def log_for(self, slots: list[str], line: str) -> None:
        """Print `line` into each of `slots`' logs."""
        for slot in slots:
            with self.speaking_as(slot):
                print(line, flush=True)

    def serve(self) -> None:
        """Read messages and route them to their slots until the service closes the channel or says stop."""
        try:
            while True:
                header, blob = self.channel.receive()
                try:
                    message = messages.decode(header)
                except messages.UnknownMessage:  # refused, loudly: the sender has a bug
                    traceback.print_exc()
                    continue
                slot = messages.slot_of(header)
                if slot is None:
                    if isinstance(message, messages.Shutdown):
                        break
                    continue
                if isinstance(message, messages.Init):
                    self._open(slot, message)
                    continue
                with self._slots_lock:
                    worker = self.slots.get(slot)
                if worker is None:
                    continue
                if isinstance(message, messages.Shutdown):
                    worker.stop()
                else:
                    worker.take(header, message, blob)
        except (EOFError, OSError):
            pass
        with self._slots_lock:
            slots = list(self.slots.values())
        for worker in slots:
            worker.stop()

    def _open(self, slot: str, message: messages.Init) -> None:
        worker = SlotWorker(self, SlotChannel(self.channel, slot))
        with self._slots_lock:
            self.slots[slot] = worker
        threading.Thread(
            target=self._run_slot, args=(worker, message), name=f"cortex-slot-{slot}", daemon=True
        ).start()

    def _run_slot(self, worker: SlotWorker, message: messages.Init) -> None:
        self._local.slot = worker.slot
        try:
            try:
                with worker.turn():
                    described = worker.initialise(message, self.bases)
                    refusal = self._refusal(worker)
                    if refusal is not None:
                        verdict = "waits" if refusal.fits_later else "refused"
                        print(f"[host] slot {verdict}: {refusal.message}", flush=True)
                        worker.channel.send(
                            messages.encode(
                                messages.InitFailed(refusal.code, refusal.message, refusal.fits_later)
                            )
                        )
                        return
                    worker.channel.send(
                        messages.encode(messages.Ready({**described, **self._ready_info(worker)}))
                    )
            except ChannelClosed:
                return
            except Exception as exc:
                traceback.print_exc()
                worker.channel.send(
                    messages.encode(
                        messages.InitFailed("worker_start_failed", f"{type(exc).__name__}: {exc}")
                    )
                )
                return
            worker.serve()
        except ChannelClosed:
            return
        finally:
            with self._slots_lock:
                self.slots.pop(worker.slot, None)
            if worker.sampler is not None:  # a hosted vLLM sampler's adapters leave the shared engine
                worker.sampler.close()
            sys.stdout.flush()
            with contextlib.suppress(ChannelClosed):
                worker.channel.send(messages.encode(messages.Released()))

    def _refusal(self, worker: SlotWorker) -> Refusal | None:
        """Admission by bytes (host_budget.py): whether this new slot fits beside the base and the others."""
        import torch

        with self._slots_lock:
            others = [
                other for other in self.slots.values() if other is not worker and other.state is not None
            ]
        memory = worker.memory()
        others_memory = {other.slot: other.memory() for other in others}
        others_bytes = {slot: held["slot_bytes"] for slot, held in others_memory.items()}
        job = job_of_slot(worker.slot)
        free = None
        if torch.cuda.is_available():
            # What this process's allocator holds but no tensor uses (a freed slot's) is free to it too.
            device_free, total = torch.cuda.mem_get_info()
            free = (device_free + torch.cuda.memory_reserved() - torch.cuda.memory_allocated(), total)
        # Room for one offloaded slot's moments while it steps (slots step one at a time).
        reserve = max(
            (2 * others_memory[other.slot]["adapter_bytes"] for other in others if other.optimizer_offloaded),
            default=0,
        )

        def check(slot_bytes: int) -> Refusal | None:
            return check_slot(
                slot_bytes,
                memory["adapter_bytes"],
                self.held_bytes() + reserve,
                sum(others_bytes.values()),
                len(others),
                self.memory_budget_bytes,
                free,
                same_job_bytes=sum(count for slot, count in others_bytes.items() if job_of_slot(slot) == job),
            )

        refusal, offload = admit_slot(
            check,
            memory["slot_bytes"],
            memory["adapter_bytes"],
            worker.trainer is not None,
            free is not None,  # on a GPU: on a CPU the moments are in host memory already
            reserve,
        )
        if offload:
            worker.trainer.offload_optimizer()
            print("[host] slot fits with its optimizer moments in host memory between steps", flush=True)
        return refusal

    def _ready_info(self, worker: SlotWorker) -> dict[str, Any]:
        """What the slot's sub-job shows users: the worker's own description, and the host's share."""
        with self._slots_lock:
            slots = len(self.slots)
        return {
            "adapter_host": {"pid": os.getpid(), "slots": slots, "base_bytes": self.held_bytes()},
            **worker.memory(),
        }


def job_of_slot(slot: str) -> str:
    """The job a slot serves: slots are named `job_id/sub_job_id` (executors/local.py's slot_key)."""
    return slot.rpartition("/")[0]


def one_malloc_arena() -> None:
    """glibc gives each thread that allocates its own malloc arena and keeps what it frees there: with a
    thread per slot, every slot would hold a few MiB of freed activations apart. One arena for the
    process lets slots reuse each other's freed memory (they compute one at a time anyway)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").mallopt(-8, 1)  # M_ARENA_MAX
    except (OSError, AttributeError):
        return


def host_batches(setting: str) -> frozenset[str]:
    """What this host batches across slots (`--batch-across-slots`), on the device it runs on."""
    import torch

    return batched_operations(setting, torch.cuda.is_available())


def serve_adapter_host(channel: Channel, message: messages.HostAdapters) -> None:
    """Serve as an adapter host until the service closes the channel (worker.serve_channel's other mode)."""
    one_malloc_arena()
    os.environ.update(message.env or {})
    import torch

    if message.threads:
        torch.set_num_threads(int(message.threads))
    host = AdapterHost(channel, message.memory_budget_bytes, host_batches(message.batch_across_slots))
    sys.stdout = SlotTaggedStream(sys.stdout, host)
    sys.stderr = SlotTaggedStream(sys.stderr, host)
    host.serve()
    sys.stdout.flush()
