"""Which layers a peer should serve: choose_layers on join, should_move while running.

The measure of a swarm is its per-layer throughput: the sum of the announced throughputs
(tokens/s) of the peers holding each layer. A generation step has to pass every layer,
so the swarm is as fast as its thinnest layer, the bottleneck; an uncovered layer
(throughput 0) stops every client. Both decisions aim at the bottleneck.

JOINING peers count towards throughput here (but not in routing): a joining peer has
already chosen its layers and is loading them, and ignoring it would send the next peers
to join or move to the same thin spot while it loads (herding). A moving peer (record
`moving_to`) counts at its target for the same reason, while it still serves its old layers.
Only ONLINE peers count as servers when checking that a move uncovers nothing, since a
loading peer serves no one, and a moving one only on the layers it keeps (layer_servers).
DRAINING peers count nowhere here: they are leaving, so their layers look as thin as they
will be, and peers that can take them over do so while the drainer still serves.

Tiers: a peer weighs only the peers that hold at least as many layers as it does (the
`min_layers` of layer_throughput). Whatever order peers arrive in, this rebuilds the
placement of a one-pass "largest first" layout (benchmarks/sim_optimum.ordered_placement):
the largest peers lay a smooth base among themselves, and each smaller size patches the thin
spots of the sizes above it; a layer that only smaller peers hold looks empty to a large one.
A small peer arriving later never pushes a large one around. Gaps and redundancy are judged
on every peer (layer_counts). Measured in the simulator (docs/balancing.md, 2x, steady
state, paired, three seeds): max flow 34-44% -> 36-62% of the capacity bound at 1,000 peers,
43-55% -> 57-77% at 200.

Redundancy counts too: given per-layer server counts, a layer with a single server counts
at SOLE_DISCOUNT of its throughput (its *strength*). Such a layer is one abrupt departure
from a gap that lasts a whole weight load, while a second server turns that departure into
a repair with no gap; so a second server is worth more there than speed alone says. Unless
a standby guards the layer (guarded_layers): then a crash leaves it slow, not dark, and the
redundancy is already there, so it counts at its full throughput.

Thin layers: a departure rarely opens a gap but often halves a layer's throughput, and the
swarm's max flow with it, until someone reloads there. A layer whose staying servers carry
less than THIN_SHARE of the mean layer throughput is urgent like a gap (urgent_layers): peers
decide at once instead of at their next balance period, a draining peer stays while a
replacement loads (thin_without, incoming), and a peer does not move away from layers it would
leave thin (should_move): its reload would dip them as a departure does.

Staggered windows: with `crossing` (layer_view.crossing_throughput: per layer boundary the
throughput of the tier's windows that cross it), a window's total also counts STAGGER_WEIGHT times
the crossing of its inner boundaries, so among windows of about equal strength a peer straddles a
boundary few windows cross. The lowest total of a step-shaped throughput sits at the steps, so
without it windows abut, and a stretch one large window carries beside a small one is common;
straddling windows leave fewer short stretches where the max flow runs dry. The boundaries are
weighed by a tent (stagger_weights: most in the window's middle, least at its ends), so a peer puts
the boundary it straddles at its middle and overlaps each neighbour by about half, where weighing
them alike let a straddle by one layer rank as well (and ties fall to the lowest start). Measured
in the simulator (docs/balancing.md, thirty-second session): +1.1 points of sum(c) / L at 200 peers
over 36 fresh seeds (better on 27), +1.5 +- 0.5 at 1,000 peers (six seeds, better on 5); traced, the swarm
carries more between events and needs fewer repairs of thin layers, while a crash costs about what
it did (so 2,000 peers, where crashes take most of the loss, gain little). A window at either end
of the model counts its layers alone, and in joins and strength moves a straddle never gives a
second server to fewer unguarded one-server layers than the abutting window would
(_no_more_exposed; a flow move must hold the bottleneck and raise the max flow, routing.flow_move).
Measured in the simulator (docs/balancing.md, nineteenth session): +1.2 points of sum(c) / L at
1,000 peers on every seed of four, +0.8 at 200; a few more gaps in small swarms at 20-30%/h churn.

Standbys (record `standby`: a slow safety net, usually a CPU) count in the above only as guards
(guarded_layers): they are no capacity, and no server a move or drain may count on.
routing/standby.py places them on the layers one abrupt departure would leave dark (exposed),
minding machines that fail together.

The array-level functions (choose_window, plan_move) take per-layer lists so a
simulator can keep them incrementally; choose_layers / should_move are the
same on a SwarmView. The per-layer arrays they weigh live in routing/layer_view.py, and the
checks of whether a peer may leave its layers (moves, drains, urgent and thin layers) in
routing/leaving.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from operator import mul

from routing.flow import bottleneck_layer
from routing.layer_view import (
    balanced_placement,
    crossing_throughput,
    guarded_layers,
    layer_counts,
    layer_servers,
    layer_throughput,
    staying_throughput,
)
from routing.leaving import leaves_safely, swarm_down, thin_threshold, vacates_only_into
from swarm.types import LayerRange, SwarmView

# Petals' default balance_quality. A move must make the bottleneck of the layers it touches
# at least 1/0.75 = 1.33x what it is now. Every move costs minutes of reloading weights
# and breaks the sessions on the old range, so small gains are not worth it; and a margin
# this wide stops two peers from swapping back and forth on measurement noise.
DEFAULT_QUALITY = 0.75
# A layer served by one peer counts at this share of its throughput. 1/2: a second server of
# the same speed then quadruples the layer's strength (2x throughput, no discount), so peers
# fill sole-served layers first unless the doubly served ones are more than 2x slower.
# Measured in the simulator (docs/balancing.md, 500 peers at 2x): coverage 94.5% -> 98.6% for
# max flow 58% -> 43% of the bound; a strict "two servers first" order got 99.7% at 20%.
SOLE_DISCOUNT = 0.5

# A window's inner boundaries count at this share of the throughput crossing them (choose_window's
# `crossing`), on average over the window (stagger_weights): about as much as its layers' strength,
# since a boundary inside a window is crossed by about the throughput of its layers. Measured in the
# simulator at 200 peers, seeds 0-5, with every boundary weighed alike: 0.5, 1 and 2 gave 84.3, 85.2
# and 83.4% of sum(c) / L against 82.1% without (docs/balancing.md, nineteenth session).
STAGGER_WEIGHT = 1.0

# Throughput standing in for "served, but only by peers outside my tier" when real gaps are
# ranked: above 0 (not a gap), below any real throughput.
_NOT_A_GAP = 1e-12


def choose_window(
    throughput: Sequence[float], num_layers: int, servers: Sequence[int] | None = None,
    discount: float = SOLE_DISCOUNT, bottleneck: int | None = None, guarded: Sequence[bool] | None = None,
    gap_end_first: bool = False, crossing: Sequence[float] | None = None,
) -> LayerRange:
    """The window of `num_layers` consecutive layers that most needs another server.

    Ranked by, in order: most uncovered layers inside (servers == 0 with `servers`, else
    throughput <= 0; a layer only another tier holds is not uncovered); lowest minimum
    throughput inside (the window holds the bottleneck); lowest total throughput inside;
    lowest start. With `servers` (per-layer counts) the ranking uses strengths (strengths(),
    a sole-served layer at `discount` unless `guarded`) instead of throughput. With `bottleneck`
    (a layer, see routing.flow.bottleneck_layer), no gap, and no unguarded layer with one server
    in the weakest window: the window holding that layer with the lowest total. Runs in
    O(layers) with C-speed builtins on the common path. `crossing` (per layer boundary b, the throughput
    of the windows with start < b < end): totals also count STAGGER_WEIGHT times the crossing of each
    window's inner boundaries (module docstring). `gap_end_first` (with `servers`): a dark
    run of k+1 to 2k-1 layers that ends at the model's end is taken from its end (plan_move's
    swarm_down case, see _cover_most_gaps).
    """
    if servers is not None:
        throughput = strengths(throughput, servers, discount, guarded)
    total = len(throughput)
    if total == 0:
        raise ValueError("cannot choose layers of a model with 0 layers")
    if num_layers <= 0:
        raise ValueError(f"a peer must hold at least one layer, got {num_layers}")
    k = min(num_layers, total)
    if k == total:
        return LayerRange(0, total)
    if servers is not None and 0 in servers:
        # Real gaps (nobody at all) come before layers only smaller peers hold (tiered
        # throughput 0, see layer_throughput's min_layers).
        return _cover_most_gaps([0.0 if n == 0 else max(v, _NOT_A_GAP) for v, n in zip(throughput, servers)], k,
                                end_first=gap_end_first)
    lowest = min(throughput)
    if lowest <= 0 and servers is None:
        return _cover_most_gaps(throughput, k)
    weakest = _weakest_window(throughput, k, lowest)
    if crossing is not None:
        weakest = _no_more_exposed(weakest, _weakest_window(throughput, k, lowest, crossing), servers, guarded)
    if bottleneck is None or not 0 <= bottleneck < total:
        return weakest
    if servers is not None and any(servers[i] == 1 and not (guarded and guarded[i])
                                   for i in range(weakest.start, weakest.end)):
        return weakest  # a layer one departure from a gap comes first
    # Flow-aware: among the windows holding the max flow's bottleneck (routing.flow), the one
    # with the lowest total strength; capacity anywhere else would not raise the flow.
    holding = window_holding(throughput, k, bottleneck)
    if crossing is None:
        return holding
    return _no_more_exposed(holding, window_holding(throughput, k, bottleneck, crossing), servers, guarded)


def _no_more_exposed(plain: LayerRange, staggered: LayerRange, servers: Sequence[int] | None,
                     guarded: Sequence[bool] | None) -> LayerRange:
    """`staggered`, unless `plain` would give a second server to more layers that have at most one
    (and no standby guarding them): a straddle must not leave a layer one crash from dark that the
    abutting window would have covered."""
    if servers is None or staggered == plain:
        return staggered

    def exposed(window: LayerRange) -> int:
        return sum(1 for i in range(window.start, window.end) if servers[i] <= 1 and not (guarded and guarded[i]))

    return staggered if exposed(staggered) >= exposed(plain) else plain


def window_holding(throughput: Sequence[float], k: int, layer: int,
                   crossing: Sequence[float] | None = None) -> LayerRange:
    """Among the windows of k layers that hold `layer`, the one of lowest window_total (ties: lowest start)."""
    total = len(throughput)
    start = min(range(max(0, layer - k + 1), min(layer, total - k) + 1),
                key=lambda s: (window_total(throughput, s, k, crossing), s))
    return LayerRange(start, start + k)


def window_total(throughput: Sequence[float], start: int, k: int, crossing: Sequence[float] | None = None) -> float:
    """The throughput of layers [start, start + k), plus STAGGER_WEIGHT times the crossing of the
    window's inner boundaries start + 1 .. start + k - 1, each weighed by stagger_weights(k) (module
    docstring). A window at either end of the model counts its layers alone: it has nothing to
    straddle on that side, and the end layers have no other window that could hold them (staggered
    away, they lose a server)."""
    total = sum(throughput[start : start + k])
    if crossing is not None and 0 < start and start + k < len(throughput):
        total += STAGGER_WEIGHT * sum(map(mul, crossing[start + 1 : start + k], stagger_weights(k)))
    return total


@cache
def stagger_weights(k: int) -> tuple[float, ...]:
    """The weight of each inner boundary start + d (d = 1 .. k - 1) of a window of k layers: a tent,
    4 min(d, k - d) / k, so 1 on average (k / (k - 1) exactly for even k) and twice that in the middle.

    With every boundary weighed alike, straddling another window's end by one layer ranks as well as
    straddling it by half; the tent makes the half straddle win, so neighbours overlap by about half
    their windows (module docstring). Measured against the flat weights in docs/balancing.md,
    thirty-second session."""
    return tuple(4.0 * min(d, k - d) / k for d in range(1, k))


def _weakest_window(throughput: Sequence[float], k: int, lowest: float,
                    crossing: Sequence[float] | None = None) -> LayerRange:
    """The window holding a layer at the minimum `lowest` with the lowest window_total (ties: lowest start)."""
    # Only windows containing a layer at the global minimum can have the lowest minimum.
    total = len(throughput)
    candidates: set[int] = set()
    position = _index(throughput, lowest, 0)
    while position >= 0:
        candidates.update(range(max(0, position - k + 1), min(position, total - k) + 1))
        position = _index(throughput, lowest, position + 1)
    best = min(candidates, key=lambda s: (window_total(throughput, s, k, crossing), s))
    return LayerRange(best, best + k)


def plan_move(
    others: Sequence[float],
    others_online: Sequence[int],
    current: LayerRange,
    my_throughput: float,
    quality: float = DEFAULT_QUALITY,
    others_counted: Sequence[int] | None = None,
    discount: float = SOLE_DISCOUNT,
    guarded: Sequence[bool] | None = None,
    others_staying: Sequence[float] | None = None,
    thin_limit: float = 0.0,
    swarm_down: bool = False,
    crossing: Sequence[float] | None = None,
) -> LayerRange | None:
    """Where a peer now serving `current` should move, or None to stay.

    `others` / `others_online` are the per-layer throughput and ONLINE server counts of the
    swarm without this peer. The candidate is choose_window(others, len(current)). Let the
    local bottleneck be the minimum per-layer throughput over the layers of `current` and
    the candidate together (the only layers a move changes). Move iff
      * the candidate differs from `current`,
      * every layer it serves now has another ONLINE server (one that is not moving away):
        a peer whose memory holds only its own range stops serving to load the new one
        (a peer with room for both keeps serving, peer/server.py migrate, but none counts
        on it), so even a layer it keeps would go dark for the load;
      * with `others_staying` (per-layer throughput of those other staying servers), none of
        those layers falls below `thin_limit` without it (thin_layers): the move would open on
        its old layers the dip it means to close elsewhere, for a whole reload; and
      * local bottleneck now < quality * local bottleneck after the move
        (i.e. it grows by more than 1/quality).
    The swarm's global bottleneck therefore never drops, and rises when it lies in the
    candidate; each move also strictly improves the sorted throughput vector, so moves
    cannot cycle.

    `swarm_down`: some layer outside `current` has no server at all, so no route exists. Then
    the second and third conditions give way where the candidate takes every layer only this
    peer serves (vacates_only_into): while it loads, those layers are dark in a swarm that is
    down anyway, and once loaded it lights the gap. Without this, a sole server of one layer
    next to a gap only it could fill would never move, and the gap would stay.

    With `others_counted` (per-layer ONLINE + JOINING counts without this peer) every
    throughput above is a layer's strength (strengths(), `guarded` layers undiscounted): the
    candidate is choose_window(others, k, others_counted) and the test compares the weakest
    touched strengths. A layer's strength depends on that layer alone, so the same argument holds:
    the sorted strength vector strictly improves, no cycles.

    `crossing` (per boundary, without this peer) only ranks the candidates
    (choose_window); the test above does not see it, so the no-cycle argument stands.
    """
    if not 0 < quality <= 1:
        raise ValueError(f"quality must be in (0, 1], got {quality}")
    # While the swarm is down, a sole server may shift into a gap only with every layer it alone
    # serves (below). From the end of a dark run that reaches the model's end, the layers it would
    # leave dark stay reachable by the peer below (choose_window's gap_end_first); a candidate that
    # does not hold this peer's lone layers then keeps it in place, and that peer comes instead.
    target = choose_window(others, len(current), others_counted, discount, guarded=guarded,
                           gap_end_first=swarm_down, crossing=crossing)
    if target == current:
        return None
    if not leaves_safely(current, others_online, others_staying, thin_limit) and not (
            swarm_down and vacates_only_into(current, target, others_online)):
        return None
    mine = set(range(current.start, current.end))
    theirs = set(range(target.start, target.end))
    touched = mine | theirs  # only these layers change; far-apart ranges stay O(k)
    if others_counted is None:
        before = min(others[layer] + (my_throughput if layer in mine else 0.0) for layer in touched)
        after = min(others[layer] + (my_throughput if layer in theirs else 0.0) for layer in touched)
        return target if before < quality * after else None
    weakest_now = min(_strength(others, others_counted, layer, layer in mine, my_throughput, discount, guarded)
                      for layer in touched)
    weakest_then = min(_strength(others, others_counted, layer, layer in theirs, my_throughput, discount, guarded)
                       for layer in touched)
    return target if weakest_now < quality * weakest_then else None


def strengths(throughput: Sequence[float], servers: Sequence[int], discount: float = SOLE_DISCOUNT,
              guarded: Sequence[bool] | None = None) -> list[float]:
    """Per-layer throughput, a sole-served layer's at `discount` of it unless `guarded` (0 stays 0)."""
    if guarded is None:
        return [t * discount if n == 1 else t for t, n in zip(throughput, servers)]
    return [t * discount if n == 1 and not g else t for t, n, g in zip(throughput, servers, guarded)]


