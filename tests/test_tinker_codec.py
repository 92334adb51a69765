"""Our protobuf codec for the Tinker face against the SDK's own encoder and decoder: what the SDK writes we
read, and what we write the SDK reads (dense and sparse tensors, every field we use)."""

from __future__ import annotations

import numpy as np
import pytest
from cortex_backend.compat.tinker import messages, translate

from cortex_nb.protocol import wire
from cortex_nb.protocol.errors import ApiError

from .tinker_fixtures import NEEDS_SDK

pytestmark = NEEDS_SDK


def test_a_forward_backward_request_the_sdk_writes_is_read_back():
    torch = pytest.importorskip("torch")
    from tinker import types
    from tinker.proto.request_conv import forward_backward_request_to_proto

    weights = torch.zeros(1, 6)
    weights[0, 4] = -0.5  # a 2-D tensor the SDK sends as sparse CSR
    data = [
        types.Datum(
            model_input=types.ModelInput.from_ints([1, 2, 3]),
            loss_fn_inputs={"target_tokens": [2, 3, 4], "weights": [1.0, 0.5, -2.0]},
        ),
        types.Datum(
            model_input=types.ModelInput(
                chunks=[types.EncodedTextChunk(tokens=[7, 8]), types.EncodedTextChunk(tokens=[9])]
            ),
            loss_fn_inputs={
                "target_tokens": types.TensorData(data=[8, 9, 10], dtype="int64", shape=[3]),
                "logprobs": [-1.0, -2.0, -3.0],
                "advantages": [0.5, 0.5, 0.5],
                "weights": types.TensorData.from_torch_sparse(weights),
            },
        ),
    ]
    request = types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(
            data=data, loss_fn="ppo", loss_fn_config={"clip_low_threshold": 0.7}
        ),
        model_id="tk-0123456789abcdef:train:0",
        seq_id=3,
    )
    proto = forward_backward_request_to_proto(request)
    proto.forward_only = True
    decoded = messages.decode_forward_backward(proto.SerializeToString())
    assert (decoded.model_id, decoded.seq_id, decoded.loss_fn, decoded.forward_only) == (
        "tk-0123456789abcdef:train:0",
        3,
        "ppo",
        True,
    )
    assert decoded.loss_fn_config == {"clip_low_threshold": pytest.approx(0.7)}
    assert decoded.data[0].tokens.tolist() == [1, 2, 3]
    assert decoded.data[1].tokens.tolist() == [7, 8, 9]
    np.testing.assert_array_equal(decoded.data[0].loss_fn_inputs["weights"], [1.0, 0.5, -2.0])
    assert decoded.data[1].loss_fn_inputs["target_tokens"].dtype == np.int64
    np.testing.assert_array_equal(decoded.data[1].loss_fn_inputs["logprobs"], [-1.0, -2.0, -3.0])
    np.testing.assert_array_equal(decoded.data[1].loss_fn_inputs["weights"], weights.numpy())


def test_what_we_write_the_sdk_reads():
    from tinker.proto.response_conv import deserialize_forward_backward_output, deserialize_sample_response

    rows = [np.array([-1.5, -0.25], np.float32), np.array([], np.float32), np.array([-3.0], np.float32)]
    output = deserialize_forward_backward_output(
        messages.encode_forward_backward_output({"logprobs": rows}, 3, {"loss:sum": 4.75, "tokens:sum": 6.0})
    )
    assert output.metrics == {"loss:sum": 4.75, "tokens:sum": 6.0}
    assert [out["logprobs"].tolist() for out in output.loss_fn_outputs] == [[-1.5, -0.25], [], [-3.0]]
    sample = deserialize_sample_response(
        messages.encode_sample_response(
            [
                {"tokens": [5, 6], "logprobs": [-0.5, -0.75], "finish_reason": "stop"},
                {"tokens": [7], "logprobs": [-1.0], "finish_reason": "length"},
            ],
            [None, -2.0, -0.5],
        )
    )
    assert [(s.tokens, s.logprobs, s.stop_reason) for s in sample.sequences] == [
        ([5, 6], [-0.5, -0.75], "stop"),
        ([7], [-1.0], "length"),
    ]
    assert sample.prompt_logprobs == [None, -2.0, -0.5]


