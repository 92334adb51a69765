"""vLLM on an adapter host: one engine per base model serves every vLLM sampling slot's adapter.

A vLLM sampling sub-job alone is a process with its own vLLM engine and its own copy of the base. On an
adapter host (adapter_host.py) each vLLM sampling slot instead registers its adapter versions, as LoRA
requests with ids of its own, in the one engine the host keeps for that base; vLLM then decodes the
requests of every slot in the same steps, each row through its own slot's adapter (vLLM's multi-LoRA
batching, up to `max_loras` adapters in one step).

Who steps the engine: the engine belongs to no slot. A slot's generate adds its requests and then, while
any of them is unfinished, either steps the engine (holding the host's turn, as any compute on the host
does, so a training slot's forward never runs beside it and each slot's random state stays its own) or
waits, without the turn, until another slot's step has handed it outputs. Whoever steps hands each slot
the outputs of its own requests; a stepping slot gives the turn on after each step while others wait for
it, so a trainer's forward_backward waits one decoding step for each sampling slot ahead of it. Prompt
scores are computed by the slot's own peft model under the turn, as for a sampler alone.

What a slot keeps of its own: its adapter versions (its LoRA ids; removed from the engine when the slot
ends), its requests, its seeds (each request draws from its own generator when seeded). What slots share:
the engine's base weights, its KV cache and prefix cache (a prefix is reused only under the same LoRA id,
so never across slots), and the engine's steps.
"""

from __future__ import annotations

import contextlib
import itertools
import shutil
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

from .model_state import ModelState
from .sampling_interface import Cancelled
from .vllm_sampler import (
    AdapterVersions,
    VllmSampler,
    _set_engine_environment,
    engine_arguments,
    lora_rank_for,
)


class HostTurn(Protocol):
    """A slot's hold on its host's compute turn (adapter_host.SlotWorker)."""

    def others_waiting(self) -> bool: ...

    def yield_turn(self, until: Callable[[], bool]) -> bool:
        """Give the turn back if held, then take it again unless `until` says first (False: not held)."""

    def take_turn(self) -> None:
        """Hold the turn (waiting for it if another slot holds it)."""


class Inbox:
    """The outputs of one slot's requests, handed to it by whichever slot stepped the engine."""

    def __init__(self) -> None:
        self.outputs: deque[Any] = deque()
        self.shared_steps = 0  # steps taken while other slots' requests were in the engine too

    def drain(self) -> list[Any]:
        taken = []
        while self.outputs:
            taken.append(self.outputs.popleft())
        return taken


