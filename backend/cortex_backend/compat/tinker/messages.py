"""The Tinker SDK's protobuf messages that cross this face (tinker/proto/tinker_public.proto, by field number):
ForwardBackwardRequest in, ForwardBackwardOutput and SampleResponse out. The SDK sends forward_backward
only as protobuf and reads those two results only as protobuf; everything else is JSON.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from cortex_nb.protocol.errors import ApiError

from .protobuf_wire import Writer, as_double, as_signed, field_budget, packed_varints, parse

CONTENT_TYPE = "application/x-protobuf"
# tinker_public.DType and StopReason
DTYPE_FLOAT32, DTYPE_INT64, DTYPE_INT32 = 1, 2, 3
NUMPY_DTYPES = {DTYPE_FLOAT32: np.float32, DTYPE_INT64: np.int64, DTYPE_INT32: np.int32}
STOP_REASONS = {"stop": 0, "length": 1}
# The most values one tensor may hold once dense (a sparse tensor names its shape: a few bytes could ask for
# terabytes). Far above what a body of the largest size could fill with tokens.
MAX_TENSOR_VALUES = 64 * 1024 * 1024
# Fields one ForwardBackwardRequest may hold, all levels together: the SDK sends at most 1,024 datums a
# request, each a few dozen fields.
MAX_FIELDS = 256 * 1024


@dataclass
class Datum:
    """One example: its token chunks (only text chunks are supported) and named loss inputs. Provenance spans
    (which sampled sequence each token came from) only matter to stable_reinforce, which is not offered: skipped."""

    tokens: np.ndarray
    loss_fn_inputs: dict[str, np.ndarray]


@dataclass
class ForwardBackwardRequest:
    model_id: str
    seq_id: int
    loss_fn: str
    loss_fn_config: dict[str, float | str] = field(default_factory=dict)
    forward_only: bool = False
    data: list[Datum] = field(default_factory=list)


def _one(fields: dict, number: int, default=None):
    values = fields.get(number)
    return values[-1] if values else default


def _text(fields: dict, number: int) -> str:
    value = _one(fields, number, b"")
    try:
        return value.decode()
    except (AttributeError, UnicodeDecodeError):
        raise ApiError("invalid_request", f"protobuf field {number} must be a UTF-8 string") from None


def _ints(fields: dict, number: int) -> list[int]:
    out: list[int] = []
    for value in fields.get(number, []):
        out.extend(packed_varints(value) if isinstance(value, bytes) else [value])
    return [as_signed(v) for v in out]


def _array(data: bytes, dtype: np.dtype, what: str) -> np.ndarray:
    if len(data) % np.dtype(dtype).itemsize:
        raise ApiError(
            "invalid_batch",
            f"{what}: {len(data)} bytes is not a whole number of {np.dtype(dtype).name} values",
        )
    return np.frombuffer(data, dtype=dtype)


def decode_tensor(data: bytes, what: str) -> np.ndarray:
    """A `Tensor` (dense or sparse CSR with 0 as the implicit value), as a numpy array of its shape."""
    fields = parse(data)
    dtype = NUMPY_DTYPES.get(_one(fields, 3, 0))
    if dtype is None:
        raise ApiError("invalid_batch", f"{what}: dtype {_one(fields, 3, 0)} is not float32, int64 or int32")
    shape = _ints(fields, 4)
    if any(d < 0 for d in shape) or math.prod(shape) > MAX_TENSOR_VALUES:
        raise ApiError(
            "invalid_batch", f"{what}: shape {shape[:8]} is negative or holds over {MAX_TENSOR_VALUES} values"
        )
    if _one(fields, 2) is not None:
        csr = parse(_one(fields, 2))
        values = _array(_one(csr, 1, b""), dtype, what)
        rows = _array(_one(csr, 2, b""), np.int64, f"{what} crow_indices")
        cols = _array(_one(csr, 3, b""), np.int64, f"{what} col_indices")
        if (
            len(shape) != 2
            or len(rows) != shape[0] + 1
            or len(cols) != len(values)
            or (len(rows) and rows[-1] != len(values))
        ):
            raise ApiError("invalid_batch", f"{what}: its sparse CSR layout does not fit shape {shape}")
        if len(cols) and (cols.min() < 0 or cols.max() >= shape[1]) or np.any(np.diff(rows) < 0):
            raise ApiError("invalid_batch", f"{what}: its sparse CSR indices fall outside shape {shape}")
        dense = np.zeros(shape, dtype=dtype)
        dense[np.repeat(np.arange(shape[0]), np.diff(rows)), cols] = values
        return dense
    values = _array(_one(fields, 1, b""), dtype, what)
    if shape:
        if int(np.prod(shape)) != values.size:
            raise ApiError("invalid_batch", f"{what}: {values.size} values do not fill shape {shape}")
        values = values.reshape(shape)
    return values


def _decode_datum(data: bytes, index: int) -> Datum:
    fields = parse(data)
    pieces = []
    for chunk_bytes in fields.get(1, []):
        chunk = parse(chunk_bytes)
        if _one(chunk, 1) is None:
            kind = (
                "an image"
                if _one(chunk, 2) is not None
                else "an audio (dmel)"
                if _one(chunk, 3) is not None
                else "an empty"
            )
            raise ApiError(
                "unsupported_operation",
                f"data[{index}].model_input holds {kind} chunk; this backend takes text tokens only",
            )
        pieces.append(_array(_one(parse(_one(chunk, 1)), 1, b""), np.int32, f"data[{index}].model_input"))
    tokens = np.concatenate(pieces).astype(np.int64) if pieces else np.zeros(0, dtype=np.int64)
    inputs = {}
    for entry in fields.get(2, []):
        pair = parse(entry)
        name = _text(pair, 1)
        inputs[name] = decode_tensor(_one(pair, 2, b""), f"data[{index}].loss_fn_inputs.{name}")
    return Datum(tokens, inputs)


def decode_forward_backward(body: bytes) -> ForwardBackwardRequest:
    with field_budget(MAX_FIELDS):
        return _decode_forward_backward(body)


def _decode_forward_backward(body: bytes) -> ForwardBackwardRequest:
    fields = parse(body)
    config: dict[str, float | str] = {}
    for entry in fields.get(5, []):
        pair = parse(entry)
        config[_text(pair, 1)] = as_double(_one(pair, 2, 0))
    for entry in fields.get(7, []):  # v2 wins where both are set
        pair = parse(entry)
        value = parse(_one(pair, 2, b""))
        config[_text(pair, 1)] = (
            _text(value, 2) if _one(value, 2) is not None else as_double(_one(value, 1, 0))
        )
    return ForwardBackwardRequest(
        model_id=_text(fields, 1),
        seq_id=as_signed(_one(fields, 2, 0)),
        loss_fn=_text(fields, 4),
        loss_fn_config=config,
        forward_only=bool(_one(fields, 6, 0)),
        data=[_decode_datum(datum, i) for i, datum in enumerate(fields.get(3, []))],
    )


def _batched_float32(rows: list[np.ndarray]) -> Writer:
    """A BatchedTensor: the rows' float32 values back to back, with byte offsets per row, and the rows' shape
    past their first dimension (K for [T, K] rows; the rows of one BatchedTensor share it)."""
    arrays = [np.ascontiguousarray(row, dtype=np.float32) for row in rows]
    offsets = np.concatenate([[0], np.cumsum([a.nbytes for a in arrays])]).astype(np.int64)
    tensor = (
        Writer()
        .bytes_field(1, b"".join(a.tobytes() for a in arrays))
        .bytes_field(2, offsets.tobytes())
        .varint(3, DTYPE_FLOAT32)
    )
    for size in arrays[0].shape[1:] if arrays else ():
        tensor.varint(4, size)
    return tensor


def encode_forward_backward_output(
    outputs: dict[str, list[np.ndarray]], num_datums: int, metrics: dict[str, float]
) -> bytes:
    """ForwardBackwardOutput: ArrayRecords with a per-datum float32 field per output name, and the metrics. One
    record per run of consecutive datums whose outputs share a trailing shape ([T] rows, or [T, K] rows of one
    K), as the SDK reads ragged outputs; a batch of one shape is one record."""
    runs: list[list[int]] = []  # [first, past the last] datum of each record
    for i in range(num_datums):
        if runs and all(rows[i].shape[1:] == rows[runs[-1][0]].shape[1:] for rows in outputs.values()):
            runs[-1][1] = i + 1
        else:
            runs.append([i, i + 1])
    message = Writer().string(1, "ArrayRecord")
    for start, end in runs or [[0, 0]]:
        record = Writer().string(1, "ArrayRecord")
        for name, rows in outputs.items():
            record.message(2, Writer().string(1, name).message(2, _batched_float32(rows[start:end])))
        record.varint(3, end - start)
        message.message(2, record)
    for key, value in metrics.items():
        message.message(3, Writer().string(1, key).double(2, value))
    return message.bytes()


DTYPE_FLOAT32, DTYPE_INT64 = 1, 2


def tensor_message(
    values: np.ndarray, shape: list[int] | None = None, csr: tuple[list[int], list[int]] | None = None
) -> Writer:
    """Tensor: a float32 or int64 array, dense (row-major, shape its own), or sparse CSR with the given (crow, col)
    indices, `values` then being the listed cells only and `shape` the dense one's."""
    dtype = DTYPE_INT64 if values.dtype.kind in "iu" else DTYPE_FLOAT32
    raw = values.astype(np.int64 if dtype == DTYPE_INT64 else np.float32)
    tensor = Writer()
    if csr is None:
        tensor.bytes_field(1, raw.tobytes())
    else:
        crow, col = csr
        sparse = Writer().bytes_field(1, raw.ravel().tobytes())
        sparse.bytes_field(2, np.asarray(crow, dtype=np.int64).tobytes())
        sparse.bytes_field(3, np.asarray(col, dtype=np.int64).tobytes())
        tensor.message(2, sparse)
    tensor.varint(3, dtype)
    for size in shape if shape is not None else raw.shape:
        tensor.varint(4, size)
    return tensor


