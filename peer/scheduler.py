"""Continuous batching: steps of many sessions become one forward pass of the served layers.

Handlers submit `WorkItem`s and await their futures. One asyncio task packs the queued items of
several sessions into one ragged `BatchLayout` (each sequence with its own positions and page
table) and runs it on a single compute thread, so the event loop keeps answering the network
while the model runs. Decode steps of N sessions become one batch of N tokens.

Batch window: a session that was served in one of the last two batches is *active*: it is
probably about to send its next step. Before a batch, if some active sessions have no step
queued, the scheduler waits for them, at most `batch_window` seconds after the last batch ended
(or after the oldest queued step arrived, if later), then runs whatever is queued. Steps that
arrive while a batch runs simply join the next one, so with the compute idle a step starts at
once unless its fellow sessions are about to arrive. Without this, N sessions settle into two
alternating half-size batches (each half arrives while the other computes). With one active
session nothing ever waits. `batch_window=0` runs whatever is queued at once.

Chunked prefill: a round packs at most `max_batch_tokens` tokens. Decodes go first, then
prefill chunks fill the remaining budget, so a 2,000-token prompt never stalls the one-token
decodes of other sessions; it progresses chunk by chunk.

Fairness and priorities: each session has at most one step in flight (the handler refuses a
second), so the queue holds at most one item per session: a per-session queue of depth one.
Items are packed in order of (effective priority, decode before prefill, arrival). `priority` is
a knob: lower runs first; inference steps use 0 and stateless `forward` requests (scoring,
verification) use `swarm-peer serve --forward-priority` (default 1). Effective priority =
priority - (rounds the item got no token at all) // AGING_ROUNDS, so a passed-over item climbs
and reaches the front after a bounded number of rounds: no session starves, whatever its priority.
One batch holds one layer sub-range (the front item's); other ranges wait their turn the same way.

`enabled=False` (`swarm-peer serve --no-batching`) runs one item per forward pass: the baseline.

Inline batches: a batch for which `inline(...)` holds (on a CUDA peer: a decode batch that
replays a captured graph) runs on the event loop itself, not on the compute thread, when no
compute-thread job is in flight. A replay is a few microseconds of launches and one device
synchronisation, and the two thread hand-offs it saves cost more than that on an idle host
(each wakes a sleeping thread; measured in `benchmarks/bench_step_breakdown.py`). Blocking the
loop for the replay delays no step: one that arrives meanwhile joins the next batch, as it would.
Eager batches (prefill, CPU) keep the compute thread, so the loop stays free while they run.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch

from shards.batch import BatchLayout

logger = logging.getLogger(__name__)

# run_batch(hidden (N, H), layout, layers (a, b), stateful) -> (N, H)
RunBatch = Callable[[torch.Tensor, BatchLayout, tuple[int, int], bool], torch.Tensor]
# inline(hidden, layout, layers, stateful) -> True when the batch may run on the event loop
InlineTest = Callable[[torch.Tensor, BatchLayout, tuple[int, int], bool], bool]

AGING_ROUNDS = 4  # a passed-over item gains one priority level per this many rounds


@dataclass(eq=False)
class WorkItem:
    """One request: the new tokens of one or more sequences through layers `layers`.

    `page_tables` is None for stateless forwards. `done[i]` counts how many of sequence i's
    new tokens were already computed (chunked prefill progresses through it). A sequence may
    bring 0 new tokens (all of them came from shared prefix pages); at least one must bring some.
    """

    hidden: torch.Tensor  # (N, H), sequences concatenated
    new_tokens: list[int]
    cached_tokens: list[int]
    page_tables: list[list[int]] | None
    layers: tuple[int, int]
    future: asyncio.Future
    priority: int = 0  # lower runs first (0: inference steps); see the module docstring
    owner: str | None = None  # the session's id (None: stateless), for the batch window
    seq: int = 0
    arrived: float = 0.0
    skipped: int = 0  # rounds in which this item got no token
    done: list[int] = field(default_factory=list)
    outputs: list[list[torch.Tensor]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if sum(self.new_tokens) == 0:
            raise ValueError("a work item needs at least one new token")
        self.done = [0] * len(self.new_tokens)
        self.outputs = [[] for _ in self.new_tokens]
        self._offsets = list(itertools.accumulate(self.new_tokens, initial=0))

    def remaining(self) -> int:
        return sum(n - d for n, d in zip(self.new_tokens, self.done))

    def is_decode(self) -> bool:
        return all(n - d <= 1 for n, d in zip(self.new_tokens, self.done))

    def effective_priority(self) -> int:
        return self.priority - self.skipped // AGING_ROUNDS

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
        inline: InlineTest | None = None,
    ) -> None:
        self._run_batch = run_batch
        self._inline = inline
        self._page_size = page_size
        self._max_batch_tokens = max_batch_tokens
        self._batch_window = batch_window
        self._enabled = enabled  # False: one item per forward pass (the benchmark's baseline)
        self._queue: list[WorkItem] = []
        self._wakeup = asyncio.Event()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="compute")
        self._executor_jobs = 0  # compute-thread jobs submitted and not yet ended (loop thread only)
        self._counter = itertools.count()
        self._task: asyncio.Task | None = None
        self._served: dict[str, int] = {}  # session -> number of the last batch that served it
        self._last_end = 0.0  # when the last batch finished
        self.batches_run = 0
        self.tokens_run = 0
        self.sequences_run = 0  # sum over batches of sequences per batch
        self.max_batch_sequences = 0
        self.busy_seconds = 0.0
        self.inline_batches = 0

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
        item.arrived = time.monotonic()
        self._queue.append(item)
        self._wakeup.set()
        return item.future

    async def run_exclusive(self, fn: Callable[[], Any]) -> Any:
        """Run `fn` on the compute thread between two batches (e.g. a copy-on-write page copy)."""
        return await self._on_compute_thread(fn)

    async def _on_compute_thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        # Counted until the job itself has ended (not when its awaiter is cancelled), so that an
        # inline batch never runs while a page copy or an engine swap may still be running there.
        loop = asyncio.get_running_loop()
        self._executor_jobs += 1
        job = self._executor.submit(fn, *args)
        job.add_done_callback(lambda _: loop.call_soon_threadsafe(self._job_ended))
        return await asyncio.wrap_future(job)

    def _job_ended(self) -> None:
        self._executor_jobs -= 1

    @property
    def queued(self) -> int:
        return len(self._queue)

    def stats(self) -> dict[str, Any]:
        return {
            "batches_run": self.batches_run,
            "tokens_run": self.tokens_run,
            "sequences_run": self.sequences_run,
            "max_batch_sequences": self.max_batch_sequences,
            "busy_seconds": round(self.busy_seconds, 3),
            "inline_batches": self.inline_batches,
            "batching": self._enabled,
        }

    async def _loop(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            while self._drop_cancelled():
                await self._gather()
                if not self._drop_cancelled():
                    break
                slots = self._pack()
                await self._execute(slots)

    def _drop_cancelled(self) -> bool:
        self._queue = [it for it in self._queue if not it.future.done()]  # cancelled by callers
        return bool(self._queue)

    async def _gather(self) -> None:
        """The batch window: wait briefly for active sessions (served lately) that have no step queued."""
        if self._batch_window <= 0 or not self._enabled:
            return
        recent = self.batches_run - 1
        self._served = {k: b for k, b in self._served.items() if b >= recent}  # forget sessions gone quiet
        deadline = max(self._last_end, min(it.arrived for it in self._queue)) + self._batch_window
        while self._served.keys() - {it.owner for it in self._queue}:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            self._wakeup.clear()
            try:
                await asyncio.wait_for(self._wakeup.wait(), remaining)
            except asyncio.TimeoutError:
                return

    def _pack(self) -> list[_Slot]:
        """Choose what runs next: by effective priority, decodes first, then prefill chunks, one layer range."""
        order = sorted(self._queue, key=lambda it: (it.effective_priority(), not it.is_decode(), it.seq))
        head = order[0]
        if head.page_tables is None:
            # Stateless: attention needs all of a sequence's tokens at once, so it runs whole, alone.
            slots = [_Slot(head, i, n) for i, n in enumerate(head.new_tokens) if n > 0]
        else:
            budget = self._max_batch_tokens
            slots = []
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
        served = {id(s.item) for s in slots}
        for item in self._queue:
            if id(item) not in served:
                item.skipped += 1
        return slots

    async def _execute(self, slots: list[_Slot]) -> None:
        first = slots[0].item
        stateful = first.page_tables is not None
        items = list({id(s.item): s.item for s in slots}.values())
        started = time.perf_counter()
        try:  # a failing batch (even a bad layout) fails its items, never the scheduler
            hidden = torch.cat([s.item.slice_tokens(s.index, s.count) for s in slots])  # (N, H)
            layout = BatchLayout(
                new_tokens=[s.count for s in slots],
                cached_tokens=[s.item.cached_tokens[s.index] + s.item.done[s.index] for s in slots]
                if stateful
                else [0] * len(slots),
                page_tables=[s.item.page_tables[s.index] for s in slots] if stateful else None,
                page_size=self._page_size,
            )
            args = (hidden, layout, first.layers, stateful)
            if self._inline is not None and self._executor_jobs == 0 and self._inline(*args):
                self.inline_batches += 1
                output = self._run_batch(*args)
            else:
                output = await self._on_compute_thread(self._run_batch, *args)
        except Exception as e:
            self._last_end = time.monotonic()
            logger.exception("forward pass failed")
            for item in items:
                if not item.future.done():
                    item.future.set_exception(RuntimeError(f"forward pass failed: {e}"))
            self._drop_cancelled()
            return
        self.busy_seconds += time.perf_counter() - started
        self.batches_run += 1
        self._last_end = time.monotonic()
        for item in items:
            if item.owner is not None:
                self._served[item.owner] = self.batches_run
        self.tokens_run += hidden.shape[0]
        self.sequences_run += len(slots)
        self.max_batch_sequences = max(self.max_batch_sequences, len(slots))
        offset = 0
        for s in slots:
            s.item.outputs[s.index].append(output[offset : offset + s.count])
            s.item.done[s.index] += s.count
            offset += s.count
        for item in items:
            if item.remaining() == 0 and not item.future.done():
                item.future.set_result(torch.cat([torch.cat(parts) for parts in item.outputs if parts]))
        self._drop_cancelled()
