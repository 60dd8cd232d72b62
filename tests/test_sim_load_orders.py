"""Which other loaders' load orders a deciding GPU peer counts in the simulator (benchmarks.sim_swarm_state
announced_orders), as the peer's records announce them (peer/moves.py migrate: from the load start)."""

from __future__ import annotations

from benchmarks.sim_swarm_state import SimPeer, announced_orders
from routing import first_arrivals, gap_weight
from routing.standby import EXPOSED_GAP
from swarm.types import LayerRange


def loader(peer_id: str, window: LayerRange, to_load: list[int], loads_from: float) -> SimPeer:
    """A GPU peer placed at `window`, nothing of it served yet, loading `to_load` from `loads_from` on."""
    return SimPeer(peer_id, len(window), 1.0, 0.01, layers=window, to_load=to_load, loads_from=loads_from)


def test_a_mover_still_confirming_promises_no_arrivals_until_its_load_starts() -> None:
    # A crash left layer 11 dark. Mover a decided at t=100 and confirms its move for a second (its load starts at
    # 101); mover b decides at 100 too, after it; c loads since t=90; d loads elsewhere.
    a = loader("a", LayerRange(10, 14), [11, 10, 12, 13], loads_from=101.0)
    b = loader("b", LayerRange(8, 12), [], loads_from=0.0)
    c = loader("c", LayerRange(4, 10), [9, 8], loads_from=90.0)
    d = loader("d", LayerRange(20, 24), [20, 21], loads_from=95.0)
    peers = [a, b, c, d]
    # b counts c's announced order (its load has started), never d's (elsewhere), and a's only once a loads.
    assert announced_orders(peers, b, decided_at=100.0) == [[9, 8]]
    assert announced_orders(peers, b, decided_at=101.0) == [[11, 10, 12, 13], [9, 8]]
    # The rule before the forty-fifth session counted a's order from its decision on: b then took layer 11 for
    # a's first layer, due now, and loaded it late, though a's came a confirmation later (docs/balancing.md).
    assert announced_orders(peers, b, decided_at=100.0, from_load_start=False) == [[11, 10, 12, 13], [9, 8]]
    before = first_arrivals(announced_orders(peers, b, 100.0, from_load_start=False))
    now = first_arrivals(announced_orders(peers, b, 100.0))
    assert gap_weight(before.get(11), len(b.layers)) == 0.0
    assert gap_weight(now.get(11), len(b.layers)) == EXPOSED_GAP


def test_a_peer_done_loading_or_with_nothing_left_to_load_announces_nothing() -> None:
    me = loader("me", LayerRange(0, 8), [], loads_from=0.0)
    done = SimPeer("done", 4, 1.0, 0.01, layers=LayerRange(2, 6), serving=LayerRange(2, 6), to_load=[3], loads_from=0.0)
    emptied = loader("emptied", LayerRange(4, 8), [], loads_from=0.0)
    assert announced_orders([me, done, emptied], me, decided_at=10.0) == []


def test_a_downloading_loader_promises_no_arrivals() -> None:
    # A joiner downloads 4:8 (5 s a layer) from 7 down; a disk loader c loads 2:6 from 5 down.
    joiner = loader("joiner", LayerRange(4, 8), [7, 6, 5, 4], loads_from=90.0)
    joiner.downloads = True
    c = loader("c", LayerRange(2, 6), [5, 4, 3, 2], loads_from=95.0)
    me = loader("me", LayerRange(4, 8), [], loads_from=0.0)
    assert announced_orders([joiner, c, me], me, decided_at=100.0, skip_downloads=True) == [[5, 4, 3, 2]]
    assert announced_orders([joiner, c, me], me, decided_at=100.0) == [[7, 6, 5, 4], [5, 4, 3, 2]]
