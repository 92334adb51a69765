"""The operations a worker serves, each described once.

The data plane takes its default targets, what each sub-job type serves and the frame operations from here, the worker its dispatch table
(a method named after each operation), and the data plane its payload checks (`RequestManager.prepare`,
one method per operation that needs one). Adding an operation is one `Operation` here, one worker method
and, if its payload needs checking, one preparer.
"""

from __future__ import annotations

from dataclasses import dataclass

from cortex_nb.protocol import states

_ALL = (states.TRAINING, states.SAMPLING, states.LOG_PROBABILITY)


@dataclass(frozen=True)
class Operation:
    name: str
    # Which sub-job serves it when the caller names none, in order of preference; empty for an operation
    # only the service queues (a managed loop, a weight-sync target's side).
    targets: tuple[str, ...] = ()
    # The request body is a binary tensor frame (checked off the IO loop when large).
    frame: bool = False
    # The worker brings its sampling engine up to the adapter's current weights first.
    reads_merged_weights: bool = False
    # It waits for another sub-job's messages (a weight sync's two sides wait for each other), so on an
    # adapter host it runs without the compute turn: both sides may be slots of one host.
    waits_on_peers: bool = False


CATALOG: dict[str, Operation] = {
    operation.name: operation
    for operation in (
        Operation("noop", _ALL),
        Operation("reset_prefix_cache", (states.SAMPLING, states.TRAINING)),
        Operation("forward_backward", (states.TRAINING,), frame=True),
        Operation("step", (states.TRAINING,)),
        Operation("generate", (states.SAMPLING, states.TRAINING)),
        Operation(
            "forward",
            (states.LOG_PROBABILITY, states.TRAINING, states.SAMPLING),
            frame=True,
            reads_merged_weights=True,
        ),
        Operation("save", (states.TRAINING,)),
        Operation("load", _ALL),
        # weight_sync's source is chosen by WeightSyncCoordinator.source; the targets name its default
        Operation("weight_sync", (states.TRAINING,), waits_on_peers=True),
        Operation("weight_sync_apply", waits_on_peers=True),
        Operation("train_loop"),
    )
}
# Which sub-job serves an operation a client sends without naming one.
DEFAULT_TARGETS: dict[str, tuple[str, ...]] = {
    name: operation.targets for name, operation in CATALOG.items() if operation.targets
}
FRAME_OPERATIONS = frozenset(name for name, operation in CATALOG.items() if operation.frame)
# Which operations a sub-job of each type serves when a client names it (its targets, read the other way).
SERVED_BY_TYPE: dict[str, frozenset[str]] = {
    sub_type: frozenset(name for name, operation in CATALOG.items() if sub_type in operation.targets)
    for sub_type in states.SUB_JOB_TYPES
}


def reads_merged_weights(name: str) -> bool:
    operation = CATALOG.get(name)
    return operation is not None and operation.reads_merged_weights


def waits_on_peers(name: str) -> bool:
    operation = CATALOG.get(name)
    return operation is not None and operation.waits_on_peers
