"""The escape suite (tests/escape_suite.py) in both tiers: a root backend, and a backend run as an
ordinary user with its own venv and home (the laptop case). Every case must count zero escapes."""

from __future__ import annotations

import pytest

from .escape_suite import CASES, TIERS, remove, scratch_dir, start_tier, tier_unavailable


@pytest.fixture(scope="module", params=TIERS)
def tier(request, tmp_path_factory):
    reason = tier_unavailable(request.param)
    if reason is not None:
        pytest.skip(f"{request.param} tier: {reason}")
    root = scratch_dir()
    started = start_tier(request.param, root)
    yield started
    started.stop()
    remove(root)


@pytest.mark.parametrize("case", list(CASES))
def test_run_cannot_escape(tier, case, tmp_path):
    escapes = CASES[case](tier, tmp_path)
    assert escapes == [], (
        f"{tier.name} tier, {case}: "
        + "; ".join(map(str, escapes))
        + f"\nbackend log:\n{tier.backend.log()[-2000:]}"
    )
