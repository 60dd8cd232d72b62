"""Crash notices: news wakes the watch and is passed on to a few peers once; junk and floods cost little;
what was heard is screened like a DHT report, and the watch wakes on it."""

from __future__ import annotations

import asyncio
import dataclasses
import random
from pathlib import Path

import pytest

import peer.balancer as balancer
from peer.crash_notices import MAX_NEWS_PER_S, NEWS_BURST, REMEMBER_S, CrashNotices
from peer.crash_watch import CrashWatch
from swarm.notices import FANOUT, notice_recipients
from swarm.schema import CrashNotice
from swarm.types import LayerRange, PeerRecord, PeerState, SwarmView
from tests.placements import scripted_placement


def record(peer_id: str, layers: str = "0:4", updated: float = 10.0, state: PeerState = PeerState.ONLINE) -> PeerRecord:
    start, end = map(int, layers.split(":"))
    return PeerRecord(peer_id, "m", LayerRange(start, end), state=state, num_layers=8, updated=updated,
                      throughput=10.0)


# "dead" crashed; "me" hears of it; 20 others could be told; "gone" announced OFFLINE.
VIEW = SwarmView("m", 8, {r.peer_id: r for r in (record("dead"), record("me", "4:8"), record("gone", state=PeerState.OFFLINE),
                                                  *(record(f"p{i:02d}", "4:8") for i in range(20)))})


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Heard:
    """CrashNotices with the notices it sent recorded, on a test clock."""

    def __init__(self) -> None:
        self.sent: list[tuple[list[str], CrashNotice]] = []
        self.clock = Clock()
        self.wake = asyncio.Event()
        self.notices = CrashNotices(self.tell, lambda: "me", self.wake, self.clock, random.Random(0))
        self.notices.note_view(VIEW)

    async def tell(self, recipients: list[str], notice: CrashNotice) -> int:
        self.sent.append((recipients, notice))
        return len(recipients)


def run(body) -> Heard:
    """`body(heard)` on an event loop (telling runs as tasks), then the loop drains them."""
    heard = Heard()

    async def main() -> None:
        body(heard)
        await asyncio.sleep(0)

    asyncio.run(main())
    return heard


def test_news_wakes_the_watch_and_is_passed_on_once_to_fanout_others() -> None:
    def body(h: Heard) -> None:
        assert h.notices.receive(CrashNotice("dead", 10.0), "p00")
        assert not h.notices.receive(CrashNotice("dead", 10.0), "p01"), "heard already: no second wave"
        h.notices.confirmed("dead", 10.0)  # our own probe agrees: told already

    h = run(body)
    assert h.wake.is_set()
    assert len(h.sent) == 1
    recipients, notice = h.sent[0]
    assert notice == CrashNotice("dead", 10.0)
    assert len(recipients) == len(set(recipients)) == FANOUT
    assert not {"dead", "me", "p00", "gone"} & set(recipients), "not the suspect, us, the teller or a leaver"
    assert h.notices.suspects() == {"dead": 10.0}


@pytest.mark.parametrize("notice, why", [
    (CrashNotice("me", 10.0), "about us: we answer probes"),
    (CrashNotice("dead", 9.0), "about an announcement older than the one we see"),
])
def test_junk_neither_wakes_nor_spreads(notice: CrashNotice, why: str) -> None:
    h = run(lambda h: h.notices.receive(notice, "p00"))
    assert not h.wake.is_set() and h.sent == [] and h.notices.suspects() == {}, why


def test_a_peer_our_view_does_not_list_yet_is_looked_for_and_before_any_view_nobody_is_told() -> None:
    """A view is up to a watch period old: the peer that crashed may have joined since."""
    h = run(lambda h: h.notices.receive(CrashNotice("newcomer", 10.0), "p00"))
    assert h.wake.is_set() and len(h.sent) == 1 and h.notices.suspects() == {"newcomer": 10.0}

    def before_any_view(h: Heard) -> None:
        h.notices.view = None
        assert h.notices.receive(CrashNotice("dead", 10.0), "p00")

    h = run(before_any_view)
    assert h.wake.is_set() and h.sent == []


def test_a_flood_of_forged_news_is_cut_at_the_rate_limit_but_our_own_verdicts_still_spread() -> None:
    many = SwarmView("m", 8, {**VIEW.records, **{f"v{i:03d}": record(f"v{i:03d}") for i in range(100)}})

    def body(h: Heard) -> None:
        h.notices.note_view(many)
        accepted = sum(h.notices.receive(CrashNotice(f"v{i:03d}", 10.0), "liar") for i in range(100))
        assert accepted == NEWS_BURST
        assert h.notices.dropped == 100 - NEWS_BURST
        h.clock.now += 2 / MAX_NEWS_PER_S  # two more, later
        assert sum(h.notices.receive(CrashNotice(f"v{i:03d}", 10.0), "liar") for i in range(100)) == 2
        h.notices.confirmed("dead", 10.0)  # a probe of our own is not rate limited

    h = run(body)
    assert len(h.sent) == NEWS_BURST + 3
    assert h.sent[-1][1] == CrashNotice("dead", 10.0)


