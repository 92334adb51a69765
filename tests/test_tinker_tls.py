"""The tinker SDK over HTTPS: a backend serving its own self-signed certificate (`--tls self-signed`), trusted
through SSL_CERT_FILE, which the SDK's HTTP client honours because the server's client config asks for httpx's
transport."""

from __future__ import annotations

from .tinker_fixtures import NEEDS_SDK
from .tokens import create_token

pytestmark = NEEDS_SDK


def test_the_sdk_trains_and_samples_over_tls(tls_backend, monkeypatch):
    import tinker
    from tinker import types

    monkeypatch.setenv("SSL_CERT_FILE", str(tls_backend.data_dir / "tls" / "cert.pem"))
    key = create_token(tls_backend.data_dir, "tls-tinker", "jobs:read", "jobs:write", tinker=True)
    assert tls_backend.url.startswith("https://")
    service = tinker.ServiceClient(base_url=tls_backend.url, api_key=key)
    try:
        training = service.create_lora_training_client(base_model="tiny", rank=4, seed=0).result()
        datum = types.Datum(
            model_input=types.ModelInput.from_ints([256, 49, 43, 50]),
            loss_fn_inputs={"target_tokens": [49, 43, 50, 61], "weights": [1.0] * 4},
        )
        assert training.forward_backward([datum], "cross_entropy").result().metrics["loss:sum"] > 0
        training.optim_step(types.AdamParams(learning_rate=1e-3)).result()
        sampler = training.save_weights_and_get_sampling_client().result()
        assert (
            len(
                sampler.sample(types.ModelInput.from_ints([256, 49]), 1, types.SamplingParams(max_tokens=3))
                .result()
                .sequences[0]
                .tokens
            )
            >= 1
        )
    finally:
        service.close("success").result()
