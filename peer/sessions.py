"""Peer-side inference sessions: one per client stream, each owning page tables in the pool.

Refusals are `ProtocolError`s whose code and message go into the error frame.
The registry enforces the session limits and is the only code that allocates or frees pages,
so "the pool returns to empty when all sessions end" has one place to hold true. Everything
here runs on the event loop thread; the compute thread only reads page ids from layouts.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field

from peer.config import ServingLimits
from shards.paging import PagePool, PageTable
from swarm.errors import ProtocolError
from swarm.types import LayerRange


@dataclass(eq=False)
class PeerSession:
    session_id: str
    remote: str  # peer id of the client that opened it
    layers: LayerRange
    max_length: int
    tables: list[PageTable]
    last_active: float = field(default_factory=time.monotonic)
    busy: bool = False  # a step is in flight; a session's steps are strictly sequential
    inflight: asyncio.Future | None = None  # the queued forward pass of that step

    @property
    def lengths(self) -> list[int]:
        return [t.length for t in self.tables]


class SessionRegistry:
    def __init__(self, pool: PagePool, limits: ServingLimits) -> None:
        self.pool = pool
        self.limits = limits
        self.sessions: dict[str, PeerSession] = {}
        self._per_remote: Counter[str] = Counter()
        self._pages_freed = asyncio.Condition()
        self.counters: Counter[str] = Counter()  # refusals by reason, exported as metrics

    def open(
        self,
        session_id: str,
        remote: str,
        layers: LayerRange,
        max_length: int,
        batch: int,
    ) -> PeerSession:
        if session_id in self.sessions:
            raise ProtocolError("session_exists", f"session {session_id!r} is already open on this peer")
        if max_length > self.limits.max_length:
            self.counters["max_length"] += 1
            raise ProtocolError(
                "too_long",
                f"max_length {max_length} exceeds this peer's limit of {self.limits.max_length} tokens",
            )
        if batch > self.limits.max_batch:
            self.counters["max_batch"] += 1
            raise ProtocolError("limit", f"batch {batch} exceeds the limit {self.limits.max_batch}")
        if len(self.sessions) >= self.limits.max_sessions:
            self.counters["max_sessions"] += 1
            raise ProtocolError("busy", "this peer has too many open sessions; try another peer", True)
        if self._per_remote[remote] >= self.limits.max_sessions_per_remote:
            self.counters["max_sessions_per_remote"] += 1
            raise ProtocolError(
                "too_many_sessions", f"at most {self.limits.max_sessions_per_remote} sessions per client", True
            )
        session = PeerSession(session_id, remote, layers, max_length, [PageTable() for _ in range(batch)])
        self.sessions[session_id] = session
        self._per_remote[remote] += 1
        return session

    def get(self, session_id: str) -> PeerSession:
        session = self.sessions.get(session_id)
        if session is None:
            raise ProtocolError("no_session", f"no open session {session_id!r} on this peer")
        return session

    async def reserve(self, session: PeerSession, new_tokens: list[int], timeout: float) -> list[int]:
        """Grow every sequence by its `new_tokens`, waiting up to `timeout` for free pages.

        All-or-nothing: on failure no table changes. Returns the previous lengths, so a step
        whose forward pass fails can `rollback` and leave the session exactly as it was.
        """
        old = session.lengths
        targets = [t.length + n for t, n in zip(session.tables, new_tokens)]
        needed = sum(t.pages_needed(target, self.pool.page_size) for t, target in zip(session.tables, targets))
        deadline = time.monotonic() + timeout
        async with self._pages_freed:
            while self.pool.num_free < needed:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    self.counters["no_pages"] += 1
                    raise ProtocolError(
                        "busy",
                        f"KV cache full: need {needed} pages, {self.pool.num_free} free after {timeout:.1f}s; "
                        "route to another peer",
                        retryable=True,
                    )
                try:
                    await asyncio.wait_for(self._pages_freed.wait(), remaining)
                except asyncio.TimeoutError:
                    pass
            for table, target in zip(session.tables, targets):
                ok = table.reserve(self.pool, target)
                assert ok, "pages were counted free just before"  # single-threaded: cannot race
        session.last_active = time.monotonic()
        return old

    async def rollback(self, session: PeerSession, old_lengths: list[int]) -> None:
        """Undo a `reserve` whose step failed, so a failed step never leaves half-written state."""
        if self.sessions.get(session.session_id) is not session:
            return  # closed meanwhile; its pages are already free
        for table, length in zip(session.tables, old_lengths):
            table.truncate(self.pool, length)
        await self._notify()

    async def truncate(self, session: PeerSession, length: int) -> None:
        for table in session.tables:
            if length > table.length:
                raise ProtocolError("bad_field", f"cannot truncate to {length}: sequence has {table.length} tokens")
        for table in session.tables:
            table.truncate(self.pool, length)
        await self._notify()

    async def close(self, session_id: str) -> None:
        session = self.sessions.pop(session_id, None)
        if session is None:
            return
        if session.inflight is not None:
            # A queued step must not run on pages that are about to be handed to someone else.
            session.inflight.cancel()
        self._per_remote[session.remote] -= 1
        if self._per_remote[session.remote] <= 0:
            del self._per_remote[session.remote]
        for table in session.tables:
            table.release(self.pool)
        await self._notify()

    async def close_idle(self, now: float | None = None) -> list[str]:
        now = time.monotonic() if now is None else now
        idle = [
            sid
            for sid, s in self.sessions.items()
            if not s.busy and now - s.last_active > self.limits.idle_timeout
        ]
        for sid in idle:
            await self.close(sid)
        return idle

    async def _notify(self) -> None:
        async with self._pages_freed:
            self._pages_freed.notify_all()
