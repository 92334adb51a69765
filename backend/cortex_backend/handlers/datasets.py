"""Datasets: upload once (PUT, body = JSONL, id = its SHA-256), ask whether the backend has one (GET)."""

from __future__ import annotations

import asyncio

from .base import BaseHandler


class DatasetHandler(BaseHandler):
    def body_limit(self) -> int:
        return self.service.settings.max_dataset_bytes

    def get(self, dataset_id: str) -> None:
        self.write_json(self.service.datasets.get(self.principal, dataset_id))

    async def put(self, dataset_id: str) -> None:
        # Hashing and parsing up to 256 MiB of rows happen in a thread: other clients keep being answered.
        self.write_json(
            await asyncio.to_thread(self.service.datasets.put, self.principal, dataset_id, self.body)
        )
