"""Tinker sessions: who is connected, kept alive by the SDK's heartbeats, and what each made.

A session is the SDK's process. It owns training clients (jobs) and sampling sessions. When it is finished,
or its heartbeats stop for longer than the timeout, its jobs are completed (devices freed, trained steps
saved as checkpoint `final` where the service does that) and its ephemeral sampler checkpoints are deleted.
Sessions live in memory: a restarted backend brings a training client's job back from its newest resumable
checkpoint without its session (client_jobs_resume.py), and a path to a checkpoint stays valid without its
session (names.py). So memory is bounded per owner: live sessions (a cap, refused with
`too_many_sessions`), each session's metadata, models and samplers, and the ended sessions remembered; an
ended session keeps only its ids (its metadata and sample futures are dropped).
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cortex_nb.protocol.errors import ApiError

from ...auth import Principal
from . import names

log = logging.getLogger("cortex_backend.tinker")

# Sessions of one owner remembered after they end, so late calls hear "expired" rather than "not found".
ENDED_SESSIONS_KEPT = 256
# Live sessions one owner may hold at once (an SDK process holds one; a notebook restarted many times, a few).
MAX_LIVE_SESSIONS = 32
# user_metadata of a session, as JSON.
MAX_METADATA_BYTES = 16 * 1024
# Training and sampling clients one session may make.
MAX_CLIENTS_PER_SESSION = 1024
# seq_id -> future of a sampling session's recent samples (a retry comes within moments).
SAMPLE_SEQS_KEPT = 1024
# A session's project: a label its owner chooses (there is no project membership here), `default` until set.
DEFAULT_PROJECT = "default"
_PROJECT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")


def project_id(value: Any, field_name: str = "project_id") -> str:
    """A project id as given, or `invalid_field`."""
    if not isinstance(value, str) or not _PROJECT_ID.fullmatch(value):
        raise ApiError(
            "invalid_field",
            f"{field_name}: must be 1 to 128 letters, digits or . _ : - (starting with a letter or digit),"
            f" got {str(value)[:80]!r}",
            {"field": field_name},
        )
    return value


@dataclass
class SamplingSession:
    """What a SamplingClient samples: the base model, a checkpoint, or (inflight) a trainer's live adapter."""

    id: str
    owner: str
    base_model: str
    checkpoint: tuple[str, str] | None = None  # (job id, checkpoint id)
    live_job_id: str | None = None
    model_path: str | None = None
    ephemeral: bool = False
    # seq_id -> future id: a retried sample with the same seq_id is the same request
    futures: dict[int, str] = field(default_factory=dict)


@dataclass
class Session:
    id: str
    principal: Principal
    display_name: str | None
    user_metadata: dict[str, Any]
    created_at: float
    last_seen: float
    ended: str | None = None  # "finished: success", "expired", ...
    models: dict[int, str] = field(default_factory=dict)  # model_seq_id -> job id
    samplers: dict[int, str] = field(default_factory=dict)  # sampling_session_seq_id -> sampling session id
    # custom_loss_seq_id -> loss id, and loss id -> the validated loss (cortex_nb/protocol/custom_loss.py)
    custom_loss_ids: dict[int, str] = field(default_factory=dict)
    custom_losses: dict[str, dict[str, Any]] = field(default_factory=dict)
    project_id: str = DEFAULT_PROJECT


