"""Weight sync between workers: the trainer (source) and each sampler (target), relayed by the service.

Each side runs as an operation in its own sub-job's queue, so a sync happens at the same point of
every participant's first-in-first-out order: requests queued before it see the old weights,
requests queued after it the new ones. The exchange, for one sync `R`:

    target -> source   base     {hash, layout, weight_version}   what the target holds now
    source -> target   payload  {payload: delta|full, result_hash, weight_version} + compressed frame
    target -> source   verdict  {applied, hash | reason}
    (a delta the target rejects is followed by a full payload, then another verdict)

The source knows a few weight states by their hash (its initial adapter, which seeded samplers share,
and what each target last accepted); a target whose base hash is one of them gets a delta, any other
gets the full tensors. A target applies nothing unless the state it would hold has `result_hash`.
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict, defaultdict, deque
from collections.abc import Callable
from typing import Any

import torch

from ..faults import Faults
from .adapter import adapter_parameters, as_stored, assign, layout, snapshot, tensor_hash
from .errors import OperationError
from .model_state import ModelState
from .weight_codec import (
    Payload,
    PayloadError,
    apply_delta,
    decode_delta,
    decode_full,
    delta_values,
    encode_delta,
    encode_full,
)

BASE_WAIT_S = 1800.0  # a target may first finish the requests queued ahead of the sync
VERDICT_WAIT_S = 600.0
MAX_KNOWN_STATES = 8

Send = Callable[[str, str, dict[str, Any], bytes], None]


class SyncMailbox:
    """Sync messages for this worker, filed by sync id as the reader thread receives them."""

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._boxes: dict[str, list[tuple[dict[str, Any], bytes]]] = defaultdict(list)
        self._closed: deque[str] = deque(maxlen=1024)

    def put(self, header: dict[str, Any], blob: bytes) -> None:
        with self._condition:
            if header.get("request_id") in self._closed:
                return
            self._boxes[header["request_id"]].append((header, blob))
            self._condition.notify_all()

    def take(
        self, sync_id: str, senders: set[str], timeout_s: float, cancelled: Callable[[], bool]
    ) -> tuple[dict[str, Any], bytes]:
        """The next message for `sync_id` from one of `senders`; raises on cancel or timeout."""
        deadline = time.monotonic() + timeout_s
        with self._condition:
            while True:
                box = self._boxes[sync_id]
                for index, (header, blob) in enumerate(box):
                    if header.get("from") in senders:
                        del box[index]
                        return header, blob
                if cancelled():
                    raise OperationError("cancelled", "the weight sync was cancelled")
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise OperationError(
                        "weight_sync_timeout", f"no answer from {sorted(senders)} within {timeout_s:.0f} s"
                    )
                self._condition.wait(min(remaining, 0.1))

    def close(self, sync_id: str) -> None:
        with self._condition:
            self._boxes.pop(sync_id, None)
            self._closed.append(sync_id)


def _max_abs_error(result: dict[str, torch.Tensor], exact: dict[str, torch.Tensor]) -> float:
    return max(
        (float((result[name] - exact[name].float()).abs().max()) for name in exact if exact[name].numel()),
        default=0.0,
    )


class SyncSource:
    """The trainer's side: remembers weight states by hash and sends each target a delta or the full tensors."""

    def __init__(self, state: ModelState) -> None:
        self.state = state
        initial = snapshot(state.model)
        self.initial_hash = tensor_hash(initial)
        self.known: OrderedDict[str, dict[str, torch.Tensor]] = OrderedDict({self.initial_hash: initial})
        self.held: dict[str, str] = {}  # target sub-job -> hash of what it accepted last

    def _remember(self, target: str, digest: str, tensors: dict[str, torch.Tensor]) -> None:
        self.held[target] = digest
        self.known[digest] = tensors
        self.known.move_to_end(digest)
        keep = {self.initial_hash, *self.held.values()}
        for old in [d for d in self.known if d not in keep]:
            if len(self.known) <= MAX_KNOWN_STATES:
                break
            del self.known[old]

    def run(
        self,
        sync_id: str,
        targets: list[str],
        weight_format: str,
        step: int,
        mailbox: SyncMailbox,
        send: Send,
        cancelled: Callable[[], bool],
    ) -> dict[str, Any]:
        started = time.perf_counter()
        current = snapshot(self.state.model)
        current_hash = tensor_hash(current)
        own_layout = layout(self.state.model)
        reports: dict[str, dict[str, Any]] = {}
        errors: dict[str, str] = {}
        plans: dict[str, dict[str, Any]] = {}
        payloads: dict[str, tuple[Payload, dict[str, torch.Tensor]]] = {}

        waiting = set(targets)
        while waiting:
            header, _ = mailbox.take(sync_id, waiting, BASE_WAIT_S, cancelled)
            target = header["from"]
            waiting.discard(target)
            if header["kind"] != "base":
                errors[target] = header.get("reason", "the target failed before reporting its weights")
                continue
            target_layout = header["layout"]
            if {n: v["shape"] for n, v in target_layout.items()} != {
                n: v["shape"] for n, v in own_layout.items()
            }:
                errors[target] = "its adapter has other tensors or shapes than the trainer's"
                send(target, "abort", {"reason": errors[target]}, b"")
                continue
            dtypes = {name: value["dtype"] for name, value in target_layout.items()}
            plan = {
                "base_hash": header["hash"],
                "dtypes": dtypes,
                "bytes": 0,
                "raw_bytes": 0,
                "fallback_reason": None,
                "encodings": {},
                "started": time.perf_counter(),
            }
            plans[target] = plan
            # A target may also hold exactly the trainer's current weights (it loaded the latest checkpoint).
            base = current if header["hash"] == current_hash else self.known.get(header["hash"])
            if weight_format == "full":
                self._send(target, plan, "full", current, None, payloads, step, send)
            elif base is None:
                plan["fallback_reason"] = (
                    "base_mismatch: the target's weights are not a state this trainer holds, sent or started from"
                )
                self._send(target, plan, "full", current, None, payloads, step, send)
            else:
                try:
                    self._send(target, plan, "delta", current, (header["hash"], base), payloads, step, send)
                except PayloadError as exc:
                    plan["fallback_reason"] = f"delta_error: {exc}"
                    self._send(target, plan, "full", current, None, payloads, step, send)

        waiting = set(plans)
        while waiting:
            header, _ = mailbox.take(sync_id, waiting, VERDICT_WAIT_S, cancelled)
            target = header["from"]
            plan = plans[target]
            if header["kind"] == "verdict" and header.get("applied"):
                waiting.discard(target)
                self._remember(target, plan["result_hash"], plan["expected"])
                reports[target] = self._report(target, plan, current)
            elif header["kind"] == "verdict" and not header.get("fatal") and plan["path"] == "delta":
                plan["fallback_reason"] = f"delta_rejected: {header.get('reason')}"
                self._send(target, plan, "full", current, None, payloads, step, send)
            else:
                waiting.discard(target)
                errors[target] = header.get("reason", "the target refused the full weights")
        if errors:
            done = ", ".join(sorted(reports)) or "none"
            failed = "; ".join(f"{target}: {reason}" for target, reason in sorted(errors.items()))
            raise OperationError("weight_sync_failed", f"weight sync failed for {failed} (synced: {done})")
        elapsed_ms = (time.perf_counter() - started) * 1000
        paths = {report["path"] for report in reports.values()}
        return {
            "source_hash": current_hash,
            "weight_version": step,
            "format": weight_format,
            "path": paths.pop() if len(paths) == 1 else "mixed",
            "bytes": sum(report["bytes"] for report in reports.values()),
            "ms": elapsed_ms,
            "targets": [reports[target] for target in targets],
        }

    def _send(
        self,
        target: str,
        plan: dict[str, Any],
        path: str,
        current: dict[str, torch.Tensor],
        base: tuple[str, dict[str, torch.Tensor]] | None,
        payloads: dict,
        step: int,
        send: Send,
    ) -> None:
        """Build (or reuse) the payload for `target` and send it; raises PayloadError for a delta that cannot be built."""
        key = json.dumps([path, base[0] if base else None, plan["dtypes"]], sort_keys=True)
        if key not in payloads:
            if path == "delta":
                deltas = delta_values(base[1], current)
                payload = encode_delta(deltas)
                expected = as_stored(apply_delta(base[1], deltas), plan["dtypes"])
            else:
                payload = encode_full(current)
                expected = as_stored(current, plan["dtypes"])
            payloads[key] = (payload, expected)
        payload, expected = payloads[key]
        plan.update(path=path, expected=expected, result_hash=tensor_hash(expected))
        plan["bytes"] += len(payload.data)
        plan["raw_bytes"] += payload.raw_bytes
        plan["encodings"] = dict(payload.encodings)
        send(
            target,
            "payload",
            {"payload": path, "result_hash": plan["result_hash"], "weight_version": step},
            payload.data,
        )

    def _report(self, target: str, plan: dict[str, Any], current: dict[str, torch.Tensor]) -> dict[str, Any]:
        return {
            "sub_job_id": target,
            "path": plan["path"],
            "fallback_reason": plan["fallback_reason"],
            "bytes": plan["bytes"],
            "raw_bytes": plan["raw_bytes"],
            "compression_ratio": plan["raw_bytes"] / plan["bytes"] if plan["bytes"] else None,
            "encodings": plan["encodings"],
            "base_hash": plan["base_hash"],
            "result_hash": plan["result_hash"],
            "max_abs_error": _max_abs_error(plan["expected"], current),
            "ms": (time.perf_counter() - plan["started"]) * 1000,
        }


