"""Custom losses as data: a traced loss graph (the Tinker SDK's `CustomLossGraph`, plain JSON: no pickle, no
code) is accepted only if every node is an operation of the allow-list below, its inputs and size are
bounded, and every argument is a plain value or a reference to an earlier node. The engine
(`cortex_backend/engine/custom_loss.py`) rebuilds it from its own table of these names and nothing else.

Pure Python: the backend checks a graph before anything queues, the engine checks it again on arrival.
"""

from __future__ import annotations

import math
import re
from typing import Any

from .errors import ApiError
from .losses import LossSpec

CUSTOM_LOSS = "custom"
MAX_NODES = 512
MAX_INPUTS = 16  # logprobs included, as the SDK allows
SERVED_RANKS = (0, 1, 2)  # a scalar, one value per token ([T]) or K values per token ([T, K])
MAX_ARGUMENT_DEPTH = 6
MAX_ARGUMENT_ITEMS = 64
MAX_STRING = 64
RESERVED_INPUTS = frozenset({"input_ids", "attention_mask"})  # the frame's own tensors

# Functions (call_function targets, as the SDK names them on the wire): elementwise maths, reductions,
# comparisons and shape helpers on tensors. Nothing that reads or writes files, allocates by a size it is
# given, or runs Python.
ALLOWED_FUNCTIONS = frozenset(
    {f"operator.{name}" for name in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "neg", "pos")}
    | {f"operator.{name}" for name in ("abs", "getitem", "eq", "ne", "lt", "le", "gt", "ge")}
    | {f"operator.{name}" for name in ("and_", "or_", "xor", "invert", "matmul")}
    | {
        f"torch.{name}"
        for name in (
            "abs exp exp2 expm1 log log1p log2 log10 sqrt rsqrt square pow neg sign sigmoid tanh relu"
            " clamp clip clamp_min clamp_max minimum maximum where min max sum mean prod std var cumsum"
            " logsumexp softmax log_softmax add sub mul div true_divide isfinite isnan nan_to_num"
            " logical_and logical_or logical_not eq ne lt le gt ge stack cat zeros_like ones_like"
            " full_like numel squeeze unsqueeze flatten reshape transpose gather dot"
        ).split()
    }
    | {
        f"torch.nn.functional.{name}"
        for name in ("log_softmax", "softmax", "logsigmoid", "softplus", "relu", "silu", "sigmoid")
    }
    | {"builtins.getattr"}
)
# Tensor methods (call_method targets). No item/tolist/numpy (values leave torch), no backward, no in-place
# methods, no new_*/expand/repeat (memory by a size the graph names).
ALLOWED_METHODS = frozenset(
    (
        "abs exp expm1 log log1p sqrt rsqrt square pow neg sign sigmoid tanh relu clamp clip clamp_min"
        " clamp_max minimum maximum where min max sum mean prod std var cumsum logsumexp softmax"
        " log_softmax add sub mul div masked_fill isfinite nan_to_num eq ne lt le gt ge logical_and"
        " logical_or logical_not float double half bfloat16 long int bool to type_as detach size dim"
        " numel view reshape flatten squeeze unsqueeze transpose t gather any all"
    ).split()
)
# Attributes `getattr` may read, and only from a tensor.
ALLOWED_ATTRIBUTES = frozenset({"shape", "ndim", "dtype", "device", "T"})
DTYPES = frozenset({"float32", "float64", "float16", "bfloat16", "int64", "int32", "bool"})
LAYOUTS = frozenset({"strided"})
MEMORY_FORMATS = frozenset({"contiguous_format", "preserve_format"})
OPS = ("placeholder", "call_function", "call_method", "output")  # call_module and get_attr are refused

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
_INPUT_NAME = re.compile(r"[a-z_][a-z0-9_]{0,63}")
_METRIC_KEY = re.compile(r"custom/[a-z0-9_./-]{1,64}:(sum|mean)")
_FLOATS = {"inf", "-inf", "nan"}


def refused(message: str, node: str | None = None, field: str | None = None) -> ApiError:
    detail = {key: value for key, value in (("node", node), ("field", field)) if value is not None}
    return ApiError("custom_loss_refused", message, detail)