class Sessions:
    def __init__(self, timeout_s: float, on_expired: Callable[[Session], None]) -> None:
        self.timeout_s = timeout_s
        # Ends a session whose heartbeats stopped (the face completes its jobs); called by a sweep, or at once
        # when a call arrives for such a session before the sweep noticed.
        self.on_expired = on_expired
        self._sessions: OrderedDict[str, Session] = OrderedDict()
        self.sampling: dict[str, SamplingSession] = {}

    def create(self, principal: Principal, body: dict[str, Any]) -> Session:
        now = time.time()
        metadata = body.get("user_metadata") or {}
        if not isinstance(metadata, dict):
            raise ApiError("invalid_field", "user_metadata: must be an object", {"field": "user_metadata"})
        if len(json.dumps(metadata)) > MAX_METADATA_BYTES:
            raise ApiError(
                "invalid_field",
                f"user_metadata: at most {MAX_METADATA_BYTES} bytes of JSON",
                {"field": "user_metadata"},
            )
        for expired in self.expired(now):
            if expired.principal.owner == principal.owner:
                self.on_expired(expired)
        live = sum(1 for s in self.all_live() if s.principal.owner == principal.owner)
        if live >= MAX_LIVE_SESSIONS:
            raise ApiError(
                "too_many_sessions",
                f"this key's owner has {live} live Tinker sessions, the most it may hold; close a ServiceClient"
                f" (or let one expire, {self.timeout_s:g} s after its last heartbeat) and create it again",
                {"limit": MAX_LIVE_SESSIONS},
            )
        display = body.get("display_name")
        session = Session(
            names.new_session_id(), principal, str(display)[:200] if display else None, metadata, now, now
        )
        if body.get("project_id") is not None:
            session.project_id = project_id(body["project_id"])
        self._sessions[session.id] = session
        return session

    def find(self, principal: Principal, session_id: Any) -> Session:
        """A session this principal may see (ended or not); 404 otherwise, as for one that never existed."""
        if not isinstance(session_id, str):
            raise ApiError(
                "invalid_field",
                f"session_id: must be the string create_session returned, got {str(session_id)[:80]}",
                {"field": "session_id"},
            )
        session = self._sessions.get(session_id)
        if session is None or not principal.can_see(session.principal.owner):
            raise ApiError(
                "session_not_found",
                f"no session {str(session_id)[:80]!r} is visible to this key; create a ServiceClient",
            )
        return session

    def live(self, principal: Principal, session_id: Any) -> Session:
        """A session that has not ended; `session_expired` (410) once it has. Counts as a sign of life."""
        session = self.find(principal, session_id)
        if session.ended is None and time.time() - session.last_seen > self.timeout_s:
            self.on_expired(session)
        if session.ended is not None:
            raise ApiError(
                "session_expired",
                f"session {session.id} has ended ({session.ended}); its training clients were completed."
                " Create a new ServiceClient (checkpoints it saved stay available by their tinker:// paths)",
                {"session_id": session.id, "ended": session.ended},
            )
        session.last_seen = time.time()
        return session

    def by_id(self, session_id: str) -> Session | None:
        """A remembered session, whoever owns it (for a caller that checked its right another way)."""
        return self._sessions.get(session_id)

    def of_model(self, job_id: str) -> Session | None:
        for session in self._sessions.values():
            if job_id in session.models.values():
                return session
        return None

    def sampling_session(self, principal: Principal, sampling_session_id: Any) -> SamplingSession:
        sampler = self.sampling.get(sampling_session_id) if isinstance(sampling_session_id, str) else None
        if sampler is None or not principal.can_see(sampler.owner):
            raise ApiError(
                "session_not_found",
                f"no sampling session {str(sampling_session_id)[:80]!r} is visible to this key; create a SamplingClient",
            )
        owner_session = self._sessions.get(sampler.id.split(":", 1)[0])
        if owner_session is not None:
            self.live(principal, owner_session.id)
        return sampler

    def expired(self, now: float | None = None) -> list[Session]:
        """Sessions whose heartbeats stopped more than the timeout ago (not yet marked ended)."""
        now = time.time() if now is None else now
        return [s for s in self._sessions.values() if s.ended is None and now - s.last_seen > self.timeout_s]

    def end(self, session: Session, reason: str) -> None:
        """Mark the session ended and free what only a live session needs; forget the owner's oldest ended."""
        session.ended = reason
        session.user_metadata = {}
        for sampler_id in session.samplers.values():
            sampler = self.sampling.get(sampler_id)
            if sampler is not None:
                sampler.futures.clear()
        owner = session.principal.owner
        ended = [
            key for key, s in self._sessions.items() if s.ended is not None and s.principal.owner == owner
        ]
        for key in ended[: max(0, len(ended) - ENDED_SESSIONS_KEPT)]:
            for sampler_id in self._sessions[key].samplers.values():
                self.sampling.pop(sampler_id, None)
            del self._sessions[key]

    @staticmethod
    def check_room(session: Session) -> None:
        """Refuse another training or sampling client beyond a session's share."""
        if len(session.models) + len(session.samplers) >= MAX_CLIENTS_PER_SESSION:
            raise ApiError(
                "too_many_sessions",
                f"session {session.id} has made {MAX_CLIENTS_PER_SESSION} training and sampling clients, the"
                " most one may; start a new ServiceClient",
                {"limit": MAX_CLIENTS_PER_SESSION},
            )

    @staticmethod
    def remember_sample(sampler: SamplingSession, seq: int, future_id: str) -> None:
        sampler.futures[seq] = future_id
        while len(sampler.futures) > SAMPLE_SEQS_KEPT:
            del sampler.futures[next(iter(sampler.futures))]

    def sampled_checkpoints(self) -> set[tuple[str, str]]:
        """(job id, checkpoint id) of every checkpoint a sampling client of a live session samples."""
        return {
            self.sampling[sampler_id].checkpoint
            for session in self.all_live()
            for sampler_id in session.samplers.values()
            if sampler_id in self.sampling and self.sampling[sampler_id].checkpoint is not None
        }

    def all_live(self) -> list[Session]:
        return [s for s in self._sessions.values() if s.ended is None]

    def visible(self, principal: Principal) -> list[Session]:
        return [s for s in self._sessions.values() if principal.can_see(s.principal.owner)]
