"""Server-side custom losses through the published SDK: `create_custom_loss` uploads the traced graph, the
backend checks it against its allow-list and runs it on the trainer in one forward pass; the result equals the
same loss computed client-side by `forward_backward_custom` (two passes). Graphs that reach outside pure tensor
maths (os.system, torch.load, eval, a module, a captured attribute) or are too big are refused with the node."""

from __future__ import annotations

import httpx
import pytest

from .tinker_fixtures import NEEDS_SDK, TINKER_MODEL

pytestmark = NEEDS_SDK


def policy_loss(logprobs, advantages, scale):
    """A REINFORCE loss with a quadratic penalty, scaled by a per-datum scalar."""
    loss = -(logprobs * advantages).sum() * scale + 0.1 * (logprobs**2).mean()
    return loss, {"custom/policy:sum": loss, "custom/logprob:mean": logprobs.mean()}


def datums():
    import torch
    from tinker import types

    rows = [([5, 9, 12, 7, 3], [0.5, -1.0, 2.0, 0.25, 1.0], 1.5), ([4, 8, 2], [1.0, 0.5, -0.5], 0.5)]
    return [
        types.Datum(
            model_input=types.ModelInput.from_ints(tokens),
            loss_fn_inputs={
                "target_tokens": types.TensorData.from_torch(torch.tensor(tokens[1:] + [1])),
                "advantages": types.TensorData.from_torch(torch.tensor(advantages)),
                "scale": types.TensorData.from_torch(torch.tensor(scale)),
            },
        )
        for tokens, advantages, scale in rows
    ]


def client_side(data, logprobs_list):
    """The same loss as a plain client-side function: per datum, summed; :mean metrics averaged."""
    total, policy, mean = 0.0, 0.0, 0.0
    for datum, logprobs in zip(data, logprobs_list, strict=True):
        inputs = [datum.loss_fn_inputs[name].to_torch() for name in ("advantages", "scale")]
        loss, metrics = policy_loss(logprobs, *inputs)
        total = total + loss
        policy += metrics["custom/policy:sum"].item()
        mean += metrics["custom/logprob:mean"].item() / len(data)
    return total, {"custom/policy:sum": policy, "custom/logprob:mean": mean}


def model_passes(backend, tinker_key, model_id: str) -> list[str]:
    from cortex_backend.compat.tinker.names import job_id_for

    from cortex_nb import Client

    with Client(backend.url, tinker_key) as ours:
        requests = ours.list_requests(job_id_for(model_id))
    return sorted(r["op"] for r in requests if r["op"] in ("forward", "forward_backward"))


def test_a_server_side_custom_loss_equals_the_client_side_one_in_one_forward_pass(
    backend, tinker_key, service_client
):
    training = service_client.create_lora_training_client(base_model=TINKER_MODEL, rank=4).result()
    handle = service_client.create_custom_loss(
        policy_loss, {"logprobs": 1, "advantages": 1, "scale": 0}
    ).result()
    assert handle.loss_id is not None  # uploaded: it runs on the server
    data = datums()

    server = training.forward_backward_custom(data, handle).result()
    assert model_passes(backend, tinker_key, training.model_id) == ["forward_backward"]
    local = training.forward_backward_custom(data, client_side).result()
    assert model_passes(backend, tinker_key, training.model_id) == [
        "forward",
        "forward_backward",
        "forward_backward",
    ]  # the client-side loss took a forward pass and a second forward+backward

    for key in ("loss:sum", "custom/policy:sum", "custom/logprob:mean"):
        assert server.metrics[key] == pytest.approx(local.metrics[key], abs=1e-5), key
    for ours, theirs in zip(server.loss_fn_outputs, local.loss_fn_outputs, strict=True):
        assert ours["logprobs"].tolist() == pytest.approx(theirs["logprobs"].tolist(), abs=1e-5)
    assert len(server.loss_fn_outputs[1]["logprobs"].tolist()) == 3  # each datum's own length


def plain_datum(length: int):
    import torch
    from tinker import types

    tokens = [(3 * i + 5) % 50 + 2 for i in range(length)]
    target = types.TensorData.from_torch(torch.tensor(tokens[1:] + [1]))
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens), loss_fn_inputs={"target_tokens": target}
    )


def test_a_custom_loss_that_fails_on_the_trainer_names_its_node_and_the_next_request_runs(service_client):
    def halves(logprobs):
        loss = logprobs.reshape(2, -1).sum()  # fails for an odd number of tokens
        return loss, {"custom/halves:sum": loss}

    training = service_client.create_lora_training_client(base_model=TINKER_MODEL, rank=4).result()
    handle = service_client.create_custom_loss(halves, {"logprobs": 1}).result()
    with pytest.raises(Exception) as failed:
        training.forward_backward_custom([plain_datum(5)], handle).result()
    assert "custom_loss_failed" in str(failed.value) and "node 'reshape'" in str(failed.value)
    assert training.forward_backward_custom([plain_datum(4)], handle).result().metrics["loss:sum"] < 0