def _strength(others: Sequence[float], counted: Sequence[int], layer: int, mine: bool, thr: float,
              discount: float, guarded: Sequence[bool] | None) -> float:
    value = others[layer] + (thr if mine else 0.0)
    return value * discount if counted[layer] + mine == 1 and not (guarded and guarded[layer]) else value


def choose_layers(view: SwarmView, num_layers: int) -> LayerRange:
    """The layers a new peer that can hold `num_layers` layers should serve (see choose_window),
    weighing the peers of its tier (at least `num_layers` layers; module docstring).

    Flow-aware unless redundancy comes first: when the weakest window has no layer with a single
    server, the window holds the max flow's bottleneck layer (routing.flow.bottleneck_layer) of
    the ONLINE and JOINING peers. Measured in the simulator (docs/balancing.md, 2x, half the
    departures graceful): max flow +6-7 points of the capacity bound for about as many sole
    servers. One coarse max flow per join: tens of ms at 1,000 peers and 5,000 layers.
    """
    placement = balanced_placement(view)
    bottleneck = bottleneck_layer(placement, view.num_layers) if placement else None
    return choose_window(layer_throughput(view, min_layers=num_layers), num_layers, layer_counts(view),
                         bottleneck=bottleneck, guarded=guarded_layers(view),
                         crossing=crossing_throughput(view, min_layers=num_layers))


