"""The `vllm` sampling engine: a vLLM engine inside a sampling sub-job's worker (on an adapter host, one
engine shared by every vLLM sampling slot of a base: engine/hosted_vllm.py, built on this module).

The engine runs in the worker's own process (no engine-core subprocess) on the worker's device (a
sampling sub-job with `n_gpus: N` gets N devices and an engine with tensor-parallel size N, whose N
shard workers vLLM starts itself), on the sub-job's registered model (the built-in `tiny` is written to a directory first), in the sub-job's
dtype, with LoRA on. The sub-job's `ModelState` keeps the peft model: weight sync, checkpoint loads and
`forward` act on it as for any sub-job. Whenever its adapter changed, `refresh` writes the adapter as a
peft directory and loads it as a new `LoRARequest` id (vLLM caches adapters by id, so reusing one would
keep serving the old weights); the previous id is evicted once no request uses it.

Prompts go in as token ids and vLLM runs without a tokenizer: texts and stop strings come from the
project's tokenizer (engine/stopping.py), exactly as for the built-in engine. Sampled-token logprobs
are vLLM's raw logprobs (`logprobs_mode="raw_logprobs"`: before temperature, top-k and top-p), the
model's own distribution, as the API promises for every engine. Prompt logprobs come from the
sub-job's own model, as `forward` computes them (vLLM 0.32's CPU build fails prompt logprobs with LoRA on).

`sample` drives vLLM's engine one step at a time (`LLMEngine.step`, in this process), so a streamed generate
hands on each step's new tokens as the built-in engine does (token_stream.py), and a cancelled request
(a streaming client that left) is aborted in vLLM at the next step.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from cortex_nb.protocol.schemas.base import MAX_SEED
from cortex_nb.protocol.schemas.sampling import SamplingParams

from .adapter import adapter_parameters
from .errors import OperationError
from .model_state import ModelState
from .prompt_scores import prompt_logprobs
from .sampling_interface import Cancelled, SamplingEngine
from .stopping import TextStop, finish_sample, stop_token_ids
from .token_stream import TokensCallback, TokenStreamer

# LoRA ranks vLLM can serve (its LoRAConfig.max_lora_rank); an adapter's rank is rounded up to one.
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def _set_engine_environment(device_type: str, options: dict[str, Any]) -> None:
    """Settings vLLM reads from the environment when it is imported; an operator's own values win."""
    # The engine in this process: one worker already is one process per sub-job, and a second process
    # would double the memory and (on a CPU) keep a core for its scheduler.
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    if device_type == "cpu":
        # Without it, vLLM's CPU backend reserves most of the host's RAM for its KV cache.
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(int(options.get("cpu_kv_cache_gib", 1))))
        # Other workers share these cores: no pinning of OpenMP threads to them.
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")


def lora_rank_for(rank: int) -> int:
    for supported in VLLM_LORA_RANKS:
        if rank <= supported:
            return supported
    raise OperationError(
        "unsupported_operation",
        f"vLLM serves LoRA ranks up to {VLLM_LORA_RANKS[-1]}; this adapter has r={rank}",
    )


