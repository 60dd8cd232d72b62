"""The `view` request: the signed records this peer currently sees for a model, bounded in count and size.

A client that can only open streams (no DHT code: another libp2p implementation, another
language) asks any peer it can reach for the swarm's records and plans its route from them.
Each record travels exactly as its owner signed it in the DHT (`swarm.records.SignedRecord`),
so the client checks every signature itself and need not trust the peer it asks
(docs/protocol.md, "Signed records"). The records are the ones this peer's DHT reader kept
(`SwarmNode.fetch_signed_view_async`): malformed, mislabelled or wrongly signed values are
dropped there, and every relayed signature was verified there.

Cost to the peer: one DHT read per model per VIEW_CACHE_SECONDS at most, whatever the request
rate; concurrent requests wait for the same read (one lock), and at most MAX_CACHED_MODELS
models are remembered. The reply is at most MAX_VIEW_RECORDS records and MAX_VIEW_BYTES bytes.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from swarm.errors import ProtocolError
from swarm.records import SignedRecord
from swarm.schema import MAX_VIEW_RECORDS, View, ViewReply
from swarm.types import PeerRecord, PeerState, SwarmView

MAX_VIEW_BYTES = 512 * 1024  # ~2.5 KiB per signed record (bounded by swarm.schema) times the count
VIEW_CACHE_SECONDS = 2.0  # records change every ~ttl/3 (10 s): 2 s old is fresh enough to route on
VIEW_FETCH_TIMEOUT = 15.0  # seconds for one DHT read before the client gets a retryable `timeout`
MAX_CACHED_MODELS = 8
RECORD_OVERHEAD = 64  # msgpack map keys and headers around one signed record's bytes

NOT_SERVING = (PeerState.JOINING, PeerState.OFFLINE)

SignedView = tuple[SwarmView, Mapping[str, SignedRecord]]  # the view, and each record's signed DHT value
FetchSignedView = Callable[[str], Awaitable[SignedView]]


def rank(record: PeerRecord) -> tuple[bool, float, str]:
    """Serving peers first, fastest first; peer id breaks ties so the order is stable."""
    return (record.state in NOT_SERVING, -record.throughput, record.peer_id)


def bounded_reply(view: SwarmView, signed: Mapping[str, SignedRecord], max_records: int = MAX_VIEW_RECORDS,
                  max_bytes: int = MAX_VIEW_BYTES) -> ViewReply:
    """The signed values of the best records of `view` that fit in `max_records` and `max_bytes`.

    A record without a signed value in `signed` is never relayed.
    """
    kept: list[SignedRecord] = []
    size = 0
    ranked = sorted((r for r in view.records.values() if r.peer_id in signed), key=rank)
    for record in ranked[:max_records]:
        entry = signed[record.peer_id]
        size += len(entry.subkey) + len(entry.value) + RECORD_OVERHEAD
        if size > max_bytes:
            break
        kept.append(entry)
    return ViewReply(view.model, view.num_layers, tuple(kept), truncated=len(kept) < len(view.records))


class ViewService:
    """Answers `view` requests from a cache of recent DHT reads (see the module docstring)."""

    def __init__(self, fetch: FetchSignedView, default_model: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.fetch = fetch
        self.default_model = default_model  # the model this peer serves: what `view` without `model` means
        self.clock = clock
        self._cache: OrderedDict[str, tuple[float, SignedView]] = OrderedDict()
        self._lock = asyncio.Lock()

    async def answer(self, request: View) -> dict[str, Any]:
        """The reply to a `view` request (default model: this peer's)."""
        return bounded_reply(*await self.current(request.model or self.default_model)).to_wire()

    async def current(self, model: str) -> SignedView:
        async with self._lock:
            cached = self._cache.get(model)
            if cached is not None and self.clock() - cached[0] < VIEW_CACHE_SECONDS:
                return cached[1]
            try:
                found = await asyncio.wait_for(self.fetch(model), VIEW_FETCH_TIMEOUT)
            except asyncio.TimeoutError:
                raise ProtocolError("timeout", f"reading the DHT for {model!r} took over {VIEW_FETCH_TIMEOUT:g} s; "
                                    "retry or ask another peer", retryable=True) from None
            self._cache[model] = (self.clock(), found)
            self._cache.move_to_end(model)
            while len(self._cache) > MAX_CACHED_MODELS:
                self._cache.popitem(last=False)
            return found
