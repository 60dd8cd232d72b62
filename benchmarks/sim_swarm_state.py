"""The simulator's swarm state: its peers (SimPeer) and the per-layer arrays it keeps incrementally
(SwarmArrays), so that a 10,000-peer swarm needs no O(peers) view rebuild per decision, the
lazy per-layer view without one peer (WithoutPeer) that plan_move reads, and the load orders other
loaders announce to a deciding peer (announced_orders).
"""

from __future__ import annotations

from collections.abc import Iterable
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
    # A standby, or a GPU peer with SimConfig.serve_by_layer, loading layer by layer: the layers it
    # serves already (one contiguous range: load_order grows it at either end) ...
    arrived: list[int] = field(default_factory=list)
    to_load: list[int] = field(default_factory=list)  # ... and those still to come, in load order
    loads_from: float = 0.0  # when its latest load starts (after a move's react wait and confirmation)
    downloads: bool = False  # its latest load fetches over the network (SimConfig.load_s_per_layer), not from disk
    # A mover's old range, which it serves on (not staying: balancing counts it at its target) until its
    # react wait and move confirmation are over and its load starts (peer/moves.py migrate) ...
    leaving: LayerRange | None = None
    leaving_cause: str = ""  # ... and the move's trace cause, for the drop when it stops serving it
    # A periodic check's target it reads into memory before deciding again (SimConfig.pre_read "silent"),
    # and the count of such reads (a stale read's end is ignored).
    pre_reading: LayerRange | None = None
    pre_read_round: int = 0

    @property
    def loading(self) -> bool:
        """Not done loading (it may serve some layers already: `served`)."""
        return self.serving is None

    @property
    def growing(self) -> bool:
        """Serving part of a window it is still loading (SimConfig.growing_share)."""
        return self.serving is None and bool(self.arrived)

    @property
    def served(self) -> LayerRange | None:
        """What it serves now: its window once loaded, else the layers arrived so far, or a mover's old
        range until its load starts (None: none of these)."""
        if self.serving is not None:
            return self.serving
        if self.arrived:
            return LayerRange(min(self.arrived), max(self.arrived) + 1)
        return self.leaving


