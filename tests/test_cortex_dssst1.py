"""Our DSSST1 codec against the published SDK's own (`cortex_training.wire`): frames, chunks and results
written by one are read by the other, and malformed frames are refused with `invalid_frame`."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from cortex_backend.compat.cortex import dssst1
from cortex_training import wire as sdk_wire

from cortex_nb.protocol.errors import ApiError


def test_reads_what_the_sdk_writes():
    value = {
        "args": (),
        "kwargs": {"input_ids": torch.arange(6).reshape(2, 3), "labels": torch.tensor([[1, 2, -100]] * 2)},
        "note": "plain",
        "nested": [torch.tensor(2.5), {"half": torch.ones(2, dtype=torch.bfloat16)}],
    }
    decoded, op = dssst1.loads(sdk_wire.dumps(value, metadata={"response_options": {"format": "dssst1"}}))
    assert op == {"response_options": {"format": "dssst1"}}
    assert decoded["args"] == () and decoded["note"] == "plain"
    np.testing.assert_array_equal(decoded["kwargs"]["input_ids"], np.arange(6).reshape(2, 3))
    assert decoded["kwargs"]["labels"].dtype == np.int64
    assert decoded["nested"][0].shape == () and float(decoded["nested"][0]) == 2.5
    np.testing.assert_array_equal(
        decoded["nested"][1]["half"], np.ones(2, dtype=np.float32)
    )  # bf16 widened exactly


def test_the_sdk_reads_what_we_write():
    frame = dssst1.dumps(
        {
            "results": [{"text": "hi", "token_ids": [1, 2]}],
            "logprobs": np.array([[-1.5, -0.25]], dtype=np.float32),
            "loss": np.float32(3.0),
            "pair": (1, np.array([7])),
        }
    )
    back = sdk_wire.loads(frame)
    assert back["results"] == [{"text": "hi", "token_ids": [1, 2]}]
    torch.testing.assert_close(back["logprobs"], torch.tensor([[-1.5, -0.25]]))
    assert back["loss"].shape == () and float(back["loss"]) == 3.0
    assert back["pair"][0] == 1 and back["pair"][1].tolist() == [7]
    assert sdk_wire.loads(dssst1.dumps({"empty": True})) == {"empty": True}  # placeholder tensor when none


def test_request_and_result_chunks_interoperate():
    frame = sdk_wire.dumps({"kwargs": {"input_ids": torch.arange(5000).reshape(50, 100)}})
    chunks = sdk_wire.encode_byte_chunks(frame, kind="request", operation="fwd-bwd", max_bytes=16 * 1024)
    parsed = [dssst1.request_chunk(chunk) for chunk in chunks]
    assert len(parsed) > 2 and [c.index for c in parsed] == list(range(len(chunks)))
    assert len({c.group_id for c in parsed}) == 1 and parsed[0].operation == "fwd-bwd"
    assert b"".join(c.payload for c in parsed) == frame
    assert dssst1.request_chunk(frame) is None  # a whole frame is no chunk
    result = dssst1.dumps({"logprobs": np.linspace(0, 1, 10000, dtype=np.float32)})
    assert sdk_wire.decode_result_chunks(dssst1.result_chunks(result, 4096))["logprobs"].shape == (10000,)


@pytest.mark.parametrize(
    "frame",
    [
        b"",
        b"garbage",
        (5).to_bytes(8, "little") + b"[1,2]",
        sdk_wire.dumps({"x": 1})[:-1],  # truncated placeholder tensor
        dssst1.dumps({"x": 1}).replace(b"DSSST1", b"DSSST9"),
    ],
)
def test_malformed_frames_are_invalid_frame(frame):
    with pytest.raises(ApiError) as caught:
        dssst1.loads(frame)
    assert caught.value.code == "invalid_frame"
