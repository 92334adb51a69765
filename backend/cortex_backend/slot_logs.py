"""How an adapter host's log lines say which slot printed them (one stdout for several sub-jobs).

A slot's line reaches the service as SLOT_MARK + slot + SLOT_MARK + line, so the executor files it under
that slot's sub-job; a line without the mark (the host's own) concerns every slot.
"""

from __future__ import annotations

from collections.abc import Collection

SLOT_MARK = "\x1f"


def tag_line(slot: str, line: str) -> str:
    return f"{SLOT_MARK}{slot}{SLOT_MARK}{line}"


def untag_line(line: str) -> tuple[str | None, str]:
    """(slot, line) of a tagged line; (None, line) for the host's own."""
    if line.startswith(SLOT_MARK):
        slot, mark, rest = line[1:].partition(SLOT_MARK)
        if mark:
            return slot, rest
    return None, line


def addressed_slots(slots: Collection[str], line: str) -> tuple[list[str], str]:
    """(the slots a host's line is filed under, its text): a tagged line under its slot (none if that slot is
    gone), the host's own line under every slot."""
    slot, text = untag_line(line)
    if slot is None:
        return list(slots), text
    return ([slot] if slot in slots else []), text
