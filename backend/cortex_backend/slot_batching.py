"""Requests of several adapter-host slots computed in one pass (`--batch-across-slots`).

A slot with a generate or a forward_backward to run offers it while it waits for the host's turn. The slot
that next takes the turn for a request of the same kind takes with it the offers that are compatible
(`slot_batch_key`) and fit one pass, runs them all in one pass, each slot's rows through that slot's own
adapter (engine/grouped_lora.py), and answers each request through its own slot. A slot whose offer was
taken stops waiting for the turn. So batches form under load by themselves: while one slot computes, the
others' requests queue up as offers and go together next.

Generates are compatible as sample_batching.py asks of one sub-job's generates (the same sampling params
apart from the seed; no stream, no prompt scores, no routes), on the same base, with each slot's current
weights (no saved `adapter`), a built-in engine running its LoRA unmerged, and plain LoRA on linear layers
(`grouped_lora.groupable`). Each request keeps its own seed and generator, and its result its own slot's
weight version. forward_backwards are compatible when their batches have the same sequence length and
their slots draw nothing at random in the forward (engine/grouped_training.py); each slot computes its own
loss, with its own loss function, from its rows' logits, and gets its own gradients.

The base projection over more rows rounds like a larger batch: losses, gradients and logprobs agree with
the slot alone to float rounding, not bit for bit, which is why a CPU host does this only when asked.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cortex_nb.protocol import wire
from cortex_nb.protocol.schemas.sampling import SamplingParams

from . import worker_messages as messages
from .sample_batching import batch_key

if TYPE_CHECKING:
    from .worker import Worker

    class SlotWorker(Worker):
        """What this module reads of an adapter host's slot (adapter_host.SlotWorker, which imports this)."""

        slot: str
        groupable: bool
        trains_together: bool
        host: Any


Entry = tuple["SlotWorker", messages.Request, bytes]  # a slot, its request and the request's blob


@dataclass(eq=False)
class Offer:
    """A slot's request, waiting for the turn, that another slot may take into its pass."""

    worker: SlotWorker
    request: messages.Request
    blob: bytes
    key: str
    taken: bool = False
    done: threading.Event = field(default_factory=threading.Event)

    @property
    def entry(self) -> Entry:
        return self.worker, self.request, self.blob


def batched_operations(setting: str, on_gpu: bool) -> frozenset[str]:
    """`--batch-across-slots`: which operations of several slots may share a pass. `generate`: generates;
    `all`: forward_backwards too; `off`: none; `auto`: generates on a GPU (where a larger batch is nearly
    free), none on a CPU (which keeps each slot bitwise the job alone)."""
    if setting == "auto":
        setting = "generate" if on_gpu else "off"
    return frozenset({"off": (), "generate": ("generate",), "all": ("generate", "forward_backward")}[setting])


def slot_batch_key(worker: SlotWorker, request: messages.Request, blob: bytes = b"") -> str | None:
    """What two slots' requests must share to run in one pass; None for one that runs alone."""
    if request.request_id in worker.cancelled or not worker.groupable:
        return None
    if request.op == "generate":
        key = _generate_key(worker, request)
    elif request.op == "forward_backward":
        key = _training_key(worker, request, blob)
    else:
        return None
    return None if key is None else json.dumps({"base": worker.state.info.name, "op": request.op, **key})


def _generate_key(worker: SlotWorker, request: messages.Request) -> dict[str, Any] | None:
    key = batch_key(request)
    engine = worker.sampler
    if key is None or (request.params or {}).get("adapter") is not None or engine is None:
        return None
    if not engine.batches_requests:  # a hosted engine runs its LoRA unmerged (adapter_host.py)
        return None
    return {"request": key}


def _training_key(worker: SlotWorker, request: messages.Request, blob: bytes) -> dict[str, Any] | None:
    from .engine.router_replay import REPLAY_TENSOR

    if worker.trainer is None or worker.faults.active("fail_forward_backward"):
        return None
    if (request.params or {}).get("record_routes") or not worker.trains_together:
        return None
    try:
        tensors, _ = wire.decode_frame(blob, copy=False)
        input_ids = tensors["input_ids"]
    except Exception:  # a batch the worker itself will refuse, with its own error, alone
        return None
    if REPLAY_TENSOR in tensors or input_ids.ndim != 2:
        return None
    return {"length": int(input_ids.shape[1]), "mask": "attention_mask" in tensors}


def _tokens(blob: bytes) -> int:
    tensors, _ = wire.decode_frame(blob, copy=False)
    return int(tensors["input_ids"].size)


