"""Plain-data builders for the routing tests: records and views from short literals."""

from __future__ import annotations

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
