"""The simulator's swarm state: its peers (SimPeer) and the per-layer arrays it keeps incrementally
(SwarmArrays), so that a 10,000-peer swarm needs no O(peers) view rebuild per decision, and the
lazy per-layer view without one peer (WithoutPeer) that plan_move reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from routing import THIN_SHARE
from swarm.types import LayerRange


@dataclass
class SimPeer:
    peer_id: str
    k: int
    thr: float
    rtt: float
    layers: LayerRange | None = None  # where balancing counts it: a mover's target
    serving: LayerRange | None = None  # what it serves now (None while it loads)
    draining: bool = False
    drain_deadline: float = 0.0
    generation: int = 0  # bumped on every move, so a stale "online" event is ignored
    moved_at: float | None = None  # when it last moved (routing.FLOW_MOVE_COOLDOWN_S); None: never
    prefetched_at: float = 0.0  # from then on its moves load from disk (SimConfig.move_load_s_per_layer)
    arrived: list[int] = field(default_factory=list)  # a standby loading layer by layer: those it serves already
    to_load: list[int] = field(default_factory=list)  # ... and those still to come, in load order

    @property
    def loading(self) -> bool:
        return self.serving is None


class SwarmArrays:
    """Per-layer arrays kept incrementally.

    Balancing's view (ONLINE + JOINING, movers at their target, not DRAINING): thr, counted.
    Serving (ONLINE, DRAINING too): online_thr, online_n. Staying servers (ONLINE,
    not DRAINING): staying_n, staying_thr. A mover pauses while it loads (memory for one range only).
    Standbys: standby_n serving, standby_at placed (loading too). uncovered: layers nobody
    serves, standbys included; gpu_uncovered: layers no GPU peer serves.
    """

    def __init__(self, num_layers: int) -> None:
        self.thr = [0.0] * num_layers
        self.counted = [0] * num_layers
        self.thr_by_k: dict[int, list[float]] = {}  # balancing throughput per peer size (tiers)
        self.counted_by_k: dict[int, list[int]] = {}  # ... and counts, so 0 there means nobody of that size
        self.online_thr = [0.0] * num_layers
        self.online_n = [0] * num_layers
        self.staying_n = [0] * num_layers
        self.staying_thr = [0.0] * num_layers
        self.standby_n = [0] * num_layers
        self.standby_at = [0] * num_layers
        self.guarded = [False] * num_layers  # standby_at > 0 (routing.guarded_layers)
        self.uncovered = num_layers
        self.gpu_uncovered = num_layers
        self.gaps_opened = 0
        self.placements = 0  # changes of balancing's view so far: keys what is computed once per view
        self._tiers: dict[int, tuple[int, list[float]]] = {}  # k -> (placements, at_least(k))
        self._thin_limit = (-1, 0.0)  # (placements, thin_limit())

    def place(self, p: SimPeer, sign: int) -> None:
        self.placements += 1
        n = len(self.thr)
        tier_thr = self.thr_by_k.setdefault(p.k, [0.0] * n)
        tier_n = self.counted_by_k.setdefault(p.k, [0] * n)
        for layer in range(p.layers.start, p.layers.end):
            self.counted[layer] += sign
            self.thr[layer] += sign * p.thr
            if self.thr[layer] < 1e-9 or not self.counted[layer]:
                self.thr[layer] = 0.0  # no float residue: 0 must mean "nobody"
            tier_n[layer] += sign
            tier_thr[layer] += sign * p.thr
            if tier_thr[layer] < 1e-9 or not tier_n[layer]:
                tier_thr[layer] = 0.0

    def at_least(self, k: int) -> list[float]:
        """Balancing throughput of the peers holding at least k layers (routing.balance's tiers);
        computed once per placement and shared: callers copy before changing it."""
        cached = self._tiers.get(k)
        if cached is not None and cached[0] == self.placements:
            return cached[1]
        thr = [0.0] * len(self.thr)
        for size, tier in self.thr_by_k.items():
            if size >= k:
                thr = [a + b for a, b in zip(thr, tier)]
        self._tiers[k] = (self.placements, thr)
        return thr

    def place_standby(self, span: LayerRange, sign: int) -> None:
        """A standby placed on (sign > 0) or taken off `span` (loading or serving there)."""
        for layer in range(span.start, span.end):
            self.standby_at[layer] += sign
            self.guarded[layer] = self.standby_at[layer] > 0

    def serve(self, span: LayerRange, p: SimPeer, sign: int) -> None:
        for layer in range(span.start, span.end):
            n = self.online_n[layer] + sign
            self.online_n[layer] = n
            self.online_thr[layer] = self.online_thr[layer] + sign * p.thr if n else 0.0
            if n == 0 and sign < 0:
                self.gpu_uncovered += 1
            elif n == 1 and sign > 0:
                self.gpu_uncovered -= 1
            if n + self.standby_n[layer] == (1 if sign > 0 else 0):
                self._served(sign)

    def serve_standby(self, span: LayerRange, sign: int) -> None:
        for layer in range(span.start, span.end):
            self.standby_n[layer] += sign
            if self.online_n[layer] + self.standby_n[layer] == (1 if sign > 0 else 0):
                self._served(sign)

    def _served(self, sign: int) -> None:
        """A layer's first server came (sign > 0) or its last one went."""
        if sign < 0:
            self.gaps_opened += self.uncovered == 0
        self.uncovered -= sign

    def stay(self, span: LayerRange | None, p: SimPeer, sign: int) -> None:
        for layer in range(span.start, span.end) if span is not None else ():
            n = self.staying_n[layer] + sign
            self.staying_n[layer] = n
            self.staying_thr[layer] = self.staying_thr[layer] + sign * p.thr if n else 0.0

    def thin_limit(self) -> float:
        """routing.thin_layers' limit: THIN_SHARE of the mean layer throughput balancing counts."""
        if self._thin_limit[0] != self.placements:
            self._thin_limit = (self.placements, THIN_SHARE * sum(self.thr) / len(self.thr))
        return self._thin_limit[1]

    def thin(self, span: LayerRange | None = None) -> bool:
        """Is some layer (of `span`) thin: its staying servers below thin_limit? Gaps count too."""
        values = self.staying_thr if span is None else self.staying_thr[span.start : span.end]
        return min(values) < self.thin_limit()

    def covered_without(self, p: SimPeer) -> bool:
        return all(self.staying_n[layer] > 0 for layer in range(p.layers.start, p.layers.end))


class WithoutPeer:
    """Per-layer staying counts or throughput without the asking peer (its `share` on its layers),
    read lazily: plan_move reads only that peer's layers."""

    def __init__(self, values: list[int] | list[float], mine: LayerRange, share: float) -> None:
        self.values, self.mine, self.share = values, mine, share

    def __getitem__(self, layer: int) -> float:
        return self.values[layer] - (self.share if layer in self.mine else 0)
