"""The escape suite (tests/escape_suite.py) in both tiers: a root backend, and a backend run as an
ordinary user with its own venv and home (the laptop case). Every case must count zero escapes."""

from __future__ import annotations

import pytest
from cortex_backend.runs.bubblewrap import listening_socket_paths, sandbox_arguments

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


def test_the_host_unix_sockets_in_a_bound_tree_are_covered(tmp_path):
    """The sandbox's arguments cover each listed host socket that lies in a tree the run sees, and only those."""
    table = tmp_path / "unix"
    runtime = tmp_path / "venv"
    runtime.mkdir()
    inside, elsewhere = runtime / "agent.sock", tmp_path / "away.sock"
    for path in (inside, elsewhere):
        path.write_text("")
    table.write_text(
        "Num       RefCount Protocol Flags    Type St Inode Path\n"
        f"0000000000000000: 00000002 00000000 00010000 0001 01 11 {inside}\n"
        f"0000000000000000: 00000002 00000000 00010000 0001 01 12 {elsewhere}\n"
        "0000000000000000: 00000002 00000000 00010000 0001 01 13 @abstract-name\n"
        "0000000000000000: 00000003 00000000 00000000 0001 03 14\n"
    )
    listed = listening_socket_paths(str(table))
    assert listed == sorted([str(inside), str(elsewhere)])
    args = sandbox_arguments(
        workdir=str(tmp_path / "work"),
        sandbox_workdir="/work",
        runtime_paths=[str(runtime)],
        hide_paths=[],
        world_writable=[],
        models={},
        tmp_bytes=1 << 20,
        gpu_indices=[],
        host_sockets=listed,
    )
    covered = [args[i + 2] for i in range(len(args) - 2) if args[i : i + 2] == ["--ro-bind", "/dev/null"]]
    assert covered == [str(inside)]
