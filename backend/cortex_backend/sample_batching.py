"""Concurrent `generate` requests on one sub-job, run as one engine pass (issue 29).

The worker serves its queue in submission order. When it takes a `generate`, the generates queued right
behind it that are compatible are taken too (and, while the sub-job sees bursts, those arriving within a
short gap: `GenerateGatherer`) and sampled in one pass of the engine, then each gets its own result. Only
the unbroken run at the head of the queue is taken: a generate queued behind a `step`, a `load` or a sync
must see the weights those leave, so order is kept across every other operation.

Compatible means everything but the prompts and the seed is the same:
- the same weights: the same `adapter` (none, "base", or one saved checkpoint), on a sub-job whose engine
  batches requests (the built-in `transformers` engine; vLLM's requests run one at a time);
- the same sampling params apart from `seed`, `n` included (one pass draws the same number of samples
  for every prompt);
- not streamed, and asking for no prompt scores (`prompt_logprobs`, `prompt_logprobs_topk`,
  `prompt_logprobs_targets`, `prompt_alt_tokens_k`) nor routes (`record_routes`): those come from extra
  forwards over one request's prompts or samples;
- not cancelled while queued, and all rows fit in one decoding pass of the engine.

Each request keeps its own seed (a sampled request without one gets its own random seed, as alone) and
draws from its own generator, so greedy and seeded requests give the tokens they give alone; seed, weight
version and token counts are the same too. Logprobs agree to float rounding (about 1e-6 in fp32), not bit
for bit: a batch of other lengths rounds the same sums in another order.
"""

from __future__ import annotations

import json
import queue
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from cortex_nb.protocol.schemas.sampling import SamplingParams

from . import worker_messages as messages

if TYPE_CHECKING:  # the engine imports torch: a worker says hello before it does (worker_process.py)
    from .engine.sampling_interface import SamplingEngine

Queued = tuple[messages.Request, bytes]
# Params that make a generate run alone (see the module docstring).
_ALONE_PARAMS = (
    "prompt_logprobs",
    "prompt_logprobs_topk",
    "prompt_logprobs_targets",
    "prompt_alt_tokens_k",
    "record_routes",
)


def batch_key(request: messages.Request) -> str | None:
    """What two generates must share to run in one pass; None for one that always runs alone."""
    params = request.params or {}
    if request.op != "generate" or params.get("stream"):
        return None
    sampling = params.get("sampling_params") or {}
    if any(sampling.get(name) not in (None, False, 0) for name in _ALONE_PARAMS):
        return None
    shared = {key: value for key, value in sampling.items() if key != "seed"}
    return json.dumps({"adapter": params.get("adapter"), "sampling": shared}, sort_keys=True)


class GenerateGatherer:
    """Takes, for a generate the worker is about to run, the compatible generates to run with it.

    Those already queued behind it are always taken. A burst of concurrent requests reaches the worker
    spread over some milliseconds, so the first of a burst would otherwise run alone and the rest in a
    second pass (twice the time of one pass). So, while the sub-job is seeing bursts (a pass in the last
    `BURST_MEMORY_S` seconds ran several requests), the gatherer also waits for more, as long as each
    next one arrives within `GAP_S` of the last (at most `MAX_WAIT_S` in all). A sub-job sampled one
    request at a time never waits.
    """

    GAP_S = 0.025
    MAX_WAIT_S = 0.2
    BURST_MEMORY_S = 30.0

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.last_burst = float("-inf")

    def take(
        self,
        requests: queue.Queue[Queued | None],
        first: messages.Request,
        engine: SamplingEngine | None,
        cancelled: set[str],
    ) -> list[Queued]:
        """Take off the head of `requests` the generates that can run in one pass with `first`."""
        if engine is None or not engine.batches_requests:
            return []
        key = batch_key(first)
        if key is None:
            return []
        params = SamplingParams.model_validate(first.params["sampling_params"])
        prompts = list(first.params["prompt_tokens"])
        waiting = self.clock() - self.last_burst < self.BURST_MEMORY_S
        deadline = self.clock() + self.MAX_WAIT_S
        taken: list[Queued] = []
        # queue.Queue has no peek: look at its deque under its own lock and take only from the head, so
        # the reader thread (which only appends) and submission order are both undisturbed.
        with requests.not_empty:
            while True:
                if not requests.queue:
                    gap = min(self.GAP_S, deadline - self.clock())
                    if not waiting or gap <= 0 or not requests.not_empty.wait(gap):
                        break
                    continue
                item = requests.queue[0]
                if item is None:
                    break
                request = item[0]
                if request.request_id in cancelled or batch_key(request) != key:
                    break
                more = prompts + list(request.params["prompt_tokens"])
                if len(more) * params.n > engine.rows_in_one_pass(more, params):
                    break
                requests.queue.popleft()
                prompts = more
                taken.append(item)
        if taken:
            self.last_burst = self.clock()
        return taken


def generate_together(
    engine: SamplingEngine, requests: list[messages.Request], should_cancel: Callable[[], bool]
) -> list[dict[str, Any]]:
    """Each request's `generate` result, all sampled in one engine pass."""
    from .engine.sampling_interface import resolve_seed

    params = SamplingParams.model_validate(requests[0].params["sampling_params"])
    seeds = [
        resolve_seed(SamplingParams.model_validate(request.params["sampling_params"])) for request in requests
    ]
    started = time.perf_counter()
    engine.refresh()
    per_request = engine.sample_requests(
        [request.params["prompt_tokens"] for request in requests], seeds, params, should_cancel
    )
    elapsed = time.perf_counter() - started
    return [
        engine.result_of(samples, seed, elapsed) for samples, seed in zip(per_request, seeds, strict=True)
    ]
