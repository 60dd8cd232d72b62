"""Peer-side inference sessions: one per client stream, each owning page tables in the pool.

Refusals are `ProtocolError`s whose code and message go into the error frame.
The registry enforces the session limits and is the only code that allocates or frees pages,
so "the pool returns to empty when all sessions end" has one place to hold true. Everything
here runs on the event loop thread; the compute thread only reads page ids from layouts.

Admission: pages are taken as sequences grow (`reserve`). When the pool is short, the step
waits up to `alloc_timeout` for pages to be freed, then gets a retryable `busy` error (the
client routes elsewhere); nothing changes for any session on failure. Prefix sharing (see
`peer/prefix_cache.py`): steps that carry token ids attach already-cached full pages instead of
computing them, and register the full pages they compute. Prefix hashes are namespaced by the
owning client's peer id unless `ServingLimits.share_prefix_across_clients`: a client can only
ever attach pages that it computed itself, so junk inputs sent under someone else's token ids
poison nobody but the sender.

Quota: one client (remote peer id) holds at most `max_client_pages_fraction` of the pool over
all its sessions; past it a step is refused at once (`busy`, retryable: route elsewhere) instead
of waiting, since only that client's own sessions could free its pages.

Sliding windows: when every served layer slides (`window` is set), each step first frees the
pages whose keys are older than the window as seen from the sequence's current length (no
query of this step or later reads them), so a long sequence holds about `window` tokens of
pages. A truncate back to the start of the latest step or later (what speculative decoding
does) therefore always works; a deeper one that would need freed keys is refused with a
retryable `out_of_order` error, on which the client replays the history elsewhere.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from peer.config import ServingLimits
from peer.prefix_cache import PrefixCache, chain_hashes, root_hash
from shards.paging import PagePool, PageTable
from swarm.errors import ProtocolError
from swarm.types import LayerRange

# copy_page(src, dst): copy a page's KV (all layers) and cached outputs into a private page.
CopyPage = Callable[[int, int], Awaitable[None]]


@dataclass(eq=False)
class PeerSession:
    session_id: str
    remote: str  # peer id of the client that opened it
    layers: LayerRange
    max_length: int
    tables: list[PageTable]
    namespace: str = ""  # layer range + weights fingerprint (+ client): what a prefix hash is relative to
    # Server-to-server push: the only peer that may push steps into this session, and the secret the
    # client chose at `open` that every push must carry (None: pushes are refused).
    push_from: str | None = None
    push_token: str = ""
    last_active: float = field(default_factory=time.monotonic)
    busy: bool = False  # a step is in flight; a session's steps are strictly sequential
    inflight: asyncio.Future | None = None  # the queued forward pass of that step
    # Per sequence: every token id so far (None once a step came without token ids: no sharing),
    # and the chained hash of each full page.
    token_ids: list[list[int] | None] = field(default_factory=list)
    hashes: list[list[bytes]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.token_ids = [[] for _ in self.tables]
        self.hashes = [[] for _ in self.tables]

    @property
    def lengths(self) -> list[int]:
        return [t.length for t in self.tables]


@dataclass
class Reservation:
    """What `reserve` did: lengths before, and per sequence the leading new tokens served from cache."""

    old_lengths: list[int]
    cached_tokens: list[int]  # per sequence: new tokens covered by attached shared pages
    shared_pages: list[list[int]]  # per sequence: those pages, in order


class SessionRegistry:
    def __init__(self, pool: PagePool, limits: ServingLimits, copy_page: CopyPage | None = None) -> None:
        self.pool = pool
        self.limits = limits
        self.prefix = PrefixCache(pool)
        self.copy_page = copy_page
        self.fingerprint = ""  # of the served weights; set by the server (and after a move)
        self.window: int | None = None  # every served layer slides by at most this; set with the fingerprint
        self.peak_used_pages = 0  # high-water mark of pages in use, for `info`
        self.sessions: dict[str, PeerSession] = {}
        self._per_remote: Counter[str] = Counter()
        self._pages_freed = asyncio.Condition()
        self.counters: Counter[str] = Counter()  # refusals by reason, exported as metrics
        self.prefix_tokens = 0  # new tokens served from shared pages instead of computed

    def use_engine(self, fingerprint: str, window: int | None) -> None:
        """A new engine, with a new KV cache, serves from now on (after a move; its sessions were
        closed): prefix pages cached in the old cache hold nothing there, so they are forgotten."""
        self.prefix.clear()
        self.fingerprint, self.window = fingerprint, window

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
        namespace = f"{self.fingerprint}|{layers.start}:{layers.end}"
        if not self.limits.share_prefix_across_clients:
            namespace += f"|client={remote}"  # see the module docstring: no pages from other clients
        session = PeerSession(session_id, remote, layers, max_length, [PageTable() for _ in range(batch)],
                              namespace=namespace)
        self.sessions[session_id] = session
        self._per_remote[remote] += 1
        return session

    def get(self, session_id: str) -> PeerSession:
        session = self.sessions.get(session_id)
        if session is None:
            raise ProtocolError("no_session", f"no open session {session_id!r} on this peer")
        return session

    @property
    def client_page_cap(self) -> int:
        return max(1, int(self.limits.max_client_pages_fraction * self.pool.num_pages))

    def client_pages(self, remote: str) -> set[int]:
        """The distinct pages referenced by a client's sessions (its own shared prefix pages count once)."""
        return {p for s in self.sessions.values() if s.remote == remote for t in s.tables for p in t.held}

    def _shareable(self, session: PeerSession, token_ids: list[list[int]] | None) -> list[list[int]]:
        """Per sequence, the cached pages this step's new tokens can attach (a run from the start)."""
        ps = self.pool.page_size
        hits: list[list[int]] = []
        for i, table in enumerate(session.tables):
            known = session.token_ids[i]
            if token_ids is None or known is None or table.length % ps:
                hits.append([])
                continue
            parent = session.hashes[i][-1] if session.hashes[i] else root_hash(session.namespace)
            hits.append(self.prefix.lookup(chain_hashes(parent, token_ids[i], ps)))
        return hits

    def _check_quota(self, session: PeerSession, fresh: int, hits: list[list[int]]) -> None:
        """Refuse at once a step that would take its client past its share of the pool."""
        pages = self.client_pages(session.remote)
        held = len(pages) + fresh + len({p for h in hits for p in h} - pages)
        if held > self.client_page_cap:
            self.counters["max_client_pages"] += 1
            raise ProtocolError(
                "busy",
                f"this client would hold {held} KV pages here, over its quota of {self.client_page_cap} "
                f"({self.limits.max_client_pages_fraction:g} of the cache); route to another peer",
                retryable=True,
            )

    async def reserve(
        self,
        session: PeerSession,
        new_tokens: list[int],
        timeout: float,
        token_ids: list[list[int]] | None = None,
    ) -> Reservation:
        """Grow every sequence by its `new_tokens`, waiting up to `timeout` for free pages.

        With `token_ids`, leading full pages that are cached are attached (shared) instead of
        allocated. All-or-nothing: on failure no table changes. The `Reservation` lets a step
        whose forward pass fails `rollback` and leave the session exactly as it was.
        """
        old = session.lengths
        targets = [t.length + n for t, n in zip(session.tables, new_tokens)]
        ps = self.pool.page_size
        deadline = time.monotonic() + timeout
        async with self._pages_freed:
            if self._drop_slid_out(session):
                self._pages_freed.notify_all()
            while True:
                hits = self._shareable(session, token_ids)  # again after each wait: pages may be evicted
                revived = {p for pages in hits for p in pages if self.pool.refcount(p) == 0}
                fresh = sum(-(-target // ps) - len(t.pages) - len(h) for t, target, h in zip(session.tables, targets, hits))
                needed = fresh + len(revived)  # attaching an evictable page takes it off the free count
                if self.limits.max_client_pages_fraction < 1:  # 1: the pool is the only limit
                    self._check_quota(session, fresh, hits)
                if self.pool.num_free >= needed:
                    break
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
            for table, target, shared in zip(session.tables, targets, hits):
                table.attach(self.pool, shared)
                ok = table.reserve(self.pool, target)
                assert ok, "pages were counted free just before"  # single-threaded: cannot race
        self.peak_used_pages = max(self.peak_used_pages, self.pool.num_pages - self.pool.num_free)
        cached = [len(h) * ps for h in hits]
        self.prefix.hits += sum(len(h) for h in hits)
        self.prefix_tokens += sum(cached)
        session.last_active = time.monotonic()
        return Reservation(old, cached, hits)

    def _drop_slid_out(self, session: PeerSession) -> int:
        """Free every page whose keys all lie before the window of a query at the current length."""
        if self.window is None:
            return 0
        # A query at position q reads keys q - window < j <= q (the mask in `shards.batch`).
        return sum(t.drop_before(self.pool, t.length - self.window + 1) for t in session.tables)

    def commit(self, session: PeerSession, token_ids: list[list[int]] | None) -> None:
        """A step succeeded: extend the token record and register the full pages it completed.

        Call only after the page's KV and its output rows are stored (the handler does both).
        """
        ps = self.pool.page_size
        for i, table in enumerate(session.tables):
            known = session.token_ids[i]
            if known is None or token_ids is None:
                session.token_ids[i], session.hashes[i] = None, []  # no token ids: this sequence shares nothing
                continue
            known.extend(token_ids[i])
            hashes = session.hashes[i]
            start = len(hashes) * ps
            parent = hashes[-1] if hashes else root_hash(session.namespace)
            for k, h in enumerate(chain_hashes(parent, known[start : len(known) // ps * ps], ps), len(hashes)):
                hashes.append(h)
                page = table.pages[k]
                if self.pool.refcount(page) == 1 and not self.prefix.is_registered(page):
                    self.prefix.register(h, page)

    async def rollback(self, session: PeerSession, reservation: Reservation | list[int]) -> None:
        """Undo a `reserve` whose step failed, so a failed step never leaves half-written state."""
        if self.sessions.get(session.session_id) is not session:
            return  # closed meanwhile; its pages are already free
        old_lengths = reservation.old_lengths if isinstance(reservation, Reservation) else reservation
        for table, length in zip(session.tables, old_lengths):
            table.truncate(self.pool, length)  # the page at `length` was partial: never shared
        await self._notify()

    async def truncate(self, session: PeerSession, length: int) -> None:
        """Cut every sequence to `length`; a cut inside a shared page first takes a private copy.

        Later writes go to positions >= `length`, so the page holding `length` must be private:
        if it is registered but used only by us it is unregistered; if others use it too, its
        content is copied into a fresh page (copy-on-write) and our reference moves there.
        """
        for table in session.tables:
            if length > table.length:
                raise ProtocolError("bad_field", f"cannot truncate to {length}: sequence has {table.length} tokens")
            kept_from = table.dropped * self.pool.page_size  # first position whose keys are still held
            if length and self.window is not None and length - self.window + 1 < kept_from:
                raise ProtocolError(  # a failover code: the client replays the history elsewhere
                    "out_of_order",
                    f"cannot truncate to {length}: keys before position {kept_from} slid out of the "
                    f"{self.window}-token window and were freed; replay the history into a new session",
                    retryable=True,
                )
        ps = self.pool.page_size
        for i, table in enumerate(session.tables):
            if length % ps and length < table.length:
                index = length // ps
                await self._make_private(table, index)
            table.truncate(self.pool, length)
            if session.token_ids[i] is not None:
                session.token_ids[i] = session.token_ids[i][:length]
            session.hashes[i] = session.hashes[i][: length // ps]
            if length == 0:
                session.token_ids[i] = []  # a fresh start may share again
        await self._notify()

    async def _make_private(self, table: PageTable, index: int) -> None:
        page = table.pages[index]
        if self.pool.refcount(page) == 1:
            self.prefix.unregister(page)  # no-op for a private page
            return
        copy = self.pool.allocate(1)
        if copy is None:
            self.counters["no_pages"] += 1
            raise ProtocolError("busy", "KV cache full: no page for a copy-on-write truncate", retryable=True)
        if self.copy_page is not None:
            try:
                await self.copy_page(page, copy[0])
            except BaseException:
                self.pool.free(copy)
                raise
        table.pages[index] = copy[0]
        self.pool.free([page])

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

    def stats(self) -> dict[str, int]:
        """Pool and prefix-cache numbers for `info`: evictable pages are free but still cached."""
        pool = self.pool
        return {
            "free_pages": pool.num_free,
            "evictable_pages": pool.num_evictable,
            "used_pages": pool.num_pages - pool.num_free,
            "cached_prefix_pages": len(self.prefix),
            "prefix_hits_pages": self.prefix.hits,
            "prefix_tokens": self.prefix_tokens,
            "evictions": pool.evictions,
            "peak_used_pages": self.peak_used_pages,
        }

    async def _notify(self) -> None:
        async with self._pages_freed:
            self._pages_freed.notify_all()
