"""Plain-data builders for the routing tests: records and views from short literals."""

from __future__ import annotations

import random
from collections.abc import Callable

from routing import choose_layers
from swarm.types import LayerRange, PeerRecord, PeerState, SwarmView


def rec(
    peer_id: str,
    layers: str,
    throughput: float = 1.0,
    *,
    state: PeerState = PeerState.ONLINE,
    free_pages: int = 100,
) -> PeerRecord:
    return PeerRecord(
        peer_id=peer_id,
        model="m",
        layers=LayerRange.parse(layers),
        state=state,
        throughput=throughput,
        free_pages=free_pages,
    )


def view(num_layers: int, *records: PeerRecord, rtt: dict[str, float] | None = None) -> SwarmView:
    return SwarmView("m", num_layers, {r.peer_id: r for r in records}, dict(rtt or {}))


def hops(route) -> list[tuple[str, str]]:
    """A route as [(peer id, "start:end")] for readable exact assertions."""
    return [(h.peer_id, str(h.layers)) for h in route]


def joined_swarm(peers: list[tuple[int, float]], num_layers: int) -> dict[str, PeerRecord]:
    """Peers (layers held, throughput) joining one after another where choose_layers puts them."""
    records: dict[str, PeerRecord] = {}
    for i, (k, thr) in enumerate(peers):
        records[f"p{i}"] = rec(f"p{i}", str(choose_layers(view(num_layers, *records.values()), k)), thr)
    return records


def settle(records: dict[str, PeerRecord], num_layers: int, move: Callable[[SwarmView, str], LayerRange | None],
           rng: random.Random, rounds: int = 40) -> None:
    """Let every peer, in a shuffled order each round, move where `move` says until a round moves
    nobody; fail after `rounds` rounds."""
    order = sorted(records)
    for _ in range(rounds):
        rng.shuffle(order)
        moved = False
        for peer_id in order:
            target = move(view(num_layers, *records.values()), peer_id)
            if target is not None:
                records[peer_id] = rec(peer_id, str(target), records[peer_id].throughput)
                moved = True
        if not moved:
            return
    raise AssertionError(f"still moving after {rounds} rounds: {sorted((r.peer_id, str(r.layers)) for r in records.values())}")
