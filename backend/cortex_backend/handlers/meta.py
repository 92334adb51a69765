"""Version, capacity, models, tokenization and whoami."""

from __future__ import annotations

from cortex_nb.errors import ApiError
from cortex_nb.version import API_VERSION, __version__

from .base import BaseHandler


class VersionHandler(BaseHandler):
    def get(self) -> None:
        self.write_json({"service": "cortex-nb-backend", "version": __version__, "api_version": API_VERSION})


class CapacityHandler(BaseHandler):
    def get(self) -> None:
        self.write_json({**self.service.scheduler.capacity(), "pending_jobs": self.service.job_views.queue.pending_jobs(self.principal)})


class ModelsHandler(BaseHandler):
    def get(self) -> None:
        self.write_json({"models": self.service.catalog.list()})


class TokenizeHandler(BaseHandler):
    def post(self, model: str) -> None:
        body = self.json_body()
        texts = body.get("texts")
        if not isinstance(texts, list) or not all(isinstance(text, str) for text in texts):
            raise ApiError("invalid_field", "texts: must be a list of strings", {"field": "texts"})
        add_special = body.get("add_special_tokens", True)
        tokenizer = self.service.catalog.tokenizer(model)
        self.write_json({
            "model": model,
            "tokens": [tokenizer.encode(text, add_special_tokens=bool(add_special)) for text in texts],
            "bos_token_id": tokenizer.bos_token_id,
            "eos_token_id": tokenizer.eos_token_id,
            "pad_token_id": tokenizer.pad_token_id,
            "vocab_size": tokenizer.vocab_size,
        })


class DetokenizeHandler(BaseHandler):
    def post(self, model: str) -> None:
        body = self.json_body()
        tokens = body.get("tokens")
        if not isinstance(tokens, list) or not all(isinstance(row, list) and all(isinstance(t, int) for t in row) for row in tokens):
            raise ApiError("invalid_field", "tokens: must be a list of token-id lists", {"field": "tokens"})
        tokenizer = self.service.catalog.tokenizer(model)
        self.write_json({"model": model, "texts": [tokenizer.decode(row) for row in tokens]})


class WhoAmIHandler(BaseHandler):
    def get(self) -> None:
        principal = self.principal
        self.write_json({"owner": principal.owner, "token_id": principal.token_id, "scopes": sorted(principal.scopes)})
