"""routing.churn: a peer counts the swarm's departures from its reads and calls it calm only after watching."""

from __future__ import annotations

import dataclasses

from routing.churn import CALM_CHURN, CHURN_WINDOW_S, ChurnCount
from swarm.types import PeerState
from tests.routing_helpers import rec, view

H = CHURN_WINDOW_S


def _swarm(n: int, **states: PeerState):
    return view(8, *(rec(f"p{i}", "0:8", state=states.get(f"p{i}", PeerState.ONLINE)) for i in range(n)))


def test_a_swarm_is_calm_only_after_a_whole_window_with_few_departures() -> None:
    churn = ChurnCount()
    assert not churn.calm(0.0, 100)  # nothing watched yet
    churn.observe(_swarm(100), 0.0)
    assert not churn.calm(H / 2, 100)  # watched half a window: not yet
    churn.observe(_swarm(100), H)
    assert churn.calm(H, 100)
    gone = int(CALM_CHURN * 100) - 1  # one short of the limit
    churn.observe(_swarm(100 - gone), H + 10)
    assert churn.calm(H + 10, 100 - gone)
    churn.observe(_swarm(100 - gone - 1), H + 20)  # the limit reached: no longer calm
    assert not churn.calm(H + 20, 100 - gone - 1)
    # An hour later those departures are out of the window again.
    churn.observe(_swarm(100 - gone - 1), 2 * H + 30)
    assert churn.calm(2 * H + 30, 100 - gone - 1) and not churn.seen


def test_draining_offline_and_vanished_peers_count_once_movers_and_standbys_never() -> None:
    churn = ChurnCount()
    base = _swarm(10)
    churn.observe(base, 0.0)
    moving = dict(base.records)
    moving["p0"] = dataclasses.replace(moving["p0"], moving_to=moving["p0"].layers)  # a mover stays ONLINE
    moving["sb"] = dataclasses.replace(rec("sb", "0:8"), standby=True)
    churn.observe(view(8, *moving.values()), 1.0)
    assert not churn.seen
    leaving = _swarm(10, p1=PeerState.DRAINING, p2=PeerState.OFFLINE)
    churn.observe(leaving, 2.0)  # p1 draining, p2 offline: two departures
    gone = view(8, *(r for r in leaving.records.values() if r.peer_id not in ("p1", "p3")))
    churn.observe(gone, 3.0)  # p1's record vanishes (counted already), p3 vanishes: one more
    churn.observe(gone, 4.0)
    churn.observe(view(8, *gone.records.values(), rec("p9", "0:8")), 5.0)  # a joiner is no departure
    assert sum(n for _, n in churn.seen) == 3


def test_the_count_keeps_one_entry_per_read_within_the_window() -> None:
    churn = ChurnCount()
    for second in range(0, 4 * int(H), 5):  # a read every 5 s for four hours, one departure at each
        churn.count(float(second), 1)
    assert len(churn.seen) <= H / 5 + 1
    assert not churn.calm(4 * H, 10_000)  # 720 departures in the last hour: 7.2% of 10,000
    assert churn.calm(4 * H, 20_000)
