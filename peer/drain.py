"""Graceful departure: after announcing DRAINING, wait until the swarm covers our layers without us.

The peer keeps serving meanwhile (open sessions, and new ones where clients have no other
choice: routing penalises DRAINING peers). It leaves when one of these holds:
  * covered: every layer it serves has another ONLINE server (routing.covered_without), and
    none of them would be thin without it (routing.thin_without: the swarm's throughput
    would halve there), unless no replacement has been loading onto its layers
    (routing.incoming) for THIN_GRACE_S;
  * nobody can take over: no JOINING peer, and no ONLINE peer that could move without
    uncovering its own layers (routing.possible_takers), for NO_TAKER_GRACE_S;
  * the bounded wait (`swarm-peer serve --drain-timeout`) ran out.
Its open sessions then get `shutting_down` frames and fail over (replaying their history).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from routing import covered_without, incoming, possible_takers, thin_without
from swarm.types import SwarmView

logger = logging.getLogger(__name__)

# Seconds between two reads of the DHT view while draining: a replacement is seen this soon
# after it announces, at one small DHT read per second or two.
POLL_S = 1.0
# A peer that could take over may announce only once its new layers are loaded, so "no
# taker now" is trusted only after it held this long: longer than a few DHT polls and the
# other peers' reaction time (peer/config.py WATCH_PERIOD_S), short enough that stopping a
# lone peer still feels immediate.
NO_TAKER_GRACE_S = 3.0
# Covered but thin: others see the layers thin at their next read of the view (peer/config.py
# WATCH_PERIOD_S, 5 s +-25%); the layers being served, the largest peers decide first and announce
# their move after 0.5 s per layer they hold fewer than the largest (react_delay); 10 s covers the
# peers up to 8 layers smaller than it. Staying while one loads keeps the swarm's throughput up
# through the departure (docs/balancing.md).
THIN_GRACE_S = 10.0


async def wait_until_covered(
    fetch_view: Callable[[], Awaitable[SwarmView]], peer_id: str, timeout: float, poll: float = POLL_S
) -> str:
    """Poll the swarm until our layers are covered without us; returns why the wait ended.

    "covered", "no_taker" or "timeout". A failing DHT read is retried until the timeout.
    """
    started = time.monotonic()
    deadline = started + timeout
    no_taker_since: float | None = None
    nobody_loading_since = started
    told_thin = False
    told_loading: list[str] = []
    while True:
        now = time.monotonic()
        if now >= deadline:
            return "timeout"
        try:
            view = await fetch_view()
        except Exception as e:  # the DHT may be slow; keep serving and ask again
            logger.info("draining: could not read the swarm (%s); retrying", e)
            view = None
        if view is not None:
            if covered_without(view, peer_id):
                if not thin_without(view, peer_id):
                    return "covered"
                if loading := incoming(view, peer_id):
                    if loading != told_loading:
                        logger.info("draining: staying while %s load our layers", ", ".join(loading))
                        told_loading = loading
                    nobody_loading_since = now
                elif now - nobody_loading_since >= THIN_GRACE_S:
                    return "covered"
                elif not told_thin:
                    logger.info("draining: our layers are covered but would be thin without us; waiting up to "
                                "%.0f s for a peer to start loading there", THIN_GRACE_S)
                    told_thin = True
            elif possible_takers(view, peer_id):
                no_taker_since = None
            elif no_taker_since is None:
                no_taker_since = now
            elif now - no_taker_since >= NO_TAKER_GRACE_S:
                return "no_taker"
        await asyncio.sleep(min(poll, max(0.0, deadline - time.monotonic())))