def sample_seed(seed: int, prompt_index: int, sample_index: int) -> int:
    """Each sample's own seed, derived from the call's: vLLM draws each request from its own generator."""
    digest = hashlib.sha256(f"{seed}:{prompt_index}:{sample_index}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & MAX_SEED


def _model_directory(state: ModelState, scratch: Path) -> Path:
    """Where vLLM loads the base model from: the registered directory, or the built-in model written out."""
    if state.info.path is not None:
        return state.info.path
    from .loading import build_tiny

    directory = scratch / "base-model"
    build_tiny().save_pretrained(str(directory), safe_serialization=True)
    return directory


def engine_arguments(
    state: ModelState, options: dict[str, Any], scratch: Path, lora_rank: int, max_loras: int
) -> dict[str, Any]:
    """What a vLLM engine over `state`'s base is built with: LoRA on, ranks up to `lora_rank`'s (rounded up to
    one vLLM serves), `max_loras` adapters in one batch."""
    arguments: dict[str, Any] = {
        "model": str(_model_directory(state, scratch)),
        "dtype": str(state.dtype).replace("torch.", ""),  # "auto" would pick bf16 on a CPU
        "skip_tokenizer_init": True,
        "enable_lora": True,
        "max_lora_rank": lora_rank_for(lora_rank),
        "max_loras": max_loras,
        "max_model_len": state.max_seq_len,
        "seed": state.seed,
        "logprobs_mode": "raw_logprobs",
        "enable_prefix_caching": True,  # the n samples of a prompt share its KV cache
    }
    if state.device.type == "cuda":
        arguments["gpu_memory_utilization"] = float(options.get("gpu_memory_fraction", 0.45))
    return arguments


class AdapterVersions:
    """The sub-job's adapter as vLLM LoRA requests, one id per version; an old id is evicted once unused."""

    def __init__(self, engine, scratch: Path, ids: Iterator[int]) -> None:
        self.engine = engine  # vLLM's engine, or an adapter host's shared one (hosted_vllm.py)
        self.scratch = scratch
        self.ids = ids
        self.current = None  # LoRARequest
        self.in_use: Counter[int] = Counter()
        self.retired: dict[int, Any] = {}
        self.evicted = 0

    def publish(self, state: ModelState) -> Any:
        from safetensors.torch import save_file
        from vllm.lora.request import LoRARequest

        from .checkpoint import ADAPTER_CONFIG, ADAPTER_WEIGHTS, adapter_config_bytes
        from .lora import adapter_state

        lora_id = next(self.ids)
        directory = self.scratch / f"adapter-{lora_id}"
        directory.mkdir()
        (directory / ADAPTER_CONFIG).write_bytes(adapter_config_bytes(state.model, state.info.name))
        tensors = {name: t.detach().to("cpu").contiguous() for name, t in adapter_state(state.model).items()}
        save_file(tensors, str(directory / ADAPTER_WEIGHTS))
        request = LoRARequest(f"weights-{lora_id}", lora_id, str(directory))
        self.engine.add_lora(request)  # loaded now, so the next generate starts at once
        previous, self.current = self.current, request
        if previous is not None:
            self.retired[previous.lora_int_id] = previous
            self._evict_unused()
        return request

    def acquire(self) -> Any:
        self.in_use[self.current.lora_int_id] += 1
        return self.current

    def release(self, request) -> None:
        self.in_use[request.lora_int_id] -= 1
        self._evict_unused()

    def _evict_unused(self) -> None:
        for lora_id in [lora_id for lora_id in self.retired if self.in_use[lora_id] <= 0]:
            request = self.retired.pop(lora_id)
            self.engine.remove_lora(lora_id)
            shutil.rmtree(request.lora_path, ignore_errors=True)
            self.in_use.pop(lora_id, None)
            self.evicted += 1

    def loaded(self) -> list[int]:
        """The ids of this sub-job's adapter versions the engine holds."""
        own = {
            request.lora_int_id for request in (self.current, *self.retired.values()) if request is not None
        }
        return sorted(own & set(self.engine.list_loras()))

    def remove_all(self) -> None:
        """Unload every version (a hosted sampler's slot ends; the engine serves other slots on)."""
        for request in (self.current, *self.retired.values()):
            if request is not None:
                self.engine.remove_lora(request.lora_int_id)
        self.current, self.retired = None, {}


class VllmSampler(SamplingEngine):
    name = "vllm"
    # `sample` steps vLLM's engine itself, so a streamed generate hands on each step's new tokens.
    streams_tokens = True

    def __init__(self, state: ModelState, options: dict[str, Any]) -> None:
        super().__init__(state)
        _set_engine_environment(state.device.type, options)
        import vllm
        from vllm import LLM

        self.version = vllm.__version__
        self.scratch = Path(tempfile.mkdtemp(prefix="cortex-vllm-"))
        # the current adapter and, briefly, the one it replaced
        arguments = engine_arguments(
            state, options, self.scratch, int(state.model.peft_config["default"].r), 2
        )
        if state.device.type == "cuda" and state.info.quantization == "nf4":
            # vLLM quantizes the base itself as it loads it (bitsandbytes 4-bit), as the trainer holds it.
            arguments["quantization"] = "bitsandbytes"
        # A sampling sub-job with n_gpus: N sees N devices (CUDA_VISIBLE_DEVICES, or N CPU slots): vLLM
        # shards the base and the adapter over N worker processes of its own.
        self.tensor_parallel_size = int(options.get("tensor_parallel_size", 1))
        if self.tensor_parallel_size > 1:
            arguments["tensor_parallel_size"] = self.tensor_parallel_size
            arguments["distributed_executor_backend"] = "mp"
        started = time.perf_counter()
        self.llm = LLM(**arguments)
        self.engine = self.llm.llm_engine
        self.start_s = time.perf_counter() - started
        self._follow_adapter(AdapterVersions(self.engine, self.scratch, itertools.count(1)), "c")

    def _follow_adapter(self, adapters: AdapterVersions, request_prefix: str) -> None:
        """Serve the sub-job's adapter through `adapters` from now on (its current weights published)."""
        self.adapters = adapters
        self.request_prefix = request_prefix
        self.parameters = list(adapter_parameters(self.state.model).values())
        self.published_versions: tuple[int, ...] | None = None
        self.calls = itertools.count()
        self.refresh()

    def refresh(self) -> None:
        versions = tuple(parameter._version for parameter in self.parameters)
        if versions == self.published_versions:
            return
        started = time.perf_counter()
        request = self.adapters.publish(self.state)
        self.published_versions = versions
        print(
            f"[engine] vllm serves weights v{self.state.weight_version} as LoRA id {request.lora_int_id}"
            f" ({(time.perf_counter() - started) * 1000:.0f} ms); loaded ids {self.adapters.loaded()}",
            flush=True,
        )

    def reset_prefix_cache(self) -> dict[str, Any]:
        """vLLM's own reset. Requests of a sub-job run one at a time, so none is in flight to refuse it."""
        reset = bool(self.llm.reset_prefix_cache())
        return {
            "engine": self.name,
            "reset": reset,
            "cached_prefixes_dropped": None,
            "detail": "vLLM's prefix cache was emptied"
            if reset
            else "vLLM refused the reset (a request still held cache blocks)",
        }

    def describe(self) -> dict[str, Any]:
        return {
            "engine": self.name,
            "version": self.version,
            "start_s": round(self.start_s, 2),
            "lora_id": self.adapters.current.lora_int_id if self.adapters.current else None,
            # as vLLM itself took it, not as asked
            "tensor_parallel_size": self.engine.vllm_config.parallel_config.tensor_parallel_size,
        }

    def _request_params(self, params: SamplingParams, seed: int | None, stop_ids: set[int], deltas: bool):
        from vllm import SamplingParams as VllmParams
        from vllm.sampling_params import RequestOutputKind

        return VllmParams(
            n=1,
            max_tokens=params.max_tokens,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k,  # 0 turns top-k off, as ours
            seed=None if params.greedy else seed,
            stop_token_ids=sorted(stop_ids),
            ignore_eos=True,  # our stop ids already hold the end-of-sequence token when it counts
            logprobs=0,  # the sampled token's logprob only
            detokenize=False,
            output_kind=RequestOutputKind.DELTA if deltas else RequestOutputKind.FINAL_ONLY,
        )

    def sample(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        seed: int | None,
        should_cancel: Cancelled,
        on_tokens: TokensCallback | None = None,
    ) -> tuple[list[dict[str, Any]], list[list[float]] | None]:
        from vllm.inputs import TokensPrompt

        if params.logprobs_topk:
            # vLLM's top-k logprobs come after its own logits processing, not the model's own distribution.
            raise OperationError(
                "unsupported_operation",
                "logprobs_topk (the sampled positions' top-k) is served by the built-in (transformers) sampler only",
            )
        tokenizer = self.state.tokenizer
        stop_ids = stop_token_ids(params, tokenizer, self.state.model.config.eos_token_id)
        text_stopped = bool(params.stop_strings) and tokenizer is not None
        # Each step's new tokens (not only finished requests) when stop strings are searched or tokens streamed.
        deltas = text_stopped or on_tokens is not None
        streamer = (
            TokenStreamer(on_tokens, len(prompts) * params.n, params.n, 0, tokenizer, stop_ids)
            if on_tokens is not None
            else None
        )
        call = next(self.calls)
        rows: dict[str, tuple[int, int]] = {}
        tokens: dict[str, list[int]] = {}
        logprobs: dict[str, list[float]] = {}
        text_stops: dict[str, TextStop] = {}
        unfinished: set[str] = set()
        lora = self.adapters.acquire()

        def take(outputs: list[Any]) -> None:
            """Each output's new tokens into its sample; a sample done (or cut at a stop string) leaves."""
            ended_early = []
            for output in outputs:
                request_id = output.request_id
                if request_id not in unfinished:
                    continue
                completion = output.outputs[0]
                tokens[request_id].extend(completion.token_ids)
                logprobs[request_id].extend(
                    _token_logprob(entry, token)
                    for entry, token in zip(completion.logprobs or [], completion.token_ids, strict=True)
                )
                ended = output.finished
                if request_id in text_stops:
                    ended = (
                        self._stop_on_text(request_id, text_stops[request_id], tokens, logprobs, stop_ids)
                        or ended
                    )
                if ended:
                    unfinished.discard(request_id)
                    if not output.finished:
                        ended_early.append(request_id)
            if ended_early:
                self._abort(ended_early)
            if streamer is not None:
                # Request ids are numbered prompt-major, as the streamer's rows are.
                streamer.look_lists(list(tokens.values()), list(logprobs.values()))

        try:
            for prompt_index, prompt in enumerate(prompts):
                for sample_index in range(params.n):
                    request_id = f"{self.request_prefix}{call}-p{prompt_index}-s{sample_index}"
                    rows[request_id] = (prompt_index, sample_index)
                    tokens[request_id], logprobs[request_id] = [], []
                    if text_stopped:
                        text_stops[request_id] = TextStop(params.stop_strings, tokenizer)
                    request_seed = sample_seed(seed, prompt_index, sample_index) if seed is not None else None
                    self._add(
                        request_id,
                        TokensPrompt(prompt_token_ids=list(prompt)),
                        self._request_params(params, request_seed, stop_ids, deltas),
                        lora,
                    )
                    unfinished.add(request_id)
            self._run(unfinished, should_cancel, take)
            if streamer is not None:
                streamer.look_lists(list(tokens.values()), list(logprobs.values()), final=True)
        finally:
            if unfinished:  # cancelled (a streaming client that left, too) or failed: vLLM drops them
                self._abort(sorted(unfinished))
                print(f"[engine] vllm aborted {len(unfinished)} unfinished request(s)", flush=True)
            self._done(list(rows))
            self.adapters.release(lora)
        samples = []
        for request_id, (prompt_index, sample_index) in rows.items():
            sample = finish_sample(
                tokens[request_id],
                logprobs[request_id],
                stop_ids,
                text_stops.get(request_id),
                tokenizer,
                params.logprobs,
            )
            samples.append({"prompt_index": prompt_index, "sample_index": sample_index, **sample})
        return samples, prompt_logprobs(self.state, prompts) if params.prompt_logprobs else None

    def _add(self, request_id: str, prompt: Any, params: Any, lora: Any) -> None:
        self.engine.add_request(request_id, prompt, params, lora_request=lora)

    def _abort(self, request_ids: list[str]) -> None:
        self.engine.abort_request(request_ids)

    def _done(self, request_ids: list[str]) -> None:
        """A call's requests are over (finished or aborted)."""

    def _run(self, unfinished: set[str], should_cancel: Cancelled, take: Callable[[list[Any]], None]) -> None:
        """Step the engine, handing each step's outputs to `take`, until `unfinished` is empty."""
        while unfinished:
            if should_cancel():
                raise OperationError("cancelled", "the request was cancelled")
            take(self.engine.step())

    @staticmethod
    def _stop_on_text(request_id: str, text_stop: TextStop, tokens, logprobs, stop_ids: set[int]) -> bool:
        """Search the sample's new tokens for a stop string (up to a final stop token); cut it there."""
        row = tokens[request_id]
        limit = len(row) - 1 if row and row[-1] in stop_ids else len(row)
        end = text_stop.advance(row[:limit])
        if end is None:
            return False
        del row[end:]
        del logprobs[request_id][end:]
        return True

    def close(self) -> None:
        shutil.rmtree(self.scratch, ignore_errors=True)


def _token_logprob(entry: dict | None, token: int) -> float:
    """The logprob vLLM reports for `token` at one position (it always includes the sampled token)."""
    if entry is None or token not in entry:
        raise OperationError("operation_failed", f"vLLM returned no logprob for token {token}")
    return float(entry[token].logprob)
