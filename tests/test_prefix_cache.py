"""Prefix sharing: refcounted pages, LRU eviction, and sessions sharing a 64-token prefix (in process).

The engine here is the peer's own pieces (SessionRegistry, BatchScheduler, StreamHandler._compute,
PageOutputs) around a real Shard, without the network; exact page ids are asserted.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from peer.config import ServingLimits
from peer.handler import ServedModel, StreamHandler, parse_token_ids
from peer.page_outputs import PageOutputs
from peer.prefix_cache import PrefixCache, chain_hashes, root_hash
from peer.scheduler import BatchScheduler
from peer.sessions import SessionRegistry
from shards.batch import BatchLayout
from shards.paging import PagePool, PageTable
from shards.shard import Shard
from swarm.codec import Limits
from swarm.errors import ProtocolError
from swarm.types import LayerRange

PS = 16


# -- metadata only -----------------------------------------------------------------------------------
def test_refcounted_pages_stay_cached_and_are_evicted_lru_after_plain_free_pages() -> None:
    pool = PagePool(6, PS)
    cache = PrefixCache(pool)
    a, b, c = pool.allocate(3)
    for page, h in zip((a, b, c), (b"a", b"b", b"c")):
        assert cache.register(h, page)
    pool.incref([b])  # a second sequence shares b
    pool.free([a])
    pool.free([c])
    pool.free([b])
    assert pool.refcount(b) == 1 and pool.num_free == 5 and pool.num_evictable == 2
    assert cache.lookup([b"a", b"b", b"c"]) == [a, b, c]  # evictable pages are still found
    pool.incref([a]), pool.free([a])  # touched: a is now the most recently used
    assert pool.allocate(3) == [3, 4, 5]  # never-used pages before any cached one
    assert pool.allocate(1) == [c]  # then the least recently used evictable page
    assert cache.lookup([b"c"]) == [] and cache.lookup([b"a"]) == [a]
    assert pool.allocate(1) == [a]
    assert pool.allocate(1) is None, "b is referenced: it is never evicted"
    assert pool.num_free == 0 and cache.lookup([b"b"]) == [b]


def test_free_more_references_than_held_raises_and_changes_nothing() -> None:
    pool = PagePool(4, PS)
    (p,) = pool.allocate(1)
    pool.incref([p])
    with pytest.raises(ValueError, match="twice"):
        pool.free([p, p, p])
    assert pool.refcount(p) == 2
    pool.free([p, p])
    with pytest.raises(ValueError, match="is free"):
        pool.incref([p])


def test_chain_hashes_depend_on_the_whole_prefix_and_namespace() -> None:
    root = root_hash("fp|0:4")
    one = chain_hashes(root, list(range(48)), PS)
    assert len(one) == 3 and len(chain_hashes(root, list(range(47)), PS)) == 2
    other = chain_hashes(root, [99] + list(range(1, 48)), PS)
    assert all(x != y for x, y in zip(one, other)), "a different first token changes every later page"
    assert chain_hashes(root_hash("fp|0:2"), list(range(48)), PS)[0] != one[0]
    assert chain_hashes(one[0], list(range(16, 48)), PS) == one[1:]


def test_token_ids_validation() -> None:
    assert parse_token_ids({}, [2]) is None
    assert parse_token_ids({"token_ids": [[1, 2], [3]]}, [2, 1]) == [[1, 2], [3]]
    for bad in ([[1]], [[1, 2]], [[1, "x"]], [[1, -1]], [[1, 2**31]], [[True, 1]], "12"):
        with pytest.raises(ProtocolError) as caught:
            parse_token_ids({"token_ids": bad}, [2] if bad != [[1, 2]] else [2, 1])
        assert caught.value.code == "bad_field"


# -- the engine in process -----------------------------------------------------------------------------
class Engine:
    # One client fills the whole pool in most tests here: no per-client quota unless a test sets one.
    def __init__(self, shard: Shard, num_pages: int, alloc_timeout: float = 0.2,
                 limits: ServingLimits = ServingLimits(max_client_pages_fraction=1.0)) -> None:
        self.shard = shard
        self.pool = PagePool(num_pages, PS)
        self.cache = shard.new_cache(num_pages, PS)
        self.scheduler = BatchScheduler(lambda h, lo, la, st: shard.forward(h, lo, self.cache, layers=la),
                                        page_size=PS, batch_window=0.0)
        self.registry = SessionRegistry(self.pool, limits, self.copy_page)
        self.registry.fingerprint = shard.fingerprint
        H = shard.config.hidden_size
        self.handler = StreamHandler(ServedModel(LayerRange(0, shard.end), H, torch.float32), self.registry,
                                     self.scheduler, None, Limits(), dict, alloc_timeout, lambda: True)
        self.handler.page_outputs = PageOutputs(num_pages, PS, H, torch.float32)
        self.embed = torch.randn(320, H, generator=torch.Generator().manual_seed(1))  # inputs follow tokens
        self.count = 0

    async def copy_page(self, src: int, dst: int) -> None:
        for k, v in zip(self.cache.k, self.cache.v):
            k[dst], v[dst] = k[src], v[src]
        self.handler.page_outputs.copy(src, dst)

    def open(self, client: str = "client"):
        self.count += 1
        return self.registry.open(f"s{self.count}", client, LayerRange(0, self.shard.end), 256, 1)

    async def step(self, session, ids: list[int], share: bool = True) -> torch.Tensor:
        return await self.handler._compute(session, self.embed[ids], [len(ids)], [ids] if share else None)

    def reference(self, ids: list[int]) -> torch.Tensor:
        """The sequence alone, all at once, in a fresh cache: rows for every position."""
        cache = self.shard.new_cache(17, PS)
        return self.shard.forward(self.embed[ids], BatchLayout([len(ids)], [0], [list(range(17))], PS), cache)


@pytest.fixture
async def engine(tiny_model: Path):
    e = Engine(Shard.from_pretrained(tiny_model, 0, 4), num_pages=12)
    e.scheduler.start()
    yield e
    await e.scheduler.stop()


def close_to(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and (a - b).abs().max().item() < 1e-4


PREFIX = [(7 * i) % 300 + 3 for i in range(64)]  # 64 tokens = 4 full pages


async def test_two_sessions_share_a_64_token_prefix(engine: Engine) -> None:
    a_ids, b_ids = PREFIX + [5, 6, 7, 8, 9], PREFIX + [11, 12]
    a, b = engine.open(), engine.open()
    out_a = await engine.step(a, a_ids)
    assert a.tables[0].pages == [0, 1, 2, 3, 4]
    computed = engine.scheduler.tokens_run
    out_b = await engine.step(b, b_ids)
    assert b.tables[0].pages == [0, 1, 2, 3, 5], "the prefix pages are attached, not allocated"
    assert engine.scheduler.tokens_run - computed == 2, "only the uncached suffix is computed"
    assert [engine.pool.refcount(p) for p in range(6)] == [2, 2, 2, 2, 1, 1]
    assert engine.registry.prefix_tokens == 64
    assert close_to(out_a, engine.reference(a_ids)) and close_to(out_b, engine.reference(b_ids))
    for t in (20, 21, 22):  # decodes of both continue correctly on top of the shared pages
        a_ids.append(t)
        b_ids.append(t + 1)
        assert close_to(await engine.step(a, [t]), engine.reference(a_ids)[-1:])
        assert close_to(await engine.step(b, [t + 1]), engine.reference(b_ids)[-1:])
    await engine.registry.close(a.session_id)
    await engine.registry.close(b.session_id)
    # The pool is empty again; the 4 prefix pages stay cached (free but evictable).
    assert engine.pool.num_free == 12 and engine.pool.num_evictable == 4
    assert engine.registry.stats()["evictable_pages"] == 4
    c = engine.open()
    c_ids = PREFIX + [40]
    assert close_to(await engine.step(c, c_ids), engine.reference(c_ids))
    assert c.tables[0].pages[:4] == [0, 1, 2, 3] and engine.pool.num_evictable == 0
    await engine.registry.close(c.session_id)


async def test_whole_step_from_cache_and_prompt_split_over_steps(engine: Engine) -> None:
    a, b = engine.open(), engine.open()
    await engine.step(a, PREFIX[:40])
    await engine.step(a, PREFIX[40:])  # the pages filled across two steps are registered too
    assert len(engine.registry.prefix) == 4
    before = engine.scheduler.tokens_run
    out = await engine.step(b, PREFIX)  # every row from the cache: no forward pass at all
    assert engine.scheduler.tokens_run == before and b.tables[0].pages == a.tables[0].pages
    assert close_to(out, engine.reference(PREFIX))
    assert close_to(await engine.step(b, [3]), engine.reference(PREFIX + [3])[-1:])


async def test_eviction_frees_lru_unreferenced_pages_never_referenced_ones(engine: Engine) -> None:
    other = [(11 * i) % 300 + 3 for i in range(64)]
    a, keep = engine.open(), engine.open()
    await engine.step(a, PREFIX)  # pages 0-3
    await engine.step(keep, other)  # pages 4-7, held by a live session
    await engine.registry.close(a.session_id)
    assert engine.pool.num_evictable == 4 and engine.pool.num_free == 8
    big = engine.open()
    await engine.step(big, [9] * 80, share=False)  # 5 pages: 8-11 never used, then 1 evicted
    assert big.tables[0].pages == [8, 9, 10, 11, 3], "the deepest prefix page is the least recently used"
    assert engine.registry.prefix.lookup(chain_hashes(root_hash(a.namespace), PREFIX, PS)) == [0, 1, 2]
    starved = engine.open()
    with pytest.raises(ProtocolError) as caught:
        await engine.step(starved, [9] * 64, share=False)  # 4 pages: only 3 evictable left
    assert caught.value.code == "busy" and caught.value.retryable
    assert keep.tables[0].pages == [4, 5, 6, 7] and all(engine.pool.refcount(p) == 1 for p in range(4, 8))
    assert close_to(await engine.step(keep, [1]), engine.reference(other + [1])[-1:])


async def test_pool_full_waits_then_admits_when_a_session_closes(engine: Engine) -> None:
    holders = [engine.open() for _ in range(4)]
    for i, h in enumerate(holders):
        await engine.step(h, [i + 3] * 45, share=False)  # 3 pages each: the pool of 12 is full
    waiter = engine.open()
    engine.handler.alloc_timeout = 5.0
    pending = asyncio.ensure_future(engine.step(waiter, [5] * 20, share=False))
    await asyncio.sleep(0.1)
    assert not pending.done()
    for i, h in enumerate(holders):  # the running sessions keep decoding inside their pages meanwhile
        assert close_to(await engine.step(h, [1], share=False), engine.reference([i + 3] * 45 + [1])[-1:])
    await engine.registry.close(holders[0].session_id)
    out = await asyncio.wait_for(pending, 5)
    assert close_to(out, engine.reference([5] * 20)) and waiter.tables[0].pages == [2, 1]


async def test_truncate_into_a_shared_page_copies_it_first(engine: Engine) -> None:
    a, b = engine.open(), engine.open()
    a_ids = PREFIX + [1, 2]
    await engine.step(a, a_ids)
    await engine.step(b, PREFIX + [3])
    assert b.tables[0].pages[:4] == [0, 1, 2, 3]
    await engine.registry.truncate(b, 40)  # inside shared page 2
    assert b.tables[0].pages == [0, 1, 6], "page 2 copied (copy-on-write), 3 and the tail dropped"
    assert [engine.pool.refcount(p) for p in (0, 1, 2, 3)] == [2, 2, 1, 1]
    b_ids = PREFIX[:40] + [50, 51, 52]
    assert close_to(await engine.step(b, b_ids[40:]), engine.reference(b_ids)[40:])
    a_ids.append(4)
    assert close_to(await engine.step(a, [4]), engine.reference(a_ids)[-1:]), "a's shared pages were not touched"
    # Sole owner of a registered page: truncating into it unregisters it (no copy).
    await engine.registry.close(b.session_id)
    await engine.registry.truncate(a, 50)
    assert a.tables[0].pages == [0, 1, 2, 3] and not engine.registry.prefix.is_registered(3)
    a_ids = a_ids[:50] + [60, 61]
    assert close_to(await engine.step(a, [60, 61]), engine.reference(a_ids)[50:])
    c = engine.open()
    await engine.step(c, PREFIX)
    assert c.tables[0].pages[:3] == [0, 1, 2] and c.tables[0].pages[3] != 3


async def test_a_step_without_token_ids_stops_sharing_for_that_sequence(engine: Engine) -> None:
    a, b = engine.open(), engine.open()
    await engine.step(a, PREFIX[:10], share=False)
    await engine.step(a, PREFIX[10:])
    assert len(engine.registry.prefix) == 0 and a.token_ids == [None]
    await engine.step(b, PREFIX)
    assert len(engine.registry.prefix) == 4 and not set(a.tables[0].pages) & set(b.tables[0].pages)


async def test_prefix_pages_are_shared_only_within_one_client(engine: Engine) -> None:
    # A poisoner prefills junk hidden states under the victim's token ids: its pages stay its own.
    junk = engine.open(client="attacker")
    await engine.handler._compute(junk, torch.randn(64, engine.shard.config.hidden_size), [64], [PREFIX])
    assert len(engine.registry.prefix) == 4
    victim = engine.open(client="victim")
    before = engine.scheduler.tokens_run
    out = await engine.step(victim, PREFIX + [5])
    assert engine.scheduler.tokens_run - before == 65, "the victim computed its prompt itself"
    assert not set(victim.tables[0].pages) & set(junk.tables[0].pages)
    assert close_to(out, engine.reference(PREFIX + [5]))
    again = engine.open(client="victim")  # the victim's own later sessions do share its pages
    await engine.step(again, PREFIX + [6])
    assert again.tables[0].pages[:4] == victim.tables[0].pages[:4]


async def test_prefix_shared_across_clients_when_the_swarm_opts_in(tiny_model: Path) -> None:
    e = Engine(Shard.from_pretrained(tiny_model, 0, 4), num_pages=12,
               limits=ServingLimits(max_client_pages_fraction=1.0, share_prefix_across_clients=True))
    e.scheduler.start()
    try:
        a, b = e.open(client="alice"), e.open(client="bob")
        await e.step(a, PREFIX + [5])
        await e.step(b, PREFIX + [6])
        assert b.tables[0].pages[:4] == a.tables[0].pages[:4] and e.registry.prefix_tokens == 64
    finally:
        await e.scheduler.stop()


async def test_one_client_holds_at_most_its_share_of_the_pool(tiny_model: Path) -> None:
    e = Engine(Shard.from_pretrained(tiny_model, 0, 4), num_pages=12, limits=ServingLimits())  # half: 6 pages
    e.scheduler.start()
    try:
        hog = e.open(client="hog")
        with pytest.raises(ProtocolError) as refused:  # 7 pages in one prefill: refused at once, nothing taken
            await e.step(hog, list(range(3, 3 + 7 * PS)))
        assert refused.value.code == "busy" and refused.value.retryable and "quota" in refused.value.message
        assert hog.tables[0].pages == [] and e.pool.num_free == 12
        await e.step(hog, list(range(3, 3 + 5 * PS)))  # 5 pages fit
        second = e.open(client="hog")  # its other sessions share the same quota
        with pytest.raises(ProtocolError):
            await e.step(second, list(range(100, 100 + 2 * PS)))
        other = e.open(client="other")  # another client still gets its share
        ids = list(range(50, 50 + 5 * PS))
        assert close_to(await e.step(other, ids), e.reference(ids))
        assert e.registry.counters["max_client_pages"] == 2
    finally:
        await e.scheduler.stop()


def test_page_table_attach_only_at_page_boundary() -> None:
    pool = PagePool(4, 4)
    t = PageTable()
    t.reserve(pool, 3)
    with pytest.raises(ValueError, match="boundary"):
        t.attach(pool, [1])


def test_cache_fraction_sizes_the_pool_from_free_memory(tiny_model: Path, monkeypatch) -> None:
    import peer.server as server_module
    from peer.config import PeerConfig
    from peer.server import PeerServer
    from shards.kv_cache import KVCache

    server = PeerServer(PeerConfig(tiny_model, LayerRange(0, 4), "tiny", cache_fraction=0.5, page_size=PS))
    server.layers = LayerRange(0, 4)
    monkeypatch.setattr(server_module, "available_bytes", lambda device: 2**30)
    per_token = KVCache.bytes_per_token(server.model_config, 4, torch.float32) + 64 * 4  # KV + stored output row
    assert server._pool_pages(LayerRange(0, 4)) == 2**29 // (per_token * PS)
    server.config = PeerConfig(tiny_model, LayerRange(0, 4), "tiny", cache_tokens=160, page_size=PS)
    assert server._pool_pages(LayerRange(0, 4)) == 10
