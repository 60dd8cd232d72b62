"""react_delay: who decides first on urgent layers. The fastest loaders while a layer has no GPU
server; otherwise the largest peers, which refill a departed large peer's range in one move."""

from __future__ import annotations

from peer.balancer import REACT_DELAY_PER_LAYER_S, react_delay
from swarm.types import LayerRange, PeerRecord, PeerState, SwarmView


def record(peer_id: str, start: int, end: int, *, standby: bool = False,
           state: PeerState = PeerState.ONLINE) -> PeerRecord:
    return PeerRecord(peer_id, "m", LayerRange(start, end), state, 10.0, num_layers=16, standby=standby)


def swarm(*records: PeerRecord) -> SwarmView:
    return SwarmView("m", 16, {r.peer_id: r for r in records})


# Every layer has a GPU server; 8:16 (a departed 8-layer peer's range) is thin.
THIN = swarm(record("big", 0, 16), record("small", 0, 4), record("mid", 0, 8))
# Layers 8:16 are served by a standby alone: its pace, not the swarm's, until a GPU peer loads there.
STANDBY_ONLY = swarm(record("big", 0, 8), record("small", 0, 4), record("mid", 0, 8),
                     record("sb", 8, 16, standby=True))


def test_the_largest_peer_decides_first_when_every_layer_has_a_gpu_server() -> None:
    delays = {k: react_delay(THIN, k) for k in (4, 8, 16)}
    assert delays[16] < delays[8] < delays[4]
    assert delays[16] == 0.0  # the largest in the view: at once (nobody goes before them)
    assert delays[4] - delays[8] == 4 * REACT_DELAY_PER_LAYER_S  # one step per layer of difference


def test_the_fastest_loader_decides_first_while_a_layer_has_no_gpu_server() -> None:
    assert STANDBY_ONLY.uncovered_layers() == []  # clients are served, by the standby
    assert STANDBY_ONLY.uncovered_layers(standbys=False) == list(range(8, 16))
    delays = {k: react_delay(STANDBY_ONLY, k) for k in (4, 8)}
    assert delays[4] < delays[8]
    # The smallest in the view go at once, not after a step per layer they hold: every second here
    # holds clients to a standby's pace, and nobody decides before them.
    assert delays[4] == 0.0
    assert delays[8] - delays[4] == 4 * REACT_DELAY_PER_LAYER_S  # one step per layer of difference


def test_a_draining_sole_server_still_serves_so_the_largest_decide_first() -> None:
    draining = swarm(record("big", 0, 8), record("small", 0, 4), record("leaving", 8, 16, state=PeerState.DRAINING))
    assert draining.uncovered_layers(standbys=False) == []
    assert react_delay(draining, 8) < react_delay(draining, 4)


def test_a_peer_whose_leaving_exposes_a_layer_waits_one_step_more() -> None:
    from dataclasses import replace

    from routing import exposes_on_leaving

    # 8:16 is thin. "mid" shares 0:8 with "big" only: its leaving leaves "big" alone there, unguarded.
    # "small" shares 0:4 with two others: leaving exposes nothing.
    view = swarm(record("big", 0, 8), record("mid", 0, 8), record("small", 0, 4), record("small2", 0, 4),
                 record("right", 8, 16))
    assert exposes_on_leaving(view, "mid") and not exposes_on_leaving(view, "small")
    assert react_delay(view, 8, exposes=True) == react_delay(view, 8) + REACT_DELAY_PER_LAYER_S
    # Same while a layer has no GPU server: the fastest loaders first, the exposing ones a step later.
    assert react_delay(STANDBY_ONLY, 4, exposes=True) == react_delay(STANDBY_ONLY, 4) + REACT_DELAY_PER_LAYER_S
    # A standby guarding 0:8 turns the exposure into a slow layer, not a dark one: no extra wait.
    guarded = swarm(*view.records.values(), replace(record("sb", 0, 8), standby=True))
    assert not exposes_on_leaving(guarded, "mid")
    # A sole server cannot leave at all (plan_move keeps it), and a peer not in the view exposes nothing.
    assert not exposes_on_leaving(view, "right") and not exposes_on_leaving(view, "nobody")


def test_a_peer_whose_move_would_download_waits_until_every_disk_loader_has_decided() -> None:
    # A move from the network loads several times slower than one from disk (react_delay's docstring):
    # whatever its size, such a peer decides after the slowest disk loader of the view, exposing or not.
    for view in (THIN, STANDBY_ONLY):
        sizes = {len(r.layers) for r in view.records.values() if not r.standby}
        slowest_disk_loader = max(react_delay(view, k, exposes=True) for k in sizes)
        downloaders = {k: react_delay(view, k, downloads=True) for k in sizes}
        assert min(downloaders.values()) > slowest_disk_loader
        # Among downloaders the sizes keep their order: the largest first on thin layers, the smallest on a gap.
        first = max(sizes) if view is THIN else min(sizes)
        assert downloaders[first] == min(downloaders.values()) < max(downloaders.values())