class SwarmArrays:
    """Per-layer arrays kept incrementally.

    Balancing's view (ONLINE + JOINING, movers at their target, not DRAINING): thr, counted, and
    per peer size the throughput (thr_by_k), counts and the throughput crossing each layer boundary
    (cross_by_k: windows with start < b < end, for routing.balance's staggered windows).
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
        self.cross_by_k: dict[int, list[float]] = {}  # ... and the throughput crossing each boundary
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
        self._crossing_tiers: dict[int, tuple[int, list[float]]] = {}  # k -> (placements, crossing_at_least(k))
        self._thin_limit = (-1, 0.0)  # (placements, thin_limit())

    def place(self, p: SimPeer, sign: int) -> None:
        self.placements += 1
        n = len(self.thr)
        tier_thr = self.thr_by_k.setdefault(p.k, [0.0] * n)
        tier_n = self.counted_by_k.setdefault(p.k, [0] * n)
        tier_cross = self.cross_by_k.setdefault(p.k, [0.0] * n)
        for boundary in range(p.layers.start + 1, p.layers.end):
            tier_cross[boundary] += sign * p.thr
            if tier_cross[boundary] < 1e-9:
                tier_cross[boundary] = 0.0
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
        return self._tier_sum(k, self.thr_by_k, self._tiers)

    def crossing_at_least(self, k: int) -> list[float]:
        """Per boundary, the throughput of the windows of at least k layers crossing it (shared, as at_least)."""
        return self._tier_sum(k, self.cross_by_k, self._crossing_tiers)

    def _tier_sum(self, k: int, by_size: dict[int, list[float]], cache: dict[int, tuple[int, list[float]]]) -> list[float]:
        cached = cache.get(k)
        if cached is not None and cached[0] == self.placements:
            return cached[1]
        out = [0.0] * len(self.thr)
        for size, tier in by_size.items():
            if size >= k:
                out = [a + b for a, b in zip(out, tier)]
        cache[k] = (self.placements, out)
        return out

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


def announced_orders(peers: Iterable[SimPeer], p: SimPeer, decided_at: float, from_load_start: bool = True,
                     skip_downloads: bool = False) -> list[list[int]]:
    """What the other loaders of p's window (p.layers) still load, in order, as their records announce it to p
    deciding at `decided_at`: each loader's remaining `to_load`, once its load has started by then (peer/moves.py
    migrate announces a mover's order after its confirmation: one still confirming may step back, and its first
    layer comes a confirmation later than its order says). `from_load_start` False: from the mover's decision on,
    the rule before the forty-fifth session. `skip_downloads`: leave out downloading loaders (SimPeer.downloads): their
    layers come several times slower than a disk loader's, so they count as nobody's."""
    window = p.layers
    assert window is not None
    return [q.to_load for q in peers
            if q is not p and q.loading and q.to_load and q.layers is not None
            and q.layers.start < window.end and window.start < q.layers.end
            and (q.loads_from <= decided_at or not from_load_start) and not (skip_downloads and q.downloads)]


def recount(num_layers: int, peers: Iterable[SimPeer], expiring: Iterable[SimPeer],
            standbys: Iterable[SimPeer]) -> SwarmArrays:
    """SwarmArrays built from scratch from who is where now, to check the incremental ones against
    (SimConfig.check_arrays): every add and remove, a partly loaded peer's included, must cancel."""
    fresh = SwarmArrays(num_layers)
    for p in peers:
        if not p.draining:  # a drainer left balancing's view when it started draining
            fresh.place(p, +1)
        span = p.served
        if span is not None:
            fresh.serve(span, p, +1)
            if not p.draining and p.leaving is None:  # a drainer and a mover's old range serve, not stay
                fresh.stay(span, p, +1)
    for p in expiring:  # gone, serving nothing, but its record counts until it expires
        fresh.place(p, +1)
    for sb in standbys:
        if sb.layers is not None:
            fresh.place_standby(sb.layers, +1)
        for span in [sb.serving] if sb.serving is not None else [LayerRange(i, i + 1) for i in sb.arrived]:
            fresh.serve_standby(span, +1)
    fresh.gaps_opened = 0
    return fresh


def array_mismatches(a: SwarmArrays, b: SwarmArrays, tol: float = 1e-6) -> list[str]:
    """Names of the per-layer arrays (and counters) where `a` and `b` differ; floats within `tol`."""
    names = ["counted", "online_n", "staying_n", "standby_n", "standby_at", "guarded", "uncovered", "gpu_uncovered"]
    out = [name for name in names if getattr(a, name) != getattr(b, name)]
    for name in ("thr", "online_thr", "staying_thr"):
        if any(abs(x - y) > tol for x, y in zip(getattr(a, name), getattr(b, name))):
            out.append(name)
    for k in set(a.counted_by_k) | set(b.counted_by_k):
        n = len(a.thr)
        if a.counted_by_k.get(k, [0] * n) != b.counted_by_k.get(k, [0] * n) or any(
                abs(x - y) > tol for by_size in ("thr_by_k", "cross_by_k")
                for x, y in zip(getattr(a, by_size).get(k, [0.0] * n), getattr(b, by_size).get(k, [0.0] * n))):
            out.append(f"tier {k}")
    return out


class WithoutPeer:
    """Per-layer staying counts or throughput without the asking peer (its `share` on its layers),
    read lazily: plan_move reads only that peer's layers."""

    def __init__(self, values: list[int] | list[float], mine: LayerRange, share: float) -> None:
        self.values, self.mine, self.share = values, mine, share

    def __getitem__(self, layer: int) -> float:
        return self.values[layer] - (self.share if layer in self.mine else 0)