# Attacks: graphs the SDK itself would not trace, sent as its upload would be. -------------------------------
def upload(backend, key: str, session_id: str, seq: int, nodes: list[dict], inputs=None) -> httpx.Response:
    body = {
        "session_id": session_id,
        "custom_loss_seq_id": seq,
        "name": "attack",
        "inputs": inputs or [{"name": "logprobs", "rank": 1}],
        "graph": {"format": 1, "nodes": nodes},
        "type": "create_custom_loss",
    }
    return httpx.post(
        f"{backend.url}/api/v1/create_custom_loss", json=body, headers={"X-API-Key": key}, timeout=30
    )


def placeholder() -> dict:
    return {"op": "placeholder", "name": "logprobs", "target": "logprobs", "args": [], "kwargs": {}}


def call(name: str, target: str, *args, op: str = "call_function") -> dict:
    return {"op": op, "name": name, "target": target, "args": list(args), "kwargs": {}}


def output(loss: str) -> dict:
    return {
        "op": "output",
        "name": "output",
        "target": "output",
        "args": [{"tuple": [{"ref": loss}, {"dict": {}}]}],
        "kwargs": {},
    }


ATTACKS = {
    "os.system": [placeholder(), call("shell", "os.system", "touch /tmp/pwned"), output("shell")],
    "torch.load": [placeholder(), call("load", "torch.load", "/etc/passwd"), output("load")],
    "builtins.eval": [placeholder(), call("run", "builtins.eval", "__import__('os')"), output("run")],
    "a module": [placeholder(), call("lin", "linear", {"ref": "logprobs"}, op="call_module"), output("lin")],
    "an attribute": [placeholder(), call("weights", "weight", op="get_attr"), output("weights")],
    "a dunder through getattr": [
        placeholder(),
        call("cls", "builtins.getattr", {"ref": "logprobs"}, "__class__"),
        output("cls"),
    ],
    "a method that leaves torch": [
        placeholder(),
        call("value", "tolist", {"ref": "logprobs"}, op="call_method"),
        output("value"),
    ],
}


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_graphs_outside_the_allow_list_are_refused_with_the_node(backend, tinker_key, service_client, attack):
    session_id = service_client.holder.get_session_id()
    nodes = ATTACKS[attack]
    answer = upload(backend, tinker_key, session_id, 100, nodes)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["code"] == "custom_loss_refused"
    assert error["detail"]["node"] == nodes[1]["name"]


def test_a_huge_graph_and_an_unserved_rank_are_refused(backend, tinker_key, service_client):
    session_id = service_client.holder.get_session_id()
    chain = [placeholder()] + [
        call(f"n{i}", "torch.exp", {"ref": "logprobs" if i == 0 else f"n{i - 1}"}) for i in range(5000)
    ]
    answer = upload(backend, tinker_key, session_id, 101, [*chain, output("n4999")])
    assert answer.status_code == 400 and answer.json()["error"]["code"] == "custom_loss_refused"
    assert "512" in answer.json()["error"]["message"]
    ranked = [{"name": "logprobs", "rank": 1}, {"name": "ranks", "rank": 3}]
    answer = upload(backend, tinker_key, session_id, 102, [placeholder(), output("logprobs")], ranked)
    assert answer.status_code == 400 and answer.json()["error"]["detail"]["field"] == "inputs[1].rank"
    # a reference to a node that comes later (or never) is refused before anything runs
    answer = upload(
        backend,
        tinker_key,
        session_id,
        103,
        [placeholder(), call("a", "torch.exp", {"ref": "b"}), output("a")],
    )
    assert answer.status_code == 400 and answer.json()["error"]["detail"]["node"] == "a"


def test_a_graph_that_would_allocate_past_its_bound_fails_before_allocating(service_client):
    def cube(logprobs):
        grid = logprobs[:, None, None] * logprobs[None, :, None] * logprobs[None, None, :]
        big = grid.reshape(-1)[:, None] * grid.reshape(-1)[None, :]
        return big.sum(), {}

    training = service_client.create_lora_training_client(base_model=TINKER_MODEL, rank=4).result()
    handle = service_client.create_custom_loss(cube, {"logprobs": 1}).result()
    # 20 tokens: the last product would hold 20**6 (64 million) elements
    with pytest.raises(Exception, match="elements"):
        training.forward_backward_custom([plain_datum(20)], handle).result()
