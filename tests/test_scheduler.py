"""BatchScheduler: batched forward == unbatched per sequence (real Shard), window, chunking, fairness."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest
import torch

from peer.scheduler import AGING_ROUNDS, BatchScheduler, WorkItem
from shards.batch import BatchLayout
from shards.paging import PagePool, PageTable
from shards.shard import Shard

PS = 4  # page size


def item(hidden: torch.Tensor, new: list[int], cached: list[int], tables: list[list[int]] | None,
         priority: int = 0, layers: tuple[int, int] = (0, 1), owner: str | None = None) -> WorkItem:
    return WorkItem(hidden, new, cached, tables, layers, asyncio.get_running_loop().create_future(), priority,
                    owner=owner)


class Recorder:
    """A fake forward pass: output = input + 1; records each batch's layout (and can be slow)."""

    def __init__(self, delay: float = 0.0) -> None:
        self.layouts: list[BatchLayout] = []
        self.delay = delay

    def __call__(self, hidden, layout, layers, stateful):
        self.layouts.append(layout)
        if self.delay:
            time.sleep(self.delay)
        return hidden + 1


async def test_batched_forward_equals_unbatched_per_sequence(tiny_model_factory) -> None:
    path: Path = tiny_model_factory("gqa")
    shard = Shard.from_pretrained(path, 0, 5)
    pool = PagePool(64, PS)
    cache = shard.new_cache(64, PS)
    scheduler = BatchScheduler(lambda h, lo, la, st: shard.forward(h, lo, cache, layers=la),
                               page_size=PS, max_batch_tokens=24, batch_window=0.0)
    scheduler.start()
    torch.manual_seed(0)
    H = shard.config.hidden_size
    # Per sequence, the new tokens of each round: prefills of different lengths (one longer than
    # the 24-token budget, so it is chunked), then decodes and a second prefill chunk in between.
    rounds = [[13, 30, 5, 1], [1, 1, 7, 1], [1, 3, 1, 1], [1, 1, 1, 9]]
    tables = [PageTable() for _ in range(4)]
    refs = [(shard.new_cache(16, PS), list(range(16))) for _ in range(4)]  # each sequence alone
    try:
        for r, new in enumerate(rounds):
            inputs = [torch.randn(n, H) for n in new]
            cached = [t.length for t in tables]
            items = []
            for t, x, n in zip(tables, inputs, new):
                assert t.reserve(pool, t.length + n)
                items.append(item(x, [n], [t.length - n], [t.pages], layers=(0, 5)))
            outputs = await asyncio.gather(*(scheduler.submit(it) for it in items))
            for i, (x, out) in enumerate(zip(inputs, outputs)):
                ref_cache, ref_pages = refs[i]
                expected = shard.forward(x, BatchLayout([x.shape[0]], [cached[i]], [ref_pages], PS), ref_cache)
                diff = (out - expected).abs().max().item()
                assert diff < 1e-4, f"round {r}, sequence {i}: max abs diff {diff}"
        assert scheduler.batches_run < scheduler.sequences_run, "no batch held more than one sequence"
        assert scheduler.max_batch_sequences == 4
    finally:
        await scheduler.stop()


async def test_long_prefill_is_chunked_and_decodes_go_first() -> None:
    rec = Recorder()
    scheduler = BatchScheduler(rec, page_size=PS, max_batch_tokens=16, batch_window=0.0)
    scheduler.start()
    try:
        prefill = item(torch.zeros(100, 2), [100], [0], [list(range(25))])
        decodes = [item(torch.zeros(1, 2), [1], [7], [[30 + i, 40 + i]]) for i in range(3)]
        futures = [scheduler.submit(prefill)] + [scheduler.submit(d) for d in decodes]
        out = await futures[1]
        assert out.shape == (1, 2)
        assert not futures[0].done(), "the decodes finished while the prefill still had chunks to go"
        await asyncio.gather(*futures)
        first = rec.layouts[0]
        assert first.new_tokens == [1, 1, 1, 13]  # decodes first, then a prefill chunk fills the budget
        assert all(lo.num_tokens <= 16 for lo in rec.layouts)
        assert sum(lo.new_tokens[-1] for lo in rec.layouts if lo.num_tokens > 3 or len(lo.new_tokens) == 1) == 100
        assert torch.equal(futures[0].result(), torch.ones(100, 2))
    finally:
        await scheduler.stop()


async def test_window_gathers_steps_of_many_sessions_into_one_batch() -> None:
    async def run(window: float) -> BatchScheduler:
        scheduler = BatchScheduler(Recorder(delay=0.005), page_size=PS, batch_window=window)
        scheduler.start()

        async def session(i: int) -> None:
            for step in range(10):
                await asyncio.sleep(0.001 * (i % 4))  # clients answer at slightly different times
                await scheduler.submit(item(torch.zeros(1, 2), [1], [step], [[3 * i, 3 * i + 1, 3 * i + 2]],
                                            owner=f"s{i}"))

        await asyncio.gather(*(session(i) for i in range(16)))
        await scheduler.stop()
        return scheduler

    gathered = await run(0.02)
    assert gathered.sequences_run == 160
    # The first batch starts at once (nobody is known to be coming); the two groups it leaves
    # merge again within a step or two and stay merged: no alternating half batches.
    assert gathered.batches_run <= 13, f"{gathered.batches_run} batches for 10 steps of 16 sessions"
    eager = await run(0.0)
    assert eager.batches_run > gathered.batches_run


