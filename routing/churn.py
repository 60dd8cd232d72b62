"""How fast the swarm loses peers, counted by one peer from its own reads of the DHT view.

Flow moves search every window only while the swarm is calm (routing.flow_move): under churn the
search buys its flow with moves the budget does not have, while a calm swarm has moves to spare and
would otherwise rest far below its optimum (docs/balancing.md, twenty-eighth session). "Calm" is
measured, not configured: fewer than CALM_CHURN of the peers left in the last CHURN_WINDOW_S, and
this peer has watched that long. Every peer counts for itself from what it reads, so nothing is
coordinated and nothing new is announced; a hostile peer can only make the swarm look busier (by
vanishing and coming back), which falls back to the cautious rule.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from swarm.types import PeerState, SwarmView

# The window over which departures are counted, and how long a peer watches before it may call the
# swarm calm: an hour holds several departures at the simulator's 3-10%/h even in a 100-peer swarm.
CHURN_WINDOW_S = 3600.0
# Departures per peer within the window under which the swarm is calm. Measured in the simulator
# (2x): at 10%/h the search costs moves for no flow (1,000 peers over the move budget); at 3%/h it
# gains 1.7 points of sum(c) / L at 200 peers, at rest 6-33 (1,000 peers: 16.5). 5%/h sits between: at 10%/h a 200-peer
# swarm's hourly count falls that low about once in a hundred hours (Poisson, 20 expected).
CALM_CHURN = 0.05

_PRESENT = (PeerState.ONLINE, PeerState.JOINING)


@dataclass
class ChurnCount:
    """Departures seen in the last CHURN_WINDOW_S: `observe` each view read (or `count` them directly)."""

    window_s: float = CHURN_WINDOW_S
    since: float | None = None  # when counting started
    present: frozenset[str] = frozenset()  # GPU peers serving or loading at the last read
    # (time, departures) per read that saw some, oldest first; trimmed to the window, so at most one
    # entry per read within it.
    seen: deque[tuple[float, int]] = field(default_factory=deque)

    def observe(self, view: SwarmView, now: float) -> None:
        """Count the GPU peers of the last read that are gone from `view` or no longer ONLINE or JOINING
        (drained, draining, offline): each departure once. Moves keep a peer ONLINE, and standbys are
        no capacity (routing/standby.py), so neither counts."""
        present = frozenset(peer_id for peer_id, r in view.records.items() if r.state in _PRESENT and not r.standby)
        self.count(now, len(self.present - present))  # the first read: nothing present before, nothing gone
        self.present = present

    def count(self, now: float, departures: int) -> None:
        """Record `departures` at time `now` (the simulator counts its departures this way)."""
        if self.since is None:
            self.since = now
        if departures > 0:
            self.seen.append((now, departures))
        while self.seen and self.seen[0][0] < now - self.window_s:
            self.seen.popleft()

    def calm(self, now: float, peers: int) -> bool:
        """Has fewer than CALM_CHURN of `peers` left within the window, watched for a whole window?"""
        if self.since is None or now - self.since < self.window_s:
            return False
        recent = sum(n for t, n in self.seen if t >= now - self.window_s)
        return recent < CALM_CHURN * peers
