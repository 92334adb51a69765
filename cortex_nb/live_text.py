"""The text of streamed samples as it grows, for a cell's live view (`%%cortex sample --stream`)."""

from __future__ import annotations

import time
from typing import Any

# Redraws of the live view per second at most: a notebook frontend handles a few, not one per token.
REDRAWS_PER_S = 8


class LiveSamples:
    """Each sample's text so far, by (prompt index, sample index)."""

    def __init__(self, prompts: list[str]) -> None:
        self.prompts = prompts
        self.texts: dict[tuple[int, int], str] = {}
        self.tokens = 0
        self._drawn_at = 0.0

    def add(self, piece: dict[str, Any]) -> bool:
        """Take one streamed piece; True when the view is due a redraw."""
        key = (piece["prompt_index"], piece["sample_index"])
        self.texts[key] = self.texts.get(key, "") + (piece.get("text") or "")
        self.tokens += len(piece["tokens"])
        now = time.monotonic()
        if now - self._drawn_at >= 1 / REDRAWS_PER_S:
            self._drawn_at = now
            return True
        return False

    def render(self, done: bool = False) -> str:
        lines = [f"{'streamed' if done else 'streaming'}: {self.tokens} tokens"]
        for (prompt_index, sample_index), text in sorted(self.texts.items()):
            label = f"[{prompt_index}.{sample_index}] {self.prompts[prompt_index]!r} →"
            lines.append(f"{label} {text}")
        return "\n".join(lines)