def test_what_was_heard_is_forgotten_after_a_while() -> None:
    def body(h: Heard) -> None:
        h.notices.receive(CrashNotice("dead", 10.0), "p00")
        h.clock.now += REMEMBER_S + 1

    assert run(body).notices.suspects() == {}


def test_a_heard_suspect_is_probed_without_any_dht_report_and_a_dead_one_is_passed_on() -> None:
    probed: list[str] = []
    dead: list[tuple[str, float]] = []

    async def no_reports() -> dict[str, float]:
        return {}

    async def probe(peer_id: str) -> bool:
        probed.append(peer_id)
        return peer_id != "dead"

    watch = CrashWatch(no_reports, probe, lambda: "me", lambda: {"dead": 10.0, "p00": 10.0},
                       lambda *key: dead.append(key))
    screened = asyncio.run(watch.screen(VIEW))
    assert "dead" not in screened.records and "p00" in screened.records
    assert sorted(probed) == ["dead", "p00"]
    assert dead == [("dead", 10.0)]
    asyncio.run(watch.screen(VIEW))
    assert dead == [("dead", 10.0)], "once per announcement"


def test_a_view_screened_on_what_was_heard_reads_no_reports() -> None:
    async def reports() -> dict[str, float]:
        raise AssertionError("read the DHT's reports")

    async def probe(peer_id: str) -> bool:
        return peer_id != "dead"

    watch = CrashWatch(reports, probe, lambda: "me", lambda: {"dead": 10.0})
    assert "dead" not in asyncio.run(watch.screen(VIEW, reported={})).records
    told_only = CrashWatch(reports, probe, lambda: "me")  # nothing heard: nothing to drop
    assert asyncio.run(told_only.screen(VIEW, reported={})) is VIEW


def test_recipients_are_random_distinct_and_bounded() -> None:
    picks = {tuple(notice_recipients(VIEW, "dead", ("me",), random.Random(seed), fanout=3)) for seed in range(20)}
    assert len(picks) > 1, "random, so waves take different paths"
    assert all(len(set(p)) == 3 and not {"dead", "me", "gone"} & set(p) for p in picks)
    small = SwarmView("m", 8, {r.peer_id: r for r in (record("dead"), record("me"), record("p00"))})
    assert notice_recipients(small, "dead", ("me",), random.Random(0)) == ["p00"]


def test_a_notice_wakes_the_watch_long_before_its_period(tiny_model_factory) -> None:
    """With a 60-s watch period, a crash notice 50 ms in makes the watch read the view at once and
    return the urgent layers ("dead"'s, gone from the screened view) within a second."""
    model: Path = tiny_model_factory("llama", 8)
    without_dead = SwarmView("m", 8, {p: r for p, r in VIEW.records.items() if p != "dead"})
    reads = 0

    async def fetch_view() -> SwarmView:
        nonlocal reads
        reads += 1
        return without_dead

    placement = scripted_placement(model, fetch_view, peer_id="me", layers=LayerRange(4, 8), watch_period=60.0)

    async def watch() -> SwarmView | None:
        loop = asyncio.get_running_loop()
        loop.call_later(0.05, placement.wake.set)
        return await asyncio.wait_for(balancer._watch_until(placement, loop.time() + 120.0, []), 5.0)

    assert asyncio.run(watch()) is without_dead
    assert reads == 2  # woken: one read found the gap, one more after the react delay
    assert not placement.wake.is_set(), "cleared for the next notice"


@pytest.mark.parametrize("heard_shows_the_gap", [True, False])
def test_a_notice_starts_the_react_delay_on_the_view_heard_without_a_dht_read(tiny_model_factory,
                                                                              heard_shows_the_gap: bool) -> None:
    """Woken by a notice, the watch looks at the last view less the suspects heard of (Placement.heard_view):
    when that shows the gap it waits its react delay and reads the DHT once, for the decision; when it shows
    nothing new (a notice about a peer the last view did not list) it reads the DHT's view first, as before."""
    model: Path = tiny_model_factory("llama", 8)
    without_dead = SwarmView("m", 8, {p: r for p, r in VIEW.records.items() if p != "dead"})
    # Not showing the gap: the crashed peer's record is still there, and its layers have as many servers as 4:8.
    covered = SwarmView("m", 8, {**VIEW.records, **{f"q{i:02d}": record(f"q{i:02d}") for i in range(20)}})
    heard = SwarmView("m", 8, dict(without_dead.records)) if heard_shows_the_gap else covered
    reads: list[str] = []

    async def fetch_view() -> SwarmView:
        reads.append("dht")
        return without_dead

    async def heard_view() -> SwarmView:
        reads.append("heard")
        return heard

    placement = dataclasses.replace(
        scripted_placement(model, fetch_view, peer_id="me", layers=LayerRange(4, 8), watch_period=60.0),
        heard_view=heard_view)

    async def watch() -> SwarmView | None:
        loop = asyncio.get_running_loop()
        loop.call_later(0.05, placement.wake.set)
        return await asyncio.wait_for(balancer._watch_until(placement, loop.time() + 120.0, []), 5.0)

    assert asyncio.run(watch()) is without_dead, "the decision is taken on the DHT's view after the delay"
    assert reads == (["heard", "dht"] if heard_shows_the_gap else ["heard", "dht", "dht"])
