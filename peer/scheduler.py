"""Continuous batching: steps of many sessions become one forward pass of the served layers.

Handlers submit `WorkItem`s and await their futures. One asyncio task gathers whatever is queued
(waiting `batch_window` seconds for more only while the compute thread is busy), packs the tokens
of several sessions into one ragged `BatchLayout` and runs it on a single compute thread, so the
event loop keeps answering the network while the model runs.

Long prefills are cut into chunks of at most `max_chunk_tokens`, so a 2,000-token prompt never
stalls the one-token decodes of other sessions: decodes are packed first in every round, then
prefill chunks fill the remaining token budget, oldest first (no session starves: every queued
item is at least partly served within a bounded number of rounds).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from shards.batch import BatchLayout

logger = logging.getLogger(__name__)

# run_batch(hidden (N, H), layout, layers (a, b), stateful) -> (N, H)
RunBatch = Callable[[torch.Tensor, BatchLayout, tuple[int, int], bool], torch.Tensor]


@dataclass(eq=False)
class WorkItem:
    """One request: the new tokens of one or more sequences through layers `layers`.

    `page_tables` is None for stateless forwards. `done[i]` counts how many of sequence i's
    new tokens were already computed (chunked prefill progresses through it).
    """

    hidden: torch.Tensor  # (N, H), sequences concatenated
    new_tokens: list[int]
    cached_tokens: list[int]
    page_tables: list[list[int]] | None
    layers: tuple[int, int]
    future: asyncio.Future
    priority: int = 0  # lower runs first; a documented knob (0 = normal)
    seq: int = 0
    done: list[int] = field(default_factory=list)
    outputs: list[list[torch.Tensor]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.done = [0] * len(self.new_tokens)
        self.outputs = [[] for _ in self.new_tokens]
        offsets = list(itertools.accumulate(self.new_tokens, initial=0))
        self._offsets = offsets

    def remaining(self) -> int:
        return sum(n - d for n, d in zip(self.new_tokens, self.done))

    def is_decode(self) -> bool:
        return all(n <= 1 for n in self.new_tokens)

    def slice_tokens(self, seq_index: int, count: int) -> torch.Tensor:
        start = self._offsets[seq_index] + self.done[seq_index]
        return self.hidden[start : start + count]  # (count, H)


@dataclass
class _Slot:
    """The part of a WorkItem packed into the current batch: `count` tokens of sequence `index`."""

    item: WorkItem
    index: int
    count: int


class BatchScheduler:
    def __init__(
        self,
        run_batch: RunBatch,
        *,
        page_size: int,
        max_batch_tokens: int = 512,
        batch_window: float = 0.002,
        enabled: bool = True,
    ) -> None:
        self._run_batch = run_batch
        self._page_size = page_size
        self._max_batch_tokens = max_batch_tokens
        self._batch_window = batch_window
        self._enabled = enabled  # False: one item per forward pass (the benchmark's baseline)
        self._queue: list[WorkItem] = []
        self._wakeup = asyncio.Event()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="compute")
        self._counter = itertools.count()
        self._task: asyncio.Task | None = None
        self.batches_run = 0
        self.tokens_run = 0
        self.busy_seconds = 0.0

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="batch-scheduler")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        for item in self._queue:
            if not item.future.done():
                item.future.set_exception(ConnectionAbortedError("peer is shutting down"))
        self._queue.clear()
        self._executor.shutdown(wait=True, cancel_futures=True)

    def submit(self, item: WorkItem) -> asyncio.Future:
        item.seq = next(self._counter)
        self._queue.append(item)
        self._wakeup.set()
        return item.future

    @property
    def queued(self) -> int:
        return len(self._queue)

    async def _loop(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            while self._queue:
                self._queue = [it for it in self._queue if not it.future.done()]  # cancelled by callers
                if not self._queue:
                    break
                slots = self._pack()
                await self._execute(slots)
                if self._batch_window > 0 and self._queue:
                    # While we computed, more steps may be on their way: a short wait lets them
                    # join the next batch instead of each paying a forward pass of its own.
                    await asyncio.sleep(0)

    def _pack(self) -> list[_Slot]:
        """Choose what runs next: decodes first, then prefill chunks, one layer sub-range per batch."""
        order = sorted(self._queue, key=lambda it: (it.priority, not it.is_decode(), it.seq))
        head = order[0]
        if head.page_tables is None:
            # Stateless: attention needs all of a sequence's tokens at once, so it runs whole, alone.
            return [_Slot(head, i, n) for i, n in enumerate(head.new_tokens)]
        budget = self._max_batch_tokens
        slots: list[_Slot] = []
        for item in order:
            if item.layers != head.layers or item.page_tables is None:
                continue
            for index, (n, d) in enumerate(zip(item.new_tokens, item.done)):
                take = min(n - d, budget)
                if take > 0:
                    slots.append(_Slot(item, index, take))
                    budget -= take
            if budget <= 0 or not self._enabled:
                break
        return slots

    async def _execute(self, slots: list[_Slot]) -> None:
        first = slots[0].item
        stateful = first.page_tables is not None
        hidden = torch.cat([s.item.slice_tokens(s.index, s.count) for s in slots])  # (N, H)
        layout = BatchLayout(
            new_tokens=[s.count for s in slots],
            cached_tokens=[s.item.cached_tokens[s.index] + s.item.done[s.index] for s in slots]
            if stateful
            else [0] * len(slots),
            page_tables=[s.item.page_tables[s.index] for s in slots] if stateful else None,
            page_size=self._page_size,
        )
        started = time.perf_counter()
        loop = asyncio.get_running_loop()
        try:
            output = await loop.run_in_executor(
                self._executor, self._run_batch, hidden, layout, first.layers, stateful
            )
        except Exception as e:  # a failing batch fails its items, never the scheduler
            logger.exception("forward pass failed")
            for s in slots:
                if not s.item.future.done():
                    s.item.future.set_exception(RuntimeError(f"forward pass failed: {e}"))
            self._queue = [it for it in self._queue if not it.future.done()]
            return
        self.busy_seconds += time.perf_counter() - started
        self.batches_run += 1
        self.tokens_run += hidden.shape[0]
        offset = 0
        for s in slots:
            s.item.outputs[s.index].append(output[offset : offset + s.count])
            s.item.done[s.index] += s.count
            offset += s.count
        for item in {id(s.item): s.item for s in slots}.values():
            if item.remaining() == 0 and not item.future.done():
                item.future.set_result(torch.cat([torch.cat(parts) for parts in item.outputs if parts]))
        self._queue = [it for it in self._queue if not it.future.done()]
