"""Runs a validated custom loss (cortex_nb/protocol/custom_loss.py) on the trainer: the graph is interpreted node
by node, each name looked up in this module's own table (built from the allow-list, checked at import), so
nothing the client sent is ever imported, evaluated or unpickled.

Per datum, as the SDK runs it client-side: the loss takes the datum's logprobs and inputs, cut to its length
([T], or [T, K] for rank-2 ones: logprobs are [T, K] when target_tokens is);
losses sum over datums; a `:sum` metric sums and a `:mean` metric averages over datums. A dry run on the
`meta` device first checks every intermediate's size, so a graph cannot allocate more than a bound.
"""

from __future__ import annotations

import operator
from typing import Any

import torch

from cortex_nb.protocol.custom_loss import ALLOWED_ATTRIBUTES, ALLOWED_FUNCTIONS, ALLOWED_METHODS, DTYPES

from .errors import OperationError

# The most elements any value of the graph may hold: room for a [T, T] matrix at T = 4096.
MAX_ELEMENTS = 1 << 24
Tensors = dict[str, torch.Tensor]


def _resolve(name: str) -> Any:
    if name == "builtins.getattr":
        return _tensor_attribute
    module, _, attribute = name.partition(".")
    found: Any = {"operator": operator, "torch": torch}[module]
    for part in attribute.split("."):
        found = getattr(found, part)
    return found


def _tensor_attribute(value: Any, attribute: str) -> Any:
    if not isinstance(value, torch.Tensor) or attribute not in ALLOWED_ATTRIBUTES:
        raise TypeError(f"getattr reads only {sorted(ALLOWED_ATTRIBUTES)} of a tensor")
    return getattr(value, attribute)


FUNCTIONS = {name: _resolve(name) for name in ALLOWED_FUNCTIONS}
_missing_methods = sorted(name for name in ALLOWED_METHODS if not hasattr(torch.Tensor, name))
if _missing_methods:
    raise ImportError(f"the custom-loss allow-list names tensor methods torch lacks: {_missing_methods}")


def _decode(value: Any, env: dict[str, Any], device: torch.device) -> Any:
    if isinstance(value, list):
        return [_decode(item, env, device) for item in value]
    if not isinstance(value, dict):
        return value
    [(kind, inner)] = value.items()
    if kind == "ref":
        return env[inner]
    if kind == "tuple":
        return tuple(_decode(item, env, device) for item in inner)
    if kind == "dict":
        return {key: _decode(item, env, device) for key, item in inner.items()}
    if kind == "slice":
        return slice(*(_decode(item, env, device) for item in inner))
    if kind == "ellipsis":
        return Ellipsis
    if kind == "float":
        return float(inner)
    if kind == "dtype" and inner in DTYPES:
        return getattr(torch, inner)
    if kind == "device":
        return device  # the loss runs where the trainer does, whatever device it was traced for
    if kind == "layout":
        return torch.strided
    if kind == "memory_format":
        return getattr(torch, inner)
    raise ValueError(f"argument kind {kind!r}")


def run_graph(
    loss: dict[str, Any], values: list[torch.Tensor]
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """One datum: the graph's (loss, metrics) for its inputs, in order."""
    env: dict[str, Any] = {}
    device = values[0].device
    for node in loss["nodes"]:
        name, op, target = node["name"], node["op"], node["target"]
        try:
            if op == "placeholder":
                result: Any = values[len(env)]
            elif op == "output":
                found, metrics = _decode(node["args"][0], env, device)
                return found, metrics
            else:
                args = _decode(node["args"], env, device)
                kwargs = {key: _decode(value, env, device) for key, value in node["kwargs"].items()}
                if op == "call_function":
                    result = FUNCTIONS[target](*args, **kwargs)
                else:
                    if not isinstance(args[0], torch.Tensor) or target not in ALLOWED_METHODS:
                        raise TypeError(
                            f"method {target} is called on a {type(args[0]).__name__}, not a tensor"
                        )
                    result = getattr(args[0], target)(*args[1:], **kwargs)
            if isinstance(result, torch.Tensor) and result.numel() > MAX_ELEMENTS:
                raise ValueError(
                    f"its result has {result.numel():,} elements; at most {MAX_ELEMENTS:,} are allowed"
                )
        except OperationError:
            raise
        except Exception as exc:
            raise OperationError(
                "custom_loss_failed",
                f"custom loss {loss['name']!r} failed at node {name!r} ({target}): {exc}",
            ) from None
        env[name] = result
    raise OperationError("custom_loss_failed", f"custom loss {loss['name']!r} has no output")


def _datum_values(
    loss: dict[str, Any], logprobs: torch.Tensor, tensors: Tensors, row: int, length: int
) -> list[torch.Tensor]:
    """One datum's logprobs and inputs as the SDK hands them to the loss: rank 1 cut to [length], rank 2 (a
    [B, T, K] tensor, K values per position) to [length, K], rank 0 its scalar."""
    values = [logprobs[row, :length]]
    for spec in loss["inputs"][1:]:
        tensor = tensors[spec["name"]][row]
        values.append(tensor[0] if spec["rank"] == 0 else tensor[:length])
    return values


def custom_loss(
    logprobs: torch.Tensor, tensors: Tensors, loss: dict[str, Any]
) -> tuple[torch.Tensor, dict[str, float]]:
    """The summed loss over the batch's datums and its metrics: `loss:sum` as the built-in losses report it,
    and the graph's own `custom/...` metrics reduced as their suffix says."""
    rows = logprobs.shape[0]
    mask = tensors.get("attention_mask")
    lengths = [int(mask[row].sum()) if mask is not None else logprobs.shape[1] for row in range(rows)]
    # A dry run without memory: every value's shape, for the longest datum.
    longest = max(range(rows), key=lambda row: lengths[row])
    meta = {name: tensor.to("meta") for name, tensor in tensors.items()}
    run_graph(loss, _datum_values(loss, logprobs.detach().to("meta"), meta, longest, lengths[longest]))
    total: torch.Tensor | None = None
    sums: dict[str, float] = {}
    for row in range(rows):
        found, metrics = run_graph(loss, _datum_values(loss, logprobs, tensors, row, lengths[row]))
        if not isinstance(found, torch.Tensor) or found.ndim != 0:
            raise OperationError(
                "custom_loss_failed", f"custom loss {loss['name']!r} must return a scalar loss tensor"
            )
        total = found if total is None else total + found
        for key, value in metrics.items():
            if not isinstance(value, torch.Tensor) or value.numel() != 1:
                raise OperationError(
                    "custom_loss_failed",
                    f"custom loss {loss['name']!r}: metric {key!r} must be a scalar tensor",
                )
            sums[key] = sums.get(key, 0.0) + float(value.detach().item())
    assert total is not None
    reported = {key: value / rows if key.endswith(":mean") else value for key, value in sums.items()}
    return total.float(), {"loss:sum": float(total.item()), **reported}
