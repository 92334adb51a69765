"""Numbered submissions: a client numbers its requests to a job per stream (the Tinker and Cortex faces'
sequence ids), and each number runs once, in order, however the requests arrive.

Numbers start at 1. A retry of a number answers with the request it already made; a number that arrives
early is held until the ones before it are in; a refused number is used up too (a retry hears the same
refusal), so the numbers after it are never held forever. The request manager (data_plane.py) records
and dispatches; this module only keeps the order.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from cortex_nb.protocol.errors import ApiError

# How far ahead of the next expected number a submission may arrive (and wait).
MAX_SEQUENCE_GAP = 1024

# (sub_job_id, request_id, op, params, blob): a request validated and recorded, not yet dispatched
Held = tuple[str, str, str, dict[str, Any], bytes]


@dataclass
class SequenceStream:
    """One stream's numbers on one job."""

    name: str
    next_seq: int = 1
    request_ids: dict[int, str] = field(default_factory=dict)
    refusals: dict[int, ApiError] = field(default_factory=dict)
    held: dict[int, Held] = field(default_factory=dict)

    def made(self, seq: int) -> str | None:
        """The request a number already made; raises the refusal a refused number heard, or for a number
        passed without being made here."""
        if seq in self.request_ids:
            return self.request_ids[seq]
        if seq in self.refusals:
            raise self.refusals[seq]
        if seq < self.next_seq:
            raise ApiError(
                "invalid_field",
                f"sequence {seq} of stream {self.name!r} was used before; number submissions upward",
                {"field": "sequence"},
            )
        return None

    def hold(self, seq: int, held: Held) -> bool:
        """Keep a recorded request until its turn; True when it must wait for earlier numbers."""
        self.request_ids[seq] = held[1]
        self.held[seq] = held
        return seq != self.next_seq

    def use_up(self, seq: int, error: ApiError) -> bool:
        """A refused number: remember the refusal. False when the number was already made or passed."""
        if seq in self.request_ids or seq < self.next_seq:
            return False
        self.refusals[seq] = error
        return True

    def release(self) -> Iterator[Held]:
        """The held requests whose turn has come, in order, skipping refused numbers."""
        while self.next_seq in self.held or self.next_seq in self.refusals:
            held = self.held.pop(self.next_seq, None)
            self.next_seq += 1
            if held is not None:
                yield held


class SequenceStreams:
    """Every job's streams, by (job id, stream name)."""

    def __init__(self) -> None:
        self._streams: dict[tuple[str, str], SequenceStream] = {}
        # Jobs that came back after a restart: the numbers sent before it are gone with the old process, so
        # each of their streams starts at the first number it hears (client_jobs_resume.py).
        self._restarted: set[str] = set()

    def continue_after_restart(self, job_id: str) -> None:
        self._restarted.add(job_id)

    def stream(self, job_id: str, sequence: tuple[str, int]) -> SequenceStream:
        """The stream a numbered submission belongs to; refuses a number that is not one, or too far ahead."""
        name, seq = sequence
        stream = self._streams.get((job_id, name))
        if stream is None:
            first = seq if job_id in self._restarted and isinstance(seq, int) and seq > 1 else 1
            stream = self._streams[(job_id, name)] = SequenceStream(name, next_seq=first)
        if (
            isinstance(seq, bool)
            or not isinstance(seq, int)
            or seq < 1
            or seq >= stream.next_seq + MAX_SEQUENCE_GAP
        ):
            raise ApiError(
                "invalid_field",
                f"sequence: {seq!r} is not a number from 1 up to {stream.next_seq + MAX_SEQUENCE_GAP - 1}"
                f" for stream {name!r} (its next number is {stream.next_seq})",
                {"field": "sequence"},
            )
        return stream

    def find(self, job_id: str, name: str) -> SequenceStream | None:
        return self._streams.get((job_id, name))

    def forget(self, job_id: str) -> None:
        """A job ended: its numbers mean nothing any more."""
        self._restarted.discard(job_id)
        for key in [key for key in self._streams if key[0] == job_id]:
            del self._streams[key]
