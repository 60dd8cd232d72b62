"""Stall watch: a hop that has not answered for a while is asked whether it is still there.

A peer whose process dies closes its streams, and the client fails over at once. A peer whose
host vanishes (a closed laptop, a dropped link, a frozen machine) closes nothing: the step waits
for `ClientConfig.step_timeout` (30 s) and only then fails over, and the swarm's self-placing
peers hear of it later still (peer/crash_watch.py needs a client's report). So while a result is
due, the client asks the peer for its `info` every `ClientConfig.stall_probe_s` (that long a
timeout too): a peer that answers is busy (a long prefill, a queue) and the wait goes on; one
that does not is unreachable at once, so the session fails over and reports it (SwarmClient.ban),
seconds after the host vanished instead of 30-45 s (docs/balancing.md, eighteenth session).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Awaitable, Callable
from typing import TypeVar

from swarm.errors import PeerUnreachable

T = TypeVar("T")


async def unless_gone(result: Awaitable[T], is_alive: Callable[[], Awaitable[bool]], peer_id: str,
                      stall_probe_s: float, timeout: float) -> T:
    """`result`, awaited; every `stall_probe_s` without it, `is_alive()` is asked, and a False
    answer raises PeerUnreachable (the wait for `result` is cancelled). `result` carries its own
    `timeout` (the step timeout); this adds at most one probe's time to it."""
    task = asyncio.ensure_future(result)
    try:
        # Bounded: the task ends by its own timeout, so this many waits always see it finish.
        for _ in range(math.ceil(timeout / stall_probe_s) + 1):
            done, _ = await asyncio.wait({task}, timeout=stall_probe_s)
            if done:
                return task.result()
            if not await is_alive() and not task.done():
                raise PeerUnreachable(f"peer {peer_id} has not answered for {stall_probe_s:g} s "
                                      f"and does not answer a probe either")
        return await task
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