class SharedVllmEngine:
    """One vLLM engine of an adapter host, over one base, with every call into it under one lock."""

    def __init__(self, state: ModelState, options: dict[str, Any]) -> None:
        _set_engine_environment(state.device.type, options)
        import torch
        import vllm
        from vllm import LLM

        self.version = vllm.__version__
        self.scratch = Path(tempfile.mkdtemp(prefix="cortex-vllm-host-"))
        self.max_loras = max(1, int(options.get("max_loras", 8)))
        rank = max(int(state.model.peft_config["default"].r), int(options.get("max_lora_rank", 64)))
        arguments = engine_arguments(state, options, self.scratch, rank, self.max_loras)
        # Adapters kept loaded beyond one step's: every slot's current version and, briefly, its previous one.
        arguments["max_cpu_loras"] = max(
            self.max_loras, int(options.get("max_cpu_loras", 4 * self.max_loras))
        )
        self.max_lora_rank = arguments["max_lora_rank"]
        reserved = torch.cuda.memory_reserved() if state.device.type == "cuda" else 0
        started = time.perf_counter()
        with threads_kept(torch):
            self.llm = LLM(**arguments)
        self.start_s = time.perf_counter() - started
        self.engine = self.llm.llm_engine
        if state.device.type == "cuda":
            self.held_bytes = torch.cuda.memory_reserved() - reserved
        else:  # the weights vLLM loaded, and the KV cache it reserved
            weights = sum(t.numel() * t.element_size() for t in state.model.get_base_model().parameters())
            self.held_bytes = weights + int(options.get("cpu_kv_cache_gib", 1)) * 2**30
        self.lock = threading.Lock()
        self.lora_ids = itertools.count(1)
        self.samplers = itertools.count(1)
        self._routes: dict[str, Inbox] = {}

    # what AdapterVersions calls
    def add_lora(self, request: Any) -> bool:
        with self.lock:
            return self.engine.add_lora(request)

    def remove_lora(self, lora_id: int) -> bool:
        with self.lock:
            return self.engine.remove_lora(lora_id)

    def list_loras(self) -> set[int]:
        with self.lock:
            return set(self.engine.list_loras())

    # requests
    def add(self, request_id: str, prompt: Any, params: Any, lora: Any, inbox: Inbox) -> None:
        with self.lock:
            self.engine.add_request(request_id, prompt, params, lora_request=lora)
            self._routes[request_id] = inbox

    def abort(self, request_ids: list[str]) -> None:
        with self.lock:
            self.engine.abort_request(request_ids)
            for request_id in request_ids:
                self._routes.pop(request_id, None)

    def step(self) -> None:
        """One engine step for every slot's requests, each output handed to its slot's inbox."""
        with self.lock:
            decoding = {id(inbox): inbox for inbox in self._routes.values()}
            if len(decoding) > 1:
                for inbox in decoding.values():
                    inbox.shared_steps += 1
            outputs = self.engine.step()
            for output in outputs:
                inbox = self._routes.get(output.request_id)
                if inbox is not None:
                    inbox.outputs.append(output)
                    if output.finished:
                        del self._routes[output.request_id]

    def reset_prefix_cache(self) -> bool:
        with self.lock:
            return bool(self.llm.reset_prefix_cache())


@contextlib.contextmanager
def threads_kept(torch: Any) -> Iterator[None]:
    """vLLM's CPU worker replaces `torch.set_num_threads` process-wide with one that refuses (it expects to own
    the process): the host's other slots set and keep their own thread count, so it is put back, and so is
    the count. Threads are not pinned here (VLLM_CPU_OMP_THREADS_BIND=nobind), so vLLM loses nothing."""
    set_num_threads, threads = torch.set_num_threads, torch.get_num_threads()
    try:
        yield
    finally:
        torch.set_num_threads = set_num_threads
        torch.set_num_threads(threads)


class HostVllmEngines:
    """An adapter host's vLLM engines, one per (base model, dtype, context length), built by the first
    vLLM sampling slot that needs it and kept for the next ones."""

    def __init__(self) -> None:
        self._engines: dict[tuple[str, str, int], SharedVllmEngine] = {}
        self._lock = threading.Lock()

    def engine_for(self, state: ModelState, options: dict[str, Any]) -> tuple[SharedVllmEngine, bool]:
        """The engine for `state`'s base, and whether it was built now."""
        key = (state.info.name, str(state.dtype), int(state.max_seq_len))
        with self._lock:
            engine = self._engines.get(key)
            if engine is not None:
                return engine, False
            engine = self._engines[key] = SharedVllmEngine(state, options)
            return engine, True

    def held_bytes(self) -> int:
        with self._lock:
            return sum(engine.held_bytes for engine in self._engines.values())


