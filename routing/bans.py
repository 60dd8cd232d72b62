"""BanList: which peers recently failed us, with exponential backoff.

Plain bookkeeping: every method takes `now` (seconds, any monotonic clock the caller
owns) instead of reading a clock, so tests and the simulator replay it exactly.

A peer that could not even be dialled is also avoided until it announces again: a killed
peer's record outlives it by up to its TTL (30 s), longer than the first bans, and a record
that was never measured looks faster than the live peers a client has measured, so a time
ban alone sends client after client back to the corpse.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

# A peer that just failed is usually restarting, overloaded, or gone; one second is long
# enough that the client's immediate re-plan goes elsewhere, short enough that a blip costs
# little if the peer was the only good choice.
BAN_BASE_S = 1.0
# Each further failure without a success in between doubles the ban: a peer that keeps
# failing is probably gone for good, so we stop spending round trips on it quickly.
BAN_FACTOR = 2.0
# Five minutes is about the time a crashed peer needs to restart and re-announce; a longer
# ban would keep a recovered peer out of routes after its announcement is fresh again.
BAN_CAP_S = 300.0


@dataclass
class _Strike:
    failures: int
    until: float


class BanList:
    """Consecutive failures per peer -> a ban that lasts BAN_BASE_S * 2^(failures-1), capped."""

    def __init__(self, base: float = BAN_BASE_S, factor: float = BAN_FACTOR, cap: float = BAN_CAP_S) -> None:
        if base <= 0 or factor < 1 or cap < base:
            raise ValueError(f"need base > 0, factor >= 1, cap >= base; got {base}, {factor}, {cap}")
        self.base, self.factor, self.cap = base, factor, cap
        self._strikes: dict[str, _Strike] = {}
        self._unreachable: dict[str, float] = {}  # peer id -> its announcement time when a dial failed

    def ban(self, peer_id: str, now: float) -> float:
        """Record a failure of `peer_id` at `now`; returns how long (s) the ban lasts."""
        strike = self._strikes.get(peer_id)
        failures = 1 if strike is None else strike.failures + 1
        duration = min(self.cap, self.base * self.factor ** (failures - 1))
        self._strikes[peer_id] = _Strike(failures, now + duration)
        return duration

    def unreachable(self, peer_id: str, announced: float) -> bool:
        """A dial to `peer_id` failed while its record said `announced` (PeerRecord.updated):
        keep it banned, however long that takes, until a newer announcement shows it is back.
        True when this is news (not already marked for that announcement)."""
        new = self._unreachable.get(peer_id) != announced
        self._unreachable[peer_id] = announced
        return new

    def forgive(self, peer_id: str) -> None:
        """A success through `peer_id`: forget its failures, so its next ban starts short again."""
        self._strikes.pop(peer_id, None)
        self._unreachable.pop(peer_id, None)

    def is_banned(self, peer_id: str, now: float) -> bool:
        strike = self._strikes.get(peer_id)
        return strike is not None and now < strike.until

    def remaining(self, peer_id: str, now: float) -> float:
        """Seconds left on `peer_id`'s ban (0 when not banned)."""
        strike = self._strikes.get(peer_id)
        return 0.0 if strike is None else max(0.0, strike.until - now)

    def penalties(self, now: float, announced: Mapping[str, float] | None = None) -> dict[str, float]:
        """Peer id -> ban level (its consecutive failures) for peers banned at `now`.

        Pass it to plan_route(banned=...): each level adds RouteCosts.ban_penalty seconds,
        so a peer that failed more often is avoided harder when every option is banned.
        Expired bans are not listed, but their failures are remembered until forgive().

        `announced` (peer id -> PeerRecord.updated in the view being routed on) adds the peers
        marked unreachable that have not announced since, each above every merely failing peer
        (its failures + the highest of their levels): a peer that refused a step is likelier alive
        than one we could not dial. Unreachable peers that announced again, or left the view, are
        forgotten as unreachable.
        """
        levels = {p: float(s.failures) for p, s in self._strikes.items() if now < s.until}
        if announced is not None:
            worst_reachable = max((v for p, v in levels.items() if p not in self._unreachable), default=0.0)
            for peer_id, when in list(self._unreachable.items()):
                if peer_id not in announced or announced[peer_id] > when:
                    del self._unreachable[peer_id]
                    continue
                strike = self._strikes.get(peer_id)
                levels[peer_id] = (float(strike.failures) if strike is not None else 1.0) + worst_reachable
        return dict(sorted(levels.items()))