class SlotBatches:
    """The offers of one host's slots, and who takes them.

    Offers come from slots waiting while a pass runs, so under load the slots split into groups that
    alternate (those answered by one pass send their next requests while the next pass runs). So, while the
    host is seeing passes of several slots (one in the last `BURST_MEMORY_S` seconds), whoever takes offers
    also waits for more, as long as each next one arrives within `GAP_S` of the last (at most `MAX_WAIT_S`
    in all) and some slot of the host has yet to offer. A host whose slots never meet never waits.
    """

    GAP_S = 0.01
    MAX_WAIT_S = 0.1
    BURST_MEMORY_S = 30.0

    def __init__(self, operations: frozenset[str], clock: Callable[[], float] = time.monotonic) -> None:
        self.operations = operations  # those that may share a pass (batched_operations)
        self.clock = clock
        self.last_burst = float("-inf")
        self._offers: list[Offer] = []
        self._lock = threading.Lock()
        self._arrived = threading.Condition(self._lock)

    def offer(self, worker: SlotWorker, request: messages.Request, blob: bytes) -> Offer | None:
        if request.op not in self.operations:
            return None
        key = slot_batch_key(worker, request, blob)
        if key is None:
            return None
        offer = Offer(worker, request, blob, key)
        with self._lock:
            self._offers.append(offer)
            self._arrived.notify_all()
        return offer

    def withdraw(self, offer: Offer) -> bool:
        """Take back an offer no one took (its slot got the turn first); False if it was taken."""
        with self._lock:
            if offer.taken:
                return False
            self._offers.remove(offer)
            return True

    def take(
        self, worker: SlotWorker, own: list[messages.Request], blob: bytes = b"", others: int = 0
    ) -> list[Offer]:
        """The other slots' offers to run with `worker`'s requests `own` (generates, or one forward_backward
        and its `blob`), oldest first, while the pass has room; `others`: how many other slots the host
        has (none of them left to offer, no wait)."""
        key = slot_batch_key(worker, own[0], blob) if own[0].op in self.operations else None
        if key is None:
            return []
        if own[0].op == "generate":
            params = SamplingParams.model_validate(own[0].params["sampling_params"])
            prompts = [prompt for request in own for prompt in request.params["prompt_tokens"]]

            def fits(offer: Offer) -> bool:
                nonlocal prompts
                more = prompts + list(offer.request.params["prompt_tokens"])
                if len(more) * params.n > worker.sampler.rows_in_one_pass(more, params):
                    return False
                prompts = more
                return True
        else:
            from .engine.grouped_training import TOKENS_PER_PASS

            tokens = _tokens(blob)

            def fits(offer: Offer) -> bool:
                nonlocal tokens
                more = tokens + _tokens(offer.blob)
                if more > TOKENS_PER_PASS:
                    return False
                tokens = more
                return True

        taken: list[Offer] = []
        waiting = self.clock() - self.last_burst < self.BURST_MEMORY_S
        deadline = self.clock() + self.MAX_WAIT_S
        with self._lock:
            while True:
                full = False
                for offer in list(self._offers):
                    if offer.key != key or offer.request.request_id in offer.worker.cancelled:
                        continue
                    if not fits(offer):
                        full = True
                        break
                    offer.taken = True
                    self._offers.remove(offer)
                    taken.append(offer)
                gap = min(self.GAP_S, deadline - self.clock())
                if full or not waiting or len(taken) >= others or gap <= 0:
                    break
                if not self._arrived.wait(gap):
                    break
        if taken:
            self.last_burst = self.clock()
        return taken


