"""CrashNotices: hear of a crash the moment a client or a peer does, tell a few more, and look now.

Without them a self-placing peer learns of a suspect (peer/crash_watch.py) at its next read of the
view, 5 s +-25% apart (peer/config.py WATCH_PERIOD_S): 3 s on average after the crash is known,
while the crashed peer's layers serve at a fraction of their speed or not at all. A notice
(swarm.schema.CrashNotice, sent by swarm.notices.tell) wakes the balancer's watch at once, which
looks first at its last view less the suspect, once its own probe fails too (no DHT read before
its react delay); a peer that hears of a suspect first, or whose own probe finds one dead, tells
FANOUT random peers in turn, so the whole swarm looks within a few round trips (docs/balancing.md,
thirty-fourth and forty-fourth sessions).

Hostile senders: a notice is only a reason to look sooner. The suspect leaves the balancing view
only when this peer's own probe fails too (CrashWatch). A notice about ourselves, or about an
announcement older than the one our last view lists, is ignored.
News from others is rate limited (MAX_NEWS_PER_S, bursts of NEWS_BURST): a flood of forged
notices costs each peer at most that many extra reads and probes, plus FANOUT small messages
each, and beyond it notices are dropped and crashes are found at the next read, as before.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable

from peer.rate_limit import RateLimiter
from swarm.notices import FANOUT, notice_recipients
from swarm.schema import CrashNotice
from swarm.types import SwarmView

logger = logging.getLogger(__name__)

# New suspects heard from others per second, sustained, and in a burst: a swarm of 2,000 peers at
# 10%/h churn, half of it crashes, sees a crash every 36 s; a rack that fails takes a few at once.
MAX_NEWS_PER_S = 0.1
NEWS_BURST = 8.0
# A suspect heard of is probed at every read for this long: a crashed peer's record leaves the
# view within its TTL (30 s by default), and a verdict is kept per announcement (CrashWatch).
REMEMBER_S = 60.0
MAX_REMEMBERED = 256  # suspects kept at most (oldest first out): bounded memory under a flood

Tell = Callable[[list[str], CrashNotice], Awaitable[int]]


class CrashNotices:
    """What this peer heard of crashes, and the telling of them (see the module docstring)."""

    def __init__(self, tell: Tell, me: Callable[[], str], wake: asyncio.Event,
                 clock: Callable[[], float] = time.monotonic, rng: random.Random | None = None) -> None:
        self.tell = tell  # send a notice to these peers (swarm.notices.tell on this peer's p2p)
        self.me = me
        self.wake = wake  # set on news: the balancer's watch reads the view now (peer/balancer.py)
        self.clock = clock
        self.rng = rng or random.Random()
        self.view: SwarmView | None = None  # the last view balancing read: whom to tell, what is current
        self.dropped = 0  # news refused by the rate limit
        self._heard: OrderedDict[tuple[str, float], float] = OrderedDict()  # (suspect, announced) -> when
        self._news = RateLimiter(MAX_NEWS_PER_S, NEWS_BURST)
        self._telling: set[asyncio.Task[int]] = set()  # kept referenced until sent

    def note_view(self, view: SwarmView) -> None:
        self.view = view

    def receive(self, notice: CrashNotice, sender: str) -> bool:
        """A notice from `sender` (a client or a peer); True when it is news: we look now and tell others."""
        if not self._is_news(notice.peer_id, notice.announced):
            return False
        if not self._news.allow("news", self.clock()):
            self.dropped += 1
            logger.debug("crash notice about %s from %s dropped: over %g new suspects per second", notice.peer_id,
                         sender, MAX_NEWS_PER_S)
            return False
        logger.info("%s says peer %s does not answer: probing it now, and telling up to %d more peers",
                    sender, notice.peer_id, FANOUT)
        self._remember(notice.peer_id, notice.announced)
        self.wake.set()
        self._spread(notice, exclude=(sender,))
        return True

    def confirmed(self, peer_id: str, announced: float) -> None:
        """Our own probe of a suspect failed (CrashWatch): tell others, unless we heard of it from one."""
        if self._is_news(peer_id, announced):
            self._remember(peer_id, announced)
            self._spread(CrashNotice(peer_id, announced), exclude=())

    def suspects(self) -> dict[str, float]:
        """Suspect -> the latest announcement heard of as unreachable, over the last REMEMBER_S."""
        while self._heard and self.clock() - next(iter(self._heard.values())) > REMEMBER_S:
            self._heard.popitem(last=False)
        out: dict[str, float] = {}
        for peer_id, announced in self._heard:
            out[peer_id] = max(announced, out.get(peer_id, announced))
        return out

    def _is_news(self, peer_id: str, announced: float) -> bool:
        """Not about us, not heard yet, and not about an announcement older than the one our last view
        lists. A peer our view does not list yet is news: a view is up to a watch period old, and a
        peer that joined since may be the one that crashed (the read it wakes finds it, or not)."""
        if peer_id == self.me() or (peer_id, announced) in self._heard:
            return False
        record = self.view.records.get(peer_id) if self.view is not None else None
        return record is None or record.updated <= announced

    def _remember(self, peer_id: str, announced: float) -> None:
        self._heard[(peer_id, announced)] = self.clock()
        while len(self._heard) > MAX_REMEMBERED:
            self._heard.popitem(last=False)

    def _spread(self, notice: CrashNotice, exclude: Iterable[str]) -> None:
        if self.view is None:  # not balancing yet: nobody to tell
            return
        recipients = notice_recipients(self.view, notice.peer_id, (self.me(), *exclude), self.rng)
        if not recipients:
            return
        task = asyncio.get_running_loop().create_task(self.tell(recipients, notice))
        self._telling.add(task)
        task.add_done_callback(self._telling.discard)