def test_datums_of_different_k_travel_as_one_padded_frame_and_come_back_in_their_own_shapes():
    from tinker.proto.response_conv import deserialize_forward_backward_output

    data = [
        messages.Datum(np.array([1, 2, 3]), {"target_tokens": np.array([[2, 5], [3, 6], [4, 7]])}),
        messages.Datum(
            np.array([1, 2]), {"target_tokens": np.array([2, 3]), "weights": np.array([0.5, 1.0])}
        ),
        messages.Datum(np.array([4, 5]), {"target_tokens": np.array([[5, 6, 7], [8, 9, 1]])}),
    ]
    frame, lengths, widths = translate.datums_to_frame(data, "cross_entropy", {}, {})
    tensors, _ = wire.decode_frame(frame)
    assert tensors["target_tokens"].shape == tensors["weights"].shape == (3, 3, 3)
    # defaults (weight 1) only where a datum has a target; a [T] datum's targets in column 0; the rest weight 0
    np.testing.assert_array_equal(tensors["weights"][0], [[1, 1, 0], [1, 1, 0], [1, 1, 0]])
    np.testing.assert_array_equal(tensors["weights"][1], [[0.5, 0, 0], [1, 0, 0], [0, 0, 0]])
    np.testing.assert_array_equal(tensors["target_tokens"][1, :, 0], [2, 3, 0])
    assert (lengths, widths) == ([3, 2, 2], [2, 0, 3])

    logprobs = -np.arange(27, dtype=np.float32).reshape(3, 3, 3)
    rows = translate.outputs_from_frame(wire.encode_frame({"logprobs": logprobs}), lengths, widths)[
        "logprobs"
    ]
    output = deserialize_forward_backward_output(
        messages.encode_forward_backward_output({"logprobs": rows}, 3, {})
    )
    got = [out["logprobs"].to_numpy() for out in output.loss_fn_outputs]
    assert [g.shape for g in got] == [(3, 2), (2,), (2, 3)]
    np.testing.assert_array_equal(got[0], logprobs[0, :, :2])
    np.testing.assert_array_equal(got[1], logprobs[1, :2, 0])
    np.testing.assert_array_equal(got[2], logprobs[2, :2])


def test_a_custom_loss_takes_its_inputs_at_their_declared_ranks_with_one_k_a_request():
    custom = {"name": "distill", "inputs": [{"name": "logprobs", "rank": 2}, {"name": "teacher", "rank": 2}]}

    def datum(k: int, teacher_shape: tuple[int, ...]) -> messages.Datum:
        targets = np.arange(3 * k).reshape(3, k) % 50
        return messages.Datum(
            np.array([1, 2, 3]), {"target_tokens": targets, "teacher": np.zeros(teacher_shape, np.float32)}
        )

    frame, _, widths = translate.datums_to_frame([datum(2, (3, 5))], "custom", {}, {}, custom)
    tensors, _ = wire.decode_frame(frame)
    assert tensors["target_tokens"].shape == (1, 3, 2) and tensors["teacher"].shape == (1, 3, 5)
    assert widths == [2]
    with pytest.raises(ApiError) as refused:
        translate.datums_to_frame([datum(2, (3, 5)), datum(2, (3, 4))], "custom", {}, {}, custom)
    assert refused.value.code == "invalid_batch" and "teacher" in refused.value.detail["field"]
    with pytest.raises(ApiError) as refused:
        translate.datums_to_frame([datum(2, (3,))], "custom", {}, {}, custom)
    assert refused.value.detail["field"] == "data[0].loss_fn_inputs.teacher"
    assert "declares it rank 2" in refused.value.message


def test_a_zstd_body_is_bounded_before_it_is_decompressed():
    import zstandard
    from cortex_backend.compat.tinker.decoding import decompress

    from cortex_nb.errors import ApiError

    small = zstandard.ZstdCompressor().compress(b"x" * 1000)
    assert decompress(small, 4096) == b"x" * 1000
    for body in (zstandard.ZstdCompressor().compress(b"\0" * 10_000), b"not zstd"):
        with pytest.raises(ApiError) as caught:
            decompress(body, 4096)
        assert caught.value.code in ("body_too_large", "invalid_request")
    with pytest.raises(ApiError) as caught:
        decompress(zstandard.ZstdCompressor().compress(b"\0" * 10_000), 4096)
    assert caught.value.code == "body_too_large"