def sample_across_slots(driver: SlotWorker, entries: list[Entry]) -> None:
    """Sample every entry's generate in one pass of `driver`'s engine, each through its own slot's adapter,
    and answer each through its own slot."""
    import torch

    from .engine.grouped_lora import SlotRows, grouped
    from .engine.sampling_interface import resolve_seed
    from .worker import failure_of

    params = SamplingParams.model_validate(entries[0][1].params["sampling_params"])
    _started(driver, entries, "generate", "sampled in one pass")

    def all_cancelled() -> bool:
        return all(request.request_id in worker.cancelled for worker, request, _ in entries)

    try:
        for worker, _, _ in entries:
            worker.faults.raise_in("generate")
        prompt_lists = [request.params["prompt_tokens"] for _, request, _ in entries]
        seeds = [
            resolve_seed(SamplingParams.model_validate(request.params["sampling_params"]))
            for _, request, _ in entries
        ]
        groups = [
            SlotRows(worker.state.model.get_base_model(), len(prompts), len(prompts) * params.n)
            for (worker, _, _), prompts in zip(entries, prompt_lists, strict=True)
        ]
        clock = time.perf_counter()
        with contextlib.ExitStack() as stack:
            for worker in {id(worker): worker for worker, _, _ in entries}.values():
                stack.enter_context(worker.state.inference())
            stack.enter_context(torch.inference_mode())
            stack.enter_context(grouped(driver.state.model.get_base_model(), groups))
            per_request = driver.sampler.sample_requests(prompt_lists, seeds, params, all_cancelled)
        elapsed = time.perf_counter() - clock
        for (worker, request, _), samples, seed in zip(entries, per_request, seeds, strict=True):
            if request.request_id in worker.cancelled:
                worker.send_message(
                    messages.failed(request.request_id, "cancelled", "the request was cancelled")
                )
            else:
                result = worker.sampler.result_of(samples, seed, elapsed)
                worker.send_message(messages.succeeded(request.request_id, result))
    except Exception as exc:  # report, never die: one bad pass must not end the slots
        if all_cancelled():
            for worker, request, _ in entries:
                worker.send_message(failure_of(request.request_id, "generate", exc))
        else:
            each_alone(driver, entries, exc)
    finally:
        _forget_cancels(entries)


def _started(driver: SlotWorker, entries: list[Entry], op: str, how: str) -> None:
    """Each entry's request has started; every slot in the pass says so in its log."""
    started = time.time()
    for worker, request, _ in entries:
        worker.send_message(messages.Started(request.request_id, started))
    slots = sorted({worker.slot for worker, _, _ in entries})
    driver.host.log_for(slots, f"[engine] {op}: {len(entries)} requests of {len(slots)} slots {how}")


def _forget_cancels(entries: list[Entry]) -> None:
    """The requests have ended: a cancel of theirs that came meanwhile has nothing left to cancel."""
    for worker, request, _ in entries:
        worker.cancelled.discard(request.request_id)


def each_alone(driver: SlotWorker, entries: list[Entry], exc: Exception) -> None:
    """A shared pass failed (out of memory, say): each request runs again alone, so the fault fails only the
    request that causes it and its neighbours get their results. Already started: answered, not restarted."""
    from .worker import failure_of

    slots = sorted({worker.slot for worker, _, _ in entries})
    driver.host.log_for(
        slots,
        f"[engine] a pass of {len(slots)} slots failed ({type(exc).__name__}: {exc}); each request runs alone",
    )
    for worker, request, blob in entries:
        request_id = request.request_id
        if request_id in worker.cancelled:
            worker.send_message(messages.failed(request_id, "cancelled", "the request was cancelled"))
            continue
        with driver.host.speaking_as(worker.slot):
            worker.current = request_id
            try:
                worker.faults.raise_in(request.op)
                result, out = worker.operations[request.op](request.params or {}, blob)
                worker.send_message(messages.succeeded(request_id, result), out)
            except Exception as alone:  # this request's own failure
                worker.send_message(failure_of(request_id, request.op, alone))
            finally:
                worker.current = None


def train_across_slots(driver: SlotWorker, entries: list[Entry]) -> None:
    """Every entry's forward_backward in one pass (engine/grouped_training.py), each answered through its
    own slot with its own result, or its own failure."""
    from .engine.grouped_training import forward_backward_together
    from .worker import failure_of

    _started(driver, entries, "forward_backward", "in one pass")
    try:
        batches = [
            (
                worker.trainer,
                wire.decode_frame(blob)[0],
                request.params["loss_fn"],
                request.params["loss_fn_config"],
            )
            for worker, request, blob in entries
        ]
        try:
            outcomes = forward_backward_together(driver.trainer, batches)
        except Exception as exc:  # the pass itself failed (out of memory, say); its gradients are undone
            each_alone(driver, entries, exc)
            return
        for (worker, request, _), outcome in zip(entries, outcomes, strict=True):
            if isinstance(outcome, Exception):
                worker.send_message(failure_of(request.request_id, "forward_backward", outcome))
                continue
            result, out = outcome
            with driver.host.speaking_as(worker.slot):
                worker.report_forward_backward(result)
            worker.send_message(messages.succeeded(request.request_id, result), wire.encode_frame(out))
    except Exception as exc:  # report, never die: one bad pass must not end the slots
        for worker, request, _ in entries:
            worker.send_message(failure_of(request.request_id, "forward_backward", exc))
    finally:
        _forget_cancels(entries)
