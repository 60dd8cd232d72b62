"""The `view` request: the records this peer currently sees for a model, bounded in count and size.

A client that can only open streams (no DHT code: another libp2p implementation, another
language) asks any peer it can reach for the swarm's records and plans its route from them.
The records are the ones this peer's DHT reader kept (`SwarmNode.fetch_view_async`: malformed,
mislabelled or wrongly signed values are already dropped there).

Cost to the peer: one DHT read per model per VIEW_CACHE_SECONDS at most, whatever the request
rate; concurrent requests wait for the same read (one lock), and at most MAX_CACHED_MODELS
models are remembered. The reply is at most MAX_VIEW_RECORDS records and MAX_VIEW_BYTES bytes.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import msgpack

from swarm import messages as m
from swarm.errors import ProtocolError
from swarm.types import PeerRecord, PeerState, SwarmView

MAX_VIEW_RECORDS = 256  # a route needs a handful of peers; 256 covers a large swarm's candidates
MAX_VIEW_BYTES = 512 * 1024  # ~2 KiB per record (bounded by PeerRecord.from_dict) times the count
VIEW_CACHE_SECONDS = 2.0  # records change every ~ttl/3 (10 s): 2 s old is fresh enough to route on
VIEW_FETCH_TIMEOUT = 15.0  # seconds for one DHT read before the client gets a retryable `timeout`
MAX_CACHED_MODELS = 8
MAX_MODEL_NAME = 256

NOT_SERVING = (PeerState.JOINING, PeerState.OFFLINE)

FetchView = Callable[[str], Awaitable[SwarmView]]


@dataclass(frozen=True)
class ViewReply:
    """The `view` reply: a model's records, best first, and whether some were left out."""

    model: str
    num_layers: int
    records: tuple[PeerRecord, ...]
    truncated: bool

    def to_wire(self) -> dict[str, Any]:
        return {"type": m.VIEW, "model": self.model, "num_layers": self.num_layers,
                "records": [r.to_dict() for r in self.records], "truncated": self.truncated}


def rank(record: PeerRecord) -> tuple[bool, float, str]:
    """Serving peers first, fastest first; peer id breaks ties so the order is stable."""
    return (record.state in NOT_SERVING, -record.throughput, record.peer_id)


def bounded_reply(view: SwarmView, max_records: int = MAX_VIEW_RECORDS, max_bytes: int = MAX_VIEW_BYTES) -> ViewReply:
    """The best records of `view` that fit in `max_records` and `max_bytes` (msgpack size of the records)."""
    kept: list[PeerRecord] = []
    size = 0
    ranked = sorted(view.records.values(), key=rank)
    for record in ranked[:max_records]:
        size += len(msgpack.packb(record.to_dict(), use_bin_type=True))
        if size > max_bytes:
            break
        kept.append(record)
    return ViewReply(view.model, view.num_layers, tuple(kept), truncated=len(kept) < len(ranked))


class ViewService:
    """Answers `view` requests from a cache of recent DHT reads (see the module docstring)."""

    def __init__(self, fetch: FetchView, default_model: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.fetch = fetch
        self.default_model = default_model  # the model this peer serves: what `view` without `model` means
        self.clock = clock
        self._cache: OrderedDict[str, tuple[float, SwarmView]] = OrderedDict()
        self._lock = asyncio.Lock()

    async def answer(self, msg: dict[str, Any]) -> dict[str, Any]:
        """The reply to a `view` message `{model?: str}` (default: this peer's model)."""
        model = m.require_str(msg, "model", max_len=MAX_MODEL_NAME, default=self.default_model)
        return bounded_reply(await self.current(model)).to_wire()

    async def current(self, model: str) -> SwarmView:
        async with self._lock:
            cached = self._cache.get(model)
            if cached is not None and self.clock() - cached[0] < VIEW_CACHE_SECONDS:
                return cached[1]
            try:
                view = await asyncio.wait_for(self.fetch(model), VIEW_FETCH_TIMEOUT)
            except asyncio.TimeoutError:
                raise ProtocolError("timeout", f"reading the DHT for {model!r} took over {VIEW_FETCH_TIMEOUT:g} s; "
                                    "retry or ask another peer", retryable=True) from None
            self._cache[model] = (self.clock(), view)
            self._cache.move_to_end(model)
            while len(self._cache) > MAX_CACHED_MODELS:
                self._cache.popitem(last=False)
            return view
