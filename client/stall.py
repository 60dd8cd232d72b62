"""Stall watch: a hop that has not answered for a while is asked whether it is still there.

A peer whose process dies closes its streams, and the client fails over at once. A peer whose
host vanishes (a closed laptop, a dropped link, a frozen machine) closes nothing: the step waits
for `ClientConfig.step_timeout` (30 s) and only then fails over, and the swarm's self-placing
peers hear of it later still (peer/crash_watch.py needs a client's report). So while a result is
due, the client asks the peer for its `info` every `ClientConfig.stall_probe_s` (that long a
timeout too): a peer that answers is busy (a long prefill, a queue) and the wait goes on; one
that does not is unreachable at once, so the session fails over and reports it (SwarmClient.ban),
seconds after the host vanished instead of 30-45 s (docs/balancing.md, eighteenth session).

How long "a while" is depends on the hop (`stall_wait`): a hop whose peer's decode steps have been
answering in tens of milliseconds (the client's own measure, client/measured.py) is probed after
STALL_STEP_FACTOR of its usual steps, at least `ClientConfig.stall_probe_min_s` (1 s), and that
long a probe timeout; a peer not timed yet, a prefill or a stateless forward after `stall_probe_s`
(2 s). A vanished host under a decoding session is thus seen in about 2 s, not 4 (docs/balancing.md,
thirty-fifth session); a slow peer (a CPU peer, a far one) keeps the longer waits its own steps ask for.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Awaitable, Callable
from typing import TypeVar

from swarm.errors import PeerUnreachable

T = TypeVar("T")

# A hop is probed once it has been silent for this many of its usual decode steps: a queue or a batch
# beside a long prefill delays a step by a few steps' time, and a probe it then answers costs little.
STALL_STEP_FACTOR = 4.0


def stall_wait(typical_step_s: float | None, floor_s: float, ceiling_s: float) -> float:
    """Seconds of silence before a hop whose decode steps usually take `typical_step_s` is probed, and
    the probe's timeout: STALL_STEP_FACTOR steps within [floor_s, ceiling_s]; ceiling_s when not timed."""
    if typical_step_s is None:
        return ceiling_s
    return min(max(STALL_STEP_FACTOR * typical_step_s, floor_s), ceiling_s)


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