def validate_custom_loss(name: Any, inputs: Any, graph: Any) -> dict[str, Any]:
    """The loss as the engine runs it ({name, inputs, nodes, metrics}), or `custom_loss_refused` naming the
    first node (or field) that breaks a rule."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise refused(
            f"name: must be a Python identifier of at most 64 characters, got {name!r}", field="name"
        )
    checked_inputs = _inputs(inputs)
    if not isinstance(graph, dict) or graph.get("format") != 1 or not isinstance(graph.get("nodes"), list):
        raise refused("graph: must be {format: 1, nodes: [...]}", field="graph")
    nodes = graph["nodes"]
    if not 0 < len(nodes) <= MAX_NODES:
        raise refused(
            f"graph: has {len(nodes)} nodes; a custom loss has 1 to {MAX_NODES}", field="graph.nodes"
        )
    seen: set[str] = set()
    checked, metrics = [], []
    for index, node in enumerate(nodes):
        if not isinstance(node, dict) or set(node) - {"op", "name", "target", "args", "kwargs"}:
            raise refused(f"graph.nodes[{index}]: must be an object of op, name, target, args, kwargs")
        node_name, op, target = node.get("name"), node.get("op"), node.get("target")
        if not isinstance(node_name, str) or not _NAME.fullmatch(node_name) or node_name in seen:
            raise refused(f"graph.nodes[{index}]: name {node_name!r} is not a new identifier", field="name")
        where = f"node {node_name!r}"
        if not isinstance(target, str) or len(target) > 128:
            raise refused(f"{where}: target must be a string of at most 128 characters", node_name)
        args, kwargs = node.get("args", []), node.get("kwargs", {})
        if not isinstance(args, list) or not isinstance(kwargs, dict):
            raise refused(f"{where}: args must be a list and kwargs an object", node_name)
        for value in (*args, *kwargs.values()):
            _check_argument(value, seen, where, node_name, 0)
        if op == "placeholder":
            if index >= len(checked_inputs) or target != checked_inputs[index]["name"]:
                raise refused(
                    f"{where}: inputs are {[i['name'] for i in checked_inputs]}, taken first and in that order",
                    node_name,
                )
        elif index < len(checked_inputs):
            raise refused(f"{where}: the graph must start with its {len(checked_inputs)} inputs", node_name)
        elif op == "call_function":
            if target not in ALLOWED_FUNCTIONS:
                raise refused(
                    f"{where}: function {target!r} is not allowed in a custom loss (docs/tinker.md)",
                    node_name,
                )
            if target == "builtins.getattr" and (
                len(args) != 2 or not isinstance(args[1], str) or args[1] not in ALLOWED_ATTRIBUTES
            ):
                raise refused(
                    f"{where}: getattr may read only {sorted(ALLOWED_ATTRIBUTES)} of a tensor", node_name
                )
        elif op == "call_method":
            if target not in ALLOWED_METHODS:
                raise refused(
                    f"{where}: method {target!r} is not allowed in a custom loss (docs/tinker.md)", node_name
                )
            if not args or not _is_ref(args[0]):
                raise refused(f"{where}: a method is called on a value of the graph", node_name)
        elif op == "output":
            if index != len(nodes) - 1:
                raise refused(f"{where}: the output must be the last node", node_name)
            metrics = _check_output(args, where, node_name)
        else:
            raise refused(
                f"{where}: op {op!r} is not allowed; a custom loss calls torch functions and tensor methods only"
                " (no modules, no captured attributes)",
                node_name,
            )
        seen.add(node_name)
        checked.append({"op": op, "name": node_name, "target": target, "args": args, "kwargs": kwargs})
    if checked[-1]["op"] != "output":
        raise refused("graph: its last node must be the output", checked[-1]["name"])
    return {"name": name, "inputs": checked_inputs, "nodes": checked, "metrics": metrics}


def custom_loss_spec(loss: dict[str, Any]) -> LossSpec:
    """The LossSpec of one validated custom loss: the tensors its frame carries (rank-2 ones, and target_tokens
    under rank-2 logprobs, as [batch, length, K]) and the metrics it reports."""
    logprobs, *inputs = loss["inputs"]
    wide = ("target_tokens",) if logprobs["rank"] == 2 else ()
    return LossSpec(
        CUSTOM_LOSS,
        f"loss = sum over datums of {loss['name']}(logprobs, ...)",
        ("target_tokens", *(i["name"] for i in inputs if i["name"] != "target_tokens")),
        metrics=("loss:sum", *loss["metrics"]),
        wide=(*wide, *(i["name"] for i in inputs if i["rank"] == 2 and i["name"] != "target_tokens")),
    )


def _inputs(inputs: Any) -> list[dict[str, Any]]:
    if not isinstance(inputs, list) or not 1 <= len(inputs) <= MAX_INPUTS:
        raise refused(f"inputs: must list 1 to {MAX_INPUTS} inputs, logprobs first", field="inputs")
    checked, names = [], set()
    for i, item in enumerate(inputs):
        name, rank = (item.get("name"), item.get("rank")) if isinstance(item, dict) else (None, None)
        if (
            not isinstance(name, str)
            or not _INPUT_NAME.fullmatch(name)
            or name in names
            or name in RESERVED_INPUTS
        ):
            raise refused(
                f"inputs[{i}].name: {name!r} is not a new lowercase input name", field=f"inputs[{i}]"
            )
        if (i == 0) != (name == "logprobs"):
            raise refused("inputs: logprobs comes first, and only first", field=f"inputs[{i}]")
        if rank not in SERVED_RANKS or isinstance(rank, bool) or (i == 0 and rank == 0):
            raise refused(
                f"inputs[{i}].rank: {rank!r} is not served; inputs here are rank 0 (a scalar), 1 (one value"
                " per token) or 2 (K values per token), logprobs rank 1 or 2 (as its target_tokens)",
                field=f"inputs[{i}].rank",
            )
        if name == "target_tokens" and rank != checked[0]["rank"]:
            raise refused(
                f"inputs[{i}].rank: target_tokens has the rank of logprobs ({checked[0]['rank']}), got {rank!r}",
                field=f"inputs[{i}].rank",
            )
        names.add(name)
        checked.append({"name": name, "rank": rank})
    return checked


def _is_ref(value: Any) -> bool:
    return isinstance(value, dict) and set(value) == {"ref"}


def _check_argument(value: Any, seen: set[str], where: str, node: str, depth: int) -> None:
    """A plain value, or one of the SDK's one-key encodings; a `ref` names an earlier node."""
    if depth > MAX_ARGUMENT_DEPTH:
        raise refused(f"{where}: arguments nest deeper than {MAX_ARGUMENT_DEPTH}", node)
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, int):
        if abs(value) > 2**31:
            raise refused(f"{where}: integer {value} is out of range", node)
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise refused(f"{where}: a non-finite number travels as {{'float': 'inf'}}", node)
        return
    if isinstance(value, str):
        if len(value) > MAX_STRING:
            raise refused(f"{where}: strings are at most {MAX_STRING} characters", node)
        return
    if isinstance(value, list):
        if len(value) > MAX_ARGUMENT_ITEMS:
            raise refused(f"{where}: lists hold at most {MAX_ARGUMENT_ITEMS} items", node)
        for item in value:
            _check_argument(item, seen, where, node, depth + 1)
        return
    if not isinstance(value, dict) or len(value) != 1:
        raise refused(f"{where}: argument {str(value)[:80]!r} is not a value the SDK encodes", node)
    [(kind, inner)] = value.items()
    if kind == "ref":
        if inner not in seen:
            raise refused(f"{where}: refers to {inner!r}, which is no earlier node", node)
    elif kind == "tuple":
        _check_argument(inner if isinstance(inner, list) else object(), seen, where, node, depth)
    elif kind == "dict":
        if not isinstance(inner, dict) or len(inner) > MAX_ARGUMENT_ITEMS:
            raise refused(
                f"{where}: a dict argument must be an object of at most {MAX_ARGUMENT_ITEMS} keys", node
            )
        for item in inner.values():
            _check_argument(item, seen, where, node, depth + 1)
    elif kind == "slice":
        if not isinstance(inner, list) or len(inner) != 3:
            raise refused(f"{where}: a slice is [start, stop, step]", node)
        for item in inner:
            _check_argument(item, seen, where, node, depth + 1)
    elif kind == "ellipsis":
        if inner is not True:
            raise refused(f"{where}: ellipsis must be true", node)
    elif kind == "float":
        if inner not in _FLOATS:
            raise refused(f"{where}: float must be one of {sorted(_FLOATS)}", node)
    elif kind == "dtype":
        if inner not in DTYPES:
            raise refused(f"{where}: dtype {inner!r} is not one of {sorted(DTYPES)}", node)
    elif kind == "device":
        if not isinstance(inner, str) or not re.fullmatch(r"(cpu|cuda)(:\d{1,2})?", inner):
            raise refused(f"{where}: device {inner!r} is not cpu or cuda", node)
    elif kind == "layout":
        if inner not in LAYOUTS:
            raise refused(f"{where}: layout {inner!r} is not allowed", node)
    elif kind == "memory_format":
        if inner not in MEMORY_FORMATS:
            raise refused(f"{where}: memory_format {inner!r} is not allowed", node)
    else:
        raise refused(f"{where}: argument kind {kind!r} is not one the SDK encodes", node)


def _check_output(args: list[Any], where: str, node: str) -> list[str]:
    """(loss, metrics): a node, and a dict of metric names (custom/<name>:sum|mean) to nodes."""
    result = args[0] if len(args) == 1 else None
    items = result.get("tuple") if isinstance(result, dict) else result
    if not isinstance(items, list) or len(items) != 2 or not _is_ref(items[0]):
        raise refused(f"{where}: the loss must return (loss, metrics)", node)
    metrics = items[1].get("dict") if isinstance(items[1], dict) else None
    if not isinstance(metrics, dict):
        raise refused(f"{where}: metrics must be a dict", node)
    for key, value in metrics.items():
        if not _METRIC_KEY.fullmatch(key) or not _is_ref(value):
            raise refused(
                f"{where}: metric {key!r} must be named custom/<name>:sum or :mean and be a tensor", node
            )
    return sorted(metrics)
