"""Demo data the project generates itself: a small task with a checkable answer, so the notebooks and
the demo can show accuracy rising, not only loss falling.

    rows = addition_problems()                  # 100 rows: {"prompt": "3+4=", "completion": "7"}
    texts = job.generate([r["prompt"] for r in rows], max_tokens=3, temperature=0).result().texts
    exact_match([r["prompt"] for r in rows], texts)   # fraction answered exactly right

The rows are `prompt`/`completion` pairs, the shape `%%cortex train` trains on with loss on the
completion only. Nothing here imports torch or talks to a backend.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable

_ADDITION = re.compile(r"\s*(\d+)\s*\+\s*(\d+)\s*=\s*")


def addition_problems(max_operand: int = 9, seed: int | None = None) -> list[dict[str, str]]:
    """Every `a+b=` with 0 <= a, b <= `max_operand` (100 problems by default), answer as the completion.

    In order of (a, b), or shuffled with `seed`.
    """
    if max_operand < 0:
        raise ValueError(f"max_operand must be >= 0, not {max_operand}")
    rows = [
        {"prompt": f"{a}+{b}=", "completion": str(a + b)}
        for a in range(max_operand + 1)
        for b in range(max_operand + 1)
    ]
    if seed is not None:
        random.Random(seed).shuffle(rows)
    return rows


def addition_answer(prompt: str) -> str:
    """The right completion of an addition prompt such as "3+4=" ("7")."""
    match = _ADDITION.fullmatch(prompt)
    if match is None:
        raise ValueError(f"{prompt!r} is not an addition prompt like '3+4='")
    return str(int(match.group(1)) + int(match.group(2)))


def is_correct(prompt: str, completion: str) -> bool:
    """True when `completion` is exactly the sum (surrounding whitespace aside): "7" for "3+4=",
    never "7 " + more text, "07" or "77"."""
    return completion.strip() == addition_answer(prompt)


def exact_match(prompts: Iterable[str], completions: Iterable[str]) -> float:
    """The fraction of completions that answer their prompt exactly (see `is_correct`)."""
    prompts, completions = list(prompts), list(completions)
    if len(prompts) != len(completions):
        raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
    if not prompts:
        raise ValueError("no prompts to score")
    return sum(is_correct(p, c) for p, c in zip(prompts, completions, strict=True)) / len(prompts)
