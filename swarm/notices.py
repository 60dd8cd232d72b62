"""Crash notices on the wire: whom to tell that a peer does not answer, and telling them.

A client whose hop stops answering tells FANOUT random peers of its view at once
(client/swarm_client.py), and each peer that hears of it first tells FANOUT more
(peer/crash_notices.py): a swarm of N peers hears of a crash in about log(N) / log(FANOUT) round
trips, instead of each peer finding the suspect at its next read of the DHT (every 5 s). A
notice is a hint, never a verdict: every receiver probes the suspect itself
(peer/crash_watch.py) before it balances without it.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Iterable
from typing import Any

from swarm.auth import SwarmKey
from swarm.codec import Limits
from swarm.connection import open_stream
from swarm.errors import RemoteError
from swarm.schema import CrashNotice, Noted, parse_reply
from swarm.types import PeerState, SwarmView

logger = logging.getLogger(__name__)

# Peers each teller tells. Push gossip in which everyone tells FANOUT others once misses about
# e^-FANOUT of the swarm (8: 0.03%; they find the crash at their next read as before) and reaches
# 2,000 peers in four hops; a crash then costs the swarm FANOUT small messages per peer, where
# reading the view every 5 s costs each peer a read of every record.
FANOUT = 8
# Seconds to dial a recipient and get its `noted`: a notice that takes longer is late anyway.
NOTICE_TIMEOUT_S = 2.0


def notice_recipients(view: SwarmView, suspect: str, exclude: Iterable[str], rng: random.Random,
                      fanout: int = FANOUT) -> list[str]:
    """Up to `fanout` peers of `view` to tell about `suspect`, at random: neither the suspect, nor
    anyone in `exclude` (ourselves, whoever told us), nor peers that announced they are leaving."""
    skip = {suspect, *exclude}
    candidates = sorted(p for p, r in view.records.items() if p not in skip and r.state is not PeerState.OFFLINE)
    return rng.sample(candidates, min(fanout, len(candidates)))


async def tell(p2p: Any, recipients: Iterable[str], notice: CrashNotice, limits: Limits,
               swarm_key: SwarmKey | None = None, timeout: float = NOTICE_TIMEOUT_S) -> int:
    """Send `notice` to every recipient at once; how many noted it (an older peer that does not know the
    message answers `unknown_type`, which does no harm and counts as not noted)."""
    async def one(peer_id: str) -> bool:
        try:
            stream = await asyncio.wait_for(open_stream(p2p, peer_id, limits, swarm_key=swarm_key, timeout=timeout),
                                            timeout)
            try:
                parse_reply(await stream.request(notice.to_wire(), timeout), limits, Noted)
            finally:
                await stream.close()
        except RemoteError as e:
            logger.debug("%s refused a crash notice: %s", peer_id, e)
            return False
        except Exception as e:
            logger.debug("could not tell %s of a crash: %s", peer_id, e)
            return False
        return True

    return sum(await asyncio.gather(*(one(p) for p in recipients)))