def _corrupt_one_weight(state: ModelState) -> None:
    """The `corrupt_sync_base` fault: a weight changes under the sampler (as a bad memory bit would)."""
    parameters = adapter_parameters(state.model)
    with torch.no_grad():
        parameters[sorted(parameters)[0]].view(-1)[0] += 0.5


def run_target(
    state: ModelState,
    sync_id: str,
    source: str,
    mailbox: SyncMailbox,
    send: Send,
    cancelled: Callable[[], bool],
    faults: Faults,
) -> dict[str, Any]:
    """The sampler's side: report what it holds, then apply a payload only if its result hash matches."""
    try:
        if faults.active("corrupt_sync_base"):
            _corrupt_one_weight(state)
        current = snapshot(state.model)
        own_layout = layout(state.model)
        dtypes = {name: value["dtype"] for name, value in own_layout.items()}
        send(
            source,
            "base",
            {"hash": tensor_hash(current), "layout": own_layout, "weight_version": state.weight_version},
            b"",
        )
        while True:
            header, blob = mailbox.take(sync_id, {source}, BASE_WAIT_S, cancelled)
            if header["kind"] == "abort":
                raise OperationError(
                    "weight_sync_failed", header.get("reason", "the trainer aborted the sync")
                )
            try:
                if header["payload"] == "delta":
                    if faults.active("corrupt_sync_bytes"):
                        blob = (
                            blob[: len(blob) // 2]
                            + bytes([blob[len(blob) // 2] ^ 0xFF])
                            + blob[len(blob) // 2 + 1 :]
                        )
                    deltas = decode_delta(blob)
                    if faults.active("corrupt_sync_delta"):
                        first = deltas[sorted(deltas)[0]].reshape(-1)
                        first[0] = first[0] + 1.0
                    new = apply_delta(current, deltas)
                else:
                    new = decode_full(blob)
                    if faults.active("corrupt_sync_full"):
                        first = new[sorted(new)[0]].reshape(-1)
                        first[0] = first[0] + 1.0
                    if set(new) != set(current) or any(new[n].shape != current[n].shape for n in new):
                        raise PayloadError("the full payload names other tensors or shapes")
                result = as_stored(new, dtypes)
                digest = tensor_hash(result)
                if digest != header["result_hash"]:
                    raise PayloadError(
                        f"result hash mismatch: got {digest[:16]}, the trainer sent {header['result_hash'][:16]}"
                    )
            except PayloadError as exc:
                send(source, "verdict", {"applied": False, "reason": str(exc)}, b"")
                continue
            assign(state.model, result)
            state.weight_version = int(header["weight_version"])
            send(source, "verdict", {"applied": True, "hash": digest}, b"")
            return {
                "applied": header["payload"],
                "weight_version": state.weight_version,
                "state_hash": digest,
            }
    except OperationError as exc:
        if exc.code != "cancelled":
            send(source, "verdict", {"applied": False, "fatal": True, "reason": exc.message}, b"")
        raise
    except Exception as exc:
        send(
            source,
            "verdict",
            {"applied": False, "fatal": True, "reason": f"{type(exc).__name__}: {exc}"},
            b"",
        )
        raise
    finally:
        mailbox.close(sync_id)
