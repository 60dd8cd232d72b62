"""Sliding windows: KV pages whose keys slid out of every served layer's window are freed.

Metadata (SessionRegistry + PagePool, exact page ids), then a Mistral-style tiny model run by the
peer's own pieces (registry, scheduler, `StreamHandler._compute`) in a pool too small to hold the
sequence without freeing: every output row equals the whole sequence run at once. The same
through real peers is `tests/test_families.py::test_long_context_past_many_windows_keeps_pages_bounded`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from peer.config import ServingLimits
from peer.sessions import SessionRegistry
from shards.config import ModelConfig
from shards.paging import DROPPED, PagePool
from shards.shard import Shard
from swarm.errors import ProtocolError
from swarm.types import LayerRange
from tests.test_prefix_cache import PS, Engine, close_to

D = DROPPED


def registry(num_pages: int, window: int | None) -> SessionRegistry:
    reg = SessionRegistry(PagePool(num_pages, 4), ServingLimits(max_client_pages_fraction=1.0))
    reg.window = window
    return reg


async def grow(reg: SessionRegistry, session, steps: int, ids: list[int] | None = None) -> None:
    """`steps` decode steps of one token (with token ids when `ids` is given), each committed."""
    for _ in range(steps):
        token = [[ids[session.tables[0].length]]] if ids is not None else None
        await reg.reserve(session, [1], 0.1, token)
        reg.commit(session, token)


async def test_steps_free_the_pages_older_than_the_window_and_a_deep_truncate_is_refused() -> None:
    reg = registry(16, window=8)
    s = reg.open("s", "client", LayerRange(0, 2), 64, 1)
    await reg.reserve(s, [10], 0.1)
    assert s.tables[0].pages == [0, 1, 2]
    await grow(reg, s, 10)  # the last step started at length 19: its query sees keys 12..19
    assert s.tables[0].pages == [D, D, D, 3, 4] and reg.pool.num_free == 14
    assert reg.peak_used_pages == 3 and reg.stats()["peak_used_pages"] == 3
    await reg.truncate(s, 19)  # back to the start of the latest step (speculative decoding): allowed
    with pytest.raises(ProtocolError, match="slid out of the 8-token window") as refused:
        await reg.truncate(s, 18)  # a query at 18 would need key 11, in freed page 2
    assert refused.value.code == "out_of_order" and refused.value.retryable  # the client fails over and replays
    assert s.tables[0].length == 19
    await reg.close("s")
    assert reg.pool.num_free == 16


async def test_a_range_with_a_global_layer_keeps_every_page() -> None:
    reg = registry(16, window=None)
    s = reg.open("s", "client", LayerRange(0, 2), 64, 1)
    await reg.reserve(s, [10], 0.1)
    await grow(reg, s, 10)
    assert s.tables[0].pages == [0, 1, 2, 3, 4] and s.tables[0].dropped == 0


async def test_freed_prefix_pages_stay_cached_for_the_next_session() -> None:
    reg = registry(16, window=8)
    ids = list(range(3, 40))
    a = reg.open("a", "client", LayerRange(0, 2), 64, 1)
    await reg.reserve(a, [10], 0.1, [ids[:10]])
    reg.commit(a, [ids[:10]])
    await grow(reg, a, 14, ids)  # length 24: pages 0..3 freed, registered ones stay evictable
    assert a.tables[0].pages[:4] == [D] * 4 and reg.pool.num_evictable == 4
    b = reg.open("b", "client", LayerRange(0, 2), 64, 1)
    res = await reg.reserve(b, [10], 0.1, [ids[:10]])
    assert res.shared_pages == [[0, 1]] and res.cached_tokens == [8]
    await reg.close("a")
    await reg.close("b")
    assert reg.pool.num_free == 16


def test_only_ranges_made_of_sliding_layers_have_a_common_window(tiny_model_factory: Callable[..., Path]) -> None:
    gemma3 = ModelConfig.from_pretrained(tiny_model_factory("gemma3"))  # sliding, sliding, full, sliding
    assert [gemma3.common_window(*r) for r in ((0, 2), (0, 3), (2, 4), (3, 4))] == [8, None, None, 8]
    assert ModelConfig.from_pretrained(tiny_model_factory("mistral_window")).common_window(0, 4) == 8
    assert ModelConfig.from_pretrained(tiny_model_factory("llama")).common_window(0, 4) is None


async def test_long_sequence_in_a_pool_smaller_than_it_matches_the_whole_run(tiny_model_factory) -> None:
    """80 tokens (5 pages of 16) through a 3-page pool: the window (8) keeps at most 2 pages in use,
    and every output row (prefix sharing on, so freed pages are also registered ones) equals the
    sequence computed at once."""
    shard = Shard.from_pretrained(tiny_model_factory("mistral_window"), 0, 4)
    engine = Engine(shard, num_pages=3)
    engine.registry.window = shard.config.common_window(0, 4)
    engine.scheduler.start()
    try:
        ids = [(11 * i) % 300 + 3 for i in range(80)]
        session = engine.open()
        rows = [await engine.step(session, ids[:20])]
        for t in range(20, 80):
            rows.append(await engine.step(session, [ids[t]]))
        want = engine.reference(ids)
        assert close_to(rows[0], want[:20])
        for t, row in zip(range(20, 80), rows[1:]):
            assert close_to(row, want[t : t + 1]), f"position {t}"
        assert session.tables[0].dropped == 4 and engine.registry.peak_used_pages <= 2
    finally:
        await engine.scheduler.stop()
    assert PS == 16