class HostedVllmSampler(VllmSampler):
    """A vLLM sampling slot: its adapter versions served by its host's shared engine."""

    def __init__(self, state: ModelState, engine: SharedVllmEngine, built_now: bool, turn: HostTurn):
        self.state = state
        self.shared = engine
        self.turn = turn
        self.version = engine.version
        self.llm = engine.llm
        self.engine = engine.engine
        self.start_s = engine.start_s if built_now else 0.0
        self.tensor_parallel_size = 1
        self.scratch = Path(tempfile.mkdtemp(prefix="cortex-vllm-slot-"))
        self.inbox = Inbox()
        self._turn_needed_after = True
        self._follow_adapter(
            AdapterVersions(engine, self.scratch, engine.lora_ids), f"s{next(engine.samplers)}-c"
        )

    def describe(self) -> dict[str, Any]:
        return {
            **super().describe(),
            # one engine of the adapter host serves every vLLM sampling slot on this base
            "shared_engine": True,
            "max_loras": self.shared.max_loras,
            "max_lora_rank": self.shared.max_lora_rank,
        }

    def reset_prefix_cache(self) -> dict[str, Any]:
        reset = self.shared.reset_prefix_cache()
        return {
            "engine": self.name,
            "reset": reset,
            "cached_prefixes_dropped": None,
            "detail": "the host's shared vLLM engine emptied its prefix cache (prefixes are never shared across"
            " slots: each is kept under its slot's own LoRA id)"
            if reset
            else "vLLM refused the reset (a request, this slot's or another's, still held cache blocks)",
        }

    def sample(self, prompts, params, seed, should_cancel, on_tokens=None):
        # What the rest of the generate computes on the slot's own model needs the turn again; without it, a
        # sampler whose outputs other slots' steps decoded answers at once instead of queueing for the turn.
        self._turn_needed_after = bool(
            params.prompt_logprobs
            or params.prompt_logprobs_topk
            or params.prompt_logprobs_targets is not None
            or params.prompt_alt_tokens_k
            or params.record_routes
        )
        return super().sample(prompts, params, seed, should_cancel, on_tokens)

    def _add(self, request_id: str, prompt: Any, params: Any, lora: Any) -> None:
        self.shared.add(request_id, prompt, params, lora, self.inbox)

    def _abort(self, request_ids: list[str]) -> None:
        self.shared.abort(request_ids)

    def _done(self, request_ids: list[str]) -> None:
        self.inbox.outputs.clear()  # what a step handed in after the call ended
        if self.inbox.shared_steps:
            print(
                f"[engine] vllm: {self.inbox.shared_steps} step(s) of the host's engine decoded this request"
                " together with other slots' requests",
                flush=True,
            )
            self.inbox.shared_steps = 0

    def _run(self, unfinished: set[str], should_cancel: Cancelled, take: Callable[[list[Any]], None]) -> None:
        """Entered holding the host's turn; in between, step the engine holding the turn or wait without it for
        another slot's step to hand this slot its outputs. Left holding it only if the generate computes more on
        the slot's own model (prompt scores, routes): what else is left (aborting requests, answering) needs
        no turn."""
        from .errors import OperationError

        def handed_outputs() -> bool:
            return bool(self.inbox.outputs) or should_cancel()

        holding = True
        try:
            while unfinished:
                if self.inbox.outputs:
                    take(self.inbox.drain())
                    continue
                if should_cancel():
                    raise OperationError("cancelled", "the request was cancelled")
                if holding:
                    self.shared.step()
                    if self.turn.others_waiting():
                        holding = self.turn.yield_turn(handed_outputs)
                else:
                    holding = self.turn.yield_turn(handed_outputs)
        finally:
            if not holding and self._turn_needed_after:
                self.turn.take_turn()

    def close(self) -> None:
        self.adapters.remove_all()
        shutil.rmtree(self.scratch, ignore_errors=True)


def open_hosted_sampler(state: ModelState, options: dict[str, Any], engines: HostVllmEngines, turn: HostTurn):
    """A vLLM sampling slot's engine: the host's shared vLLM engine, or the built-in engine (unmerged, as
    any hosted sampler) for an adapter of a rank the shared engine was not built for."""
    engine, built_now = engines.engine_for(state, options)
    rank = int(state.model.peft_config["default"].r)
    if lora_rank_for(rank) > engine.max_lora_rank:
        from .transformers_sampler import TransformersSampler

        print(
            f"[engine] vllm: the host's engine serves LoRA ranks up to {engine.max_lora_rank} (--vllm-max-lora-rank);"
            f" this adapter has r={rank}: it samples with the built-in engine",
            flush=True,
        )
        return TransformersSampler(state, merge_lora=False)
    return HostedVllmSampler(state, engine, built_now, turn)
