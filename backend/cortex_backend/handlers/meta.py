"""Version, capacity, models, tokenization and whoami."""

from __future__ import annotations

import asyncio

from cortex_nb.protocol import backend_proof, openapi
from cortex_nb.protocol.errors import ApiError
from cortex_nb.protocol.versions import API_VERSION, __version__

from .base import BaseHandler


class VersionHandler(BaseHandler):
    def get(self) -> None:
        reply = {"service": "cortex-nb-backend", "version": __version__, "api_version": API_VERSION}
        challenge = self.query_args().challenge
        if challenge is not None:
            reply["proof"] = backend_proof.proof(self.service.settings.endpoint_nonce, challenge)
        self.write_json(reply)


class OpenApiHandler(BaseHandler):
    """This API as an OpenAPI 3.1 document, generated from the route table and the schemas."""

    def get(self) -> None:
        self.set_header("Content-Type", "application/json; charset=utf-8")
        self.finish(openapi.document_json())


class CapacityHandler(BaseHandler):
    def get(self) -> None:
        self.write_json(
            {
                **self.service.capacity(),
                "pending_jobs": self.service.job_views.queue.pending_jobs(self.principal),
            }
        )


class ModelsHandler(BaseHandler):
    def get(self) -> None:
        self.write_json({"models": self.service.catalog.list()})


class TokenizeHandler(BaseHandler):
    async def post(self, model: str) -> None:
        body = self.parse_body()
        tokenizer = self.service.catalog.tokenizer(model)
        # Tokenizing (bounded by the body's schema) runs off the IO loop.
        tokens = await asyncio.to_thread(
            lambda: [
                tokenizer.encode(text, add_special_tokens=body.add_special_tokens) for text in body.texts
            ]
        )
        self.write_json(
            {
                "model": model,
                "tokens": tokens,
                "bos_token_id": tokenizer.bos_token_id,
                "eos_token_id": tokenizer.eos_token_id,
                "pad_token_id": tokenizer.pad_token_id,
                "vocab_size": tokenizer.vocab_size,
            }
        )


class DetokenizeHandler(BaseHandler):
    async def post(self, model: str) -> None:
        tokens = self.parse_body().tokens
        tokenizer = self.service.catalog.tokenizer(model)
        vocab = tokenizer.vocab_size
        for index, row in enumerate(tokens):
            if row and (min(row) < 0 or max(row) >= vocab):
                raise ApiError(
                    "invalid_field",
                    f"tokens[{index}]: holds ids outside [0, {vocab}) for model {model}",
                    {"field": f"tokens[{index}]"},
                )
        texts = await asyncio.to_thread(lambda: [tokenizer.decode(row) for row in tokens])
        self.write_json({"model": model, "texts": texts})


class WhoAmIHandler(BaseHandler):
    def get(self) -> None:
        principal = self.principal
        self.write_json(
            {"owner": principal.owner, "token_id": principal.token_id, "scopes": sorted(principal.scopes)}
        )
