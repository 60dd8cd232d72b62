"""peer.drain.wait_until_covered on scripted sequences of swarm views (plain data, fast)."""

from __future__ import annotations

import pytest

from peer import drain
from swarm.types import PeerState
from tests.routing_helpers import rec, view

D = PeerState.DRAINING


def views_in_order(*views):
    """fetch_view returning the given views one per call, then the last one forever (or raising)."""
    calls = {"n": 0}

    async def fetch():
        i = min(calls["n"], len(views) - 1)
        calls["n"] += 1
        if isinstance(views[i], Exception):
            raise views[i]
        return views[i]

    return fetch, calls


async def test_waits_while_a_taker_loads_then_leaves_when_covered() -> None:
    waiting = view(8, rec("a", "0:4"), rec("b", "0:4"), rec("me", "4:8", state=D))
    moved = view(8, rec("a", "0:4"), rec("b", "4:8"), rec("me", "4:8", state=D))
    fetch, calls = views_in_order(waiting, waiting, OSError("dht slow"), waiting, moved)
    assert await drain.wait_until_covered(fetch, "me", timeout=10, poll=0.01) == "covered"
    assert calls["n"] == 5


async def test_leaves_soon_when_nobody_can_take_over(monkeypatch) -> None:
    monkeypatch.setattr(drain, "NO_TAKER_GRACE_S", 0.05)
    alone = view(8, rec("a", "0:4"), rec("me", "4:8", state=D))
    fetch, calls = views_in_order(alone)
    assert await drain.wait_until_covered(fetch, "me", timeout=10, poll=0.01) == "no_taker"
    assert calls["n"] >= 2  # "nobody" had to hold for the grace period, not one read


async def test_covered_but_thin_waits_while_a_replacement_loads(monkeypatch) -> None:
    monkeypatch.setattr(drain, "THIN_GRACE_S", 0.05)
    # 4:8 keeps only a slow server (1 tokens/s, under half the mean layer throughput: thin) while j loads there.
    thin = [rec("a", "0:4", 10.0), rec("slow", "4:8", 1.0), rec("me", "4:8", 10.0, state=D)]
    loading = view(8, *thin, rec("j", "4:8", 10.0, state=PeerState.JOINING))
    loaded = view(8, *thin, rec("j", "4:8", 10.0))
    fetch, calls = views_in_order(loading, loading, loading, loading, loading, loading, loaded)
    assert await drain.wait_until_covered(fetch, "me", timeout=10, poll=0.02) == "covered"
    assert calls["n"] == 7  # stayed through every read that showed j loading, longer than the grace
    # Nobody loading: it stays the grace period, then leaves (a thin layer beats holding up a departure).
    fetch, calls = views_in_order(view(8, *thin))
    assert await drain.wait_until_covered(fetch, "me", timeout=10, poll=0.01) == "covered"
    assert calls["n"] >= 3


async def test_bounded_wait_runs_out() -> None:
    stuck = view(8, rec("a", "0:4"), rec("b", "0:4"), rec("me", "4:8", state=D))  # b could come, never does
    fetch, _ = views_in_order(stuck)
    assert await drain.wait_until_covered(fetch, "me", timeout=0.1, poll=0.01) == "timeout"


@pytest.mark.parametrize("others", [("0:8",), ("4:8", "0:4")])
async def test_already_covered_leaves_at_once(others) -> None:
    covered = view(8, rec("me", "4:8", state=D), *(rec(f"p{i}", r) for i, r in enumerate(others)))
    fetch, calls = views_in_order(covered)
    assert await drain.wait_until_covered(fetch, "me", timeout=10) == "covered"
    assert calls["n"] == 1


def test_the_monitor_counts_a_draining_peer_as_serving_and_shows_it() -> None:
    from client.monitor.state import Probe, model_state

    v = view(8, rec("a", "0:4"), rec("me", "4:8", state=D))
    probes = {p: Probe(p, True, 0.01, None, {"record": {}}) for p in ("a", "me")}
    m = model_state(v, probes)
    assert m["healthy"] and m["gaps"] == [] and m["peer_counts"]["draining"] == 1
    assert [p["state"] for p in m["peers"]] == ["online", "draining"]