def should_move(
    view: SwarmView,
    me: str,
    *,
    quality: float = DEFAULT_QUALITY,
    my_throughput: float | None = None,
) -> LayerRange | None:
    """The range peer `me` should move to, or None to stay (see plan_move for the rule), weighing
    the peers of its tier (at least as many layers as it holds; module docstring).

    `my_throughput` overrides the announced one (e.g. a fresh measurement).
    """
    record = view.records.get(me)
    if record is None:
        raise ValueError(f"peer {me!r} is not in the view of model {view.model}")
    current = LayerRange(
        min(record.layers.start, view.num_layers - 1), min(record.layers.end, view.num_layers)
    )
    return plan_move(
        layer_throughput(view, without=me, min_layers=len(current)),
        layer_servers(view, without=me),
        current,
        record.throughput if my_throughput is None else my_throughput,
        quality,
        layer_counts(view, without=me),
        guarded=guarded_layers(view),
        others_staying=staying_throughput(view, without=me),
        thin_limit=thin_threshold(view),  # my capacity stays in the swarm: the mean counts it
        swarm_down=swarm_down(view, current),
        crossing=crossing_throughput(view, without=me, min_layers=len(current)),
    )


def _cover_most_gaps(throughput: Sequence[float], k: int, end_first: bool = False) -> LayerRange:
    """Windows ranked by (most uncovered layers, lowest total throughput, lowest start).

    `end_first`: a dark run of k+1 to 2k-1 layers at the model's end (not its start) is taken
    from its end.

    Only windows touching an uncovered layer can win, so just those are scored, each with
    C-speed slice builtins: a handful of gaps in a 50,000-layer model costs microseconds.
    """
    if min(throughput) < 0:
        throughput = [max(value, 0.0) for value in throughput]  # negative means nobody too
    total = len(throughput)
    # Fast path: the first window made only of gaps ranks first (most gaps, total 0, lowest
    # start). Jumping from gap to gap, past any served layer, keeps this O(layers / k).
    position = _index(throughput, 0.0, 0)
    while 0 <= position <= total - k:
        window = throughput[position : position + k]
        if window.count(0.0) == k:
            if end_first and 0 < position and total - position < 2 * k and throughput[position:].count(0.0) == total - position:
                # Take the end of a dark run of k+1 to 2k-1 layers at the model's end: what is left
                # dark (< k layers) is then interior, where the peer below can shift up into it. From
                # the lowest window it would be the model's last layers, which only a second move of
                # this very peer could reach (a real swarm sat one layer short, tests/test_balancer.py).
                return LayerRange(total - k, total)
            return LayerRange(position, position + k)
        served = max(i for i, value in enumerate(window) if value != 0.0)
        position = _index(throughput, 0.0, position + served + 1)
    candidates: set[int] = set()
    position = _index(throughput, 0.0, 0)
    while position >= 0:
        candidates.update(range(max(0, position - k + 1), min(position, total - k) + 1))
        position = _index(throughput, 0.0, position + 1)

    def rank(s: int) -> tuple[int, float, int]:
        window = throughput[s : s + k]
        return (-window.count(0.0), sum(window), s)

    best = min(candidates, key=rank)
    return LayerRange(best, best + k)


def _index(values: Sequence[float], value: float, start: int) -> int:
    """values.index(value, start), or -1; works for lists and tuples alike."""
    try:
        return values.index(value, start)  # type: ignore[attr-defined]
    except ValueError:
        return -1
