"""Version, capacity, models, tokenization and whoami."""

from __future__ import annotations

import asyncio

from cortex_nb.errors import ApiError
from cortex_nb.version import API_VERSION, __version__

from .base import BaseHandler


class VersionHandler(BaseHandler):
    def get(self) -> None:
        self.write_json({"service": "cortex-nb-backend", "version": __version__, "api_version": API_VERSION})


class CapacityHandler(BaseHandler):
    def get(self) -> None:
        self.write_json({**self.service.capacity(), "pending_jobs": self.service.job_views.queue.pending_jobs(self.principal)})


class ModelsHandler(BaseHandler):
    def get(self) -> None:
        self.write_json({"models": self.service.catalog.list()})


# Tokenizing is bounded (a read-only token could otherwise hold a core for seconds) and runs off the IO loop.
MAX_TEXTS = 1024
MAX_TEXT_CHARS = 1 << 20
MAX_TOKEN_IDS = 1 << 20


class TokenizeHandler(BaseHandler):
    async def post(self, model: str) -> None:
        body = self.json_body()
        texts = body.get("texts")
        if not isinstance(texts, list) or not all(isinstance(text, str) for text in texts):
            raise ApiError("invalid_field", "texts: must be a list of strings", {"field": "texts"})
        if len(texts) > MAX_TEXTS or sum(map(len, texts)) > MAX_TEXT_CHARS:
            raise ApiError("invalid_field", f"texts: at most {MAX_TEXTS} texts and {MAX_TEXT_CHARS} characters in all per"
                           " request; split the work", {"field": "texts"})
        add_special = body.get("add_special_tokens", True)
        tokenizer = self.service.catalog.tokenizer(model)
        tokens = await asyncio.to_thread(
            lambda: [tokenizer.encode(text, add_special_tokens=bool(add_special)) for text in texts])
        self.write_json({
            "model": model,
            "tokens": tokens,
            "bos_token_id": tokenizer.bos_token_id,
            "eos_token_id": tokenizer.eos_token_id,
            "pad_token_id": tokenizer.pad_token_id,
            "vocab_size": tokenizer.vocab_size,
        })


class DetokenizeHandler(BaseHandler):
    async def post(self, model: str) -> None:
        body = self.json_body()
        tokens = body.get("tokens")
        if not isinstance(tokens, list) or not all(
            isinstance(row, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in row) for row in tokens
        ):
            raise ApiError("invalid_field", "tokens: must be a list of token-id lists", {"field": "tokens"})
        if len(tokens) > MAX_TEXTS or sum(map(len, tokens)) > MAX_TOKEN_IDS:
            raise ApiError("invalid_field", f"tokens: at most {MAX_TEXTS} lists and {MAX_TOKEN_IDS} ids in all per request",
                           {"field": "tokens"})
        tokenizer = self.service.catalog.tokenizer(model)
        vocab = tokenizer.vocab_size
        for index, row in enumerate(tokens):
            if row and (min(row) < 0 or max(row) >= vocab):
                raise ApiError("invalid_field", f"tokens[{index}]: holds ids outside [0, {vocab}) for model {model}",
                               {"field": f"tokens[{index}]"})
        texts = await asyncio.to_thread(lambda: [tokenizer.decode(row) for row in tokens])
        self.write_json({"model": model, "texts": texts})


class WhoAmIHandler(BaseHandler):
    def get(self) -> None:
        principal = self.principal
        self.write_json({"owner": principal.owner, "token_id": principal.token_id, "scopes": sorted(principal.scopes)})