async def test_lone_session_does_not_wait_for_the_window() -> None:
    scheduler = BatchScheduler(Recorder(), page_size=PS, batch_window=1.0)
    scheduler.start()
    try:
        started = time.monotonic()
        for step in range(5):
            await scheduler.submit(item(torch.zeros(1, 2), [1], [step], [[0, 1]], owner="alone"))
        assert time.monotonic() - started < 0.5
    finally:
        await scheduler.stop()


async def test_no_batching_runs_one_item_per_forward() -> None:
    rec = Recorder()
    scheduler = BatchScheduler(rec, page_size=PS, enabled=False)
    scheduler.start()
    try:
        items = [item(torch.zeros(2, 2), [1, 1], [0, 0], [[i], [i + 8]]) for i in range(4)]
        await asyncio.gather(*(scheduler.submit(it) for it in items))
        assert scheduler.batches_run == 4 and [lo.new_tokens for lo in rec.layouts] == [[1, 1]] * 4
    finally:
        await scheduler.stop()


async def test_low_priority_item_is_not_starved() -> None:
    """One item per pass and a constant stream of priority-0 work: aging still lets priority 3 run."""
    rec = Recorder()
    scheduler = BatchScheduler(rec, page_size=PS, enabled=False, batch_window=0.0)
    scheduler.start()
    stop = asyncio.Event()

    async def busy_session(i: int) -> None:
        while not stop.is_set():
            await scheduler.submit(item(torch.zeros(1, 2), [1], [0], [[i]]))

    sessions = [asyncio.get_running_loop().create_task(busy_session(i)) for i in range(3)]
    try:
        await asyncio.sleep(0.01)
        low = item(torch.zeros(1, 2), [1], [0], [[9]], priority=3)
        before = scheduler.batches_run
        await asyncio.wait_for(scheduler.submit(low), 10)
        waited = scheduler.batches_run - before
        assert waited <= 3 * AGING_ROUNDS + 4, f"waited {waited} rounds"
        assert waited > 3, "priority had no effect"
    finally:
        stop.set()
        await asyncio.gather(*sessions)
        await scheduler.stop()


async def test_failing_forward_fails_its_items_only() -> None:
    calls = []

    def flaky(hidden, layout, layers, stateful):
        calls.append(layout)
        if len(calls) == 1:
            raise RuntimeError("boom")
        return hidden

    scheduler = BatchScheduler(flaky, page_size=PS, batch_window=0.0)
    scheduler.start()
    try:
        with pytest.raises(RuntimeError, match="boom"):
            await scheduler.submit(item(torch.zeros(1, 2), [1], [0], [[0]]))
        assert (await scheduler.submit(item(torch.ones(1, 2), [1], [0], [[0]]))).sum() == 2
    finally:
        await scheduler.stop()


async def test_inline_batches_run_on_the_loop_unless_the_compute_thread_is_busy() -> None:
    """Batches the `inline` test accepts run on the event loop's thread, with the same results; while
    a `run_exclusive` job still runs on the compute thread they go there instead, after it."""
    threads: list[str] = []

    def run(hidden, layout, layers, stateful):
        threads.append(threading.current_thread().name)
        return hidden + 1

    decode_only = lambda hidden, layout, layers, stateful: all(n == 1 for n in layout.new_tokens)  # noqa: E731
    scheduler = BatchScheduler(run, page_size=PS, batch_window=0.0, inline=decode_only)
    scheduler.start()
    loop_thread = threading.current_thread().name
    try:
        x = torch.randn(1, 8)
        out = await scheduler.submit(item(x, [1], [0], [[0]]))
        assert torch.equal(out, x + 1) and threads == [loop_thread]
        prefill = torch.randn(5, 8)
        out = await scheduler.submit(item(prefill, [5], [0], [[0, 1]]))  # refused by the test: compute thread
        assert torch.equal(out, prefill + 1) and threads[-1] != loop_thread
        release, started = threading.Event(), threading.Event()

        def page_copy() -> str:
            started.set()
            release.wait(5)
            return threading.current_thread().name

        job = asyncio.ensure_future(scheduler.run_exclusive(page_copy))
        await asyncio.get_running_loop().run_in_executor(None, started.wait, 5)
        step = scheduler.submit(item(x, [1], [1], [[0]]))
        await asyncio.sleep(0.05)
        assert not step.done()  # queued behind the page copy on the compute thread, not run beside it
        release.set()
        compute_thread = await job
        assert torch.equal(await step, x + 1) and threads[-1] == compute_thread != loop_thread
        assert scheduler.stats()["inline_batches"] == 1
        await scheduler.submit(item(x, [1], [2], [[0]]))
        assert threads[-1] == loop_thread  # the job has ended: inline again
    finally:
        await scheduler.stop()