def encode_sample_response(
    sequences: list[dict],
    prompt_logprobs: list[float | None] | None,
    prompt_topk: tuple[np.ndarray, np.ndarray] | None = None,
    target_logprobs: Writer | None = None,
    alt_tokens: tuple[np.ndarray, np.ndarray] | None = None,
) -> bytes:
    """SampleResponse: each sequence's tokens (int32), logprobs (float32) and stop reason; prompt logprobs with
    NaN where none was computed; the prompt's top-k as TopkLogprobs (dense [n, k] token ids and logprobs)."""
    message = Writer()
    for sequence in sequences:
        item = Writer().varint(1, STOP_REASONS[sequence["finish_reason"]])
        item.bytes_field(2, np.asarray(sequence["tokens"], dtype=np.int32).tobytes())
        item.bytes_field(3, np.asarray(sequence["logprobs"], dtype=np.float32).tobytes())
        if sequence.get("topk_logprobs") is not None:
            ids = np.asarray(sequence["topk_logprobs"]["token_ids"], dtype=np.int32)
            values = np.asarray(sequence["topk_logprobs"]["logprobs"], dtype=np.float32)
            item.message(4, topk_message(ids, values))
        message.message(1, item)
    if prompt_logprobs is not None:
        values = np.array([np.nan if v is None else v for v in prompt_logprobs], dtype=np.float32)
        message.bytes_field(2, values.tobytes())
    if prompt_topk is not None:
        message.message(3, topk_message(*prompt_topk))
    if target_logprobs is not None:
        message.message(5, target_logprobs)
    if alt_tokens is not None:
        ids, values = alt_tokens
        message.message(6, Writer().message(1, tensor_message(ids)).message(2, tensor_message(values)))
    return message.bytes()


def topk_message(ids: np.ndarray, logprobs: np.ndarray) -> Writer:
    """TopkLogprobs: dense [length, k] token ids (int32) and logprobs (float32), row-major."""
    length, k = ids.shape if ids.ndim == 2 else (0, 0)
    topk = Writer().bytes_field(1, ids.astype(np.int32).tobytes())
    topk.bytes_field(2, logprobs.astype(np.float32).tobytes())
    return topk.varint(3, k).varint(4, length)
