"""CrashWatch: a suspect's record leaves the balancing view only when our own probe fails too."""

from __future__ import annotations

import asyncio

from peer.crash_watch import MAX_PROBES_PER_READ, CrashWatch
from swarm.types import LayerRange, PeerRecord, SwarmView


def record(peer_id: str, layers: str, updated: float) -> PeerRecord:
    start, end = map(int, layers.split(":"))
    return PeerRecord(peer_id, "m", LayerRange(start, end), num_layers=8, updated=updated)


class Swarm:
    """The suspects on the DHT and which peers really answer, as plain data."""

    def __init__(self, suspects: dict[str, float], alive: set[str]) -> None:
        self.suspects, self.alive = suspects, alive
        self.probed: list[str] = []

    async def fetch_suspects(self) -> dict[str, float]:
        return dict(self.suspects)

    async def probe(self, peer_id: str) -> bool:
        self.probed.append(peer_id)
        return peer_id in self.alive

    def watch(self) -> CrashWatch:
        return CrashWatch(self.fetch_suspects, self.probe, lambda: "me")


VIEW = SwarmView("m", 8, {r.peer_id: r for r in (record("dead", "0:4", 10.0), record("live", "0:4", 10.0),
                                                  record("me", "4:8", 10.0), record("quiet", "4:8", 10.0))})


def test_only_a_suspect_that_fails_our_probe_is_dropped() -> None:
    swarm = Swarm({"dead": 10.0, "live": 10.0, "me": 10.0}, alive={"live", "me"})
    screened = asyncio.run(swarm.watch().screen(VIEW))
    assert sorted(screened.records) == ["live", "me", "quiet"]
    assert screened.uncovered_layers() == []
    assert sorted(swarm.probed) == ["dead", "live"], "never ourselves, never an unsuspected peer"
    assert VIEW.records.keys() == {"dead", "live", "me", "quiet"}, "the input view is not changed"


def test_each_announcement_is_probed_once_and_a_newer_one_clears_the_suspicion() -> None:
    swarm = Swarm({"dead": 10.0}, alive=set())
    watch = swarm.watch()
    for _ in range(3):
        assert "dead" not in asyncio.run(watch.screen(VIEW)).records
    assert swarm.probed == ["dead"], "the verdict is kept for that announcement"
    back = SwarmView("m", 8, {**VIEW.records, "dead": record("dead", "0:4", 11.0)})
    assert "dead" in asyncio.run(watch.screen(back)).records, "announced after the report: not a suspect"
    swarm.suspects["dead"] = 11.0  # reported again, about the new announcement: probed again
    swarm.alive.add("dead")
    assert "dead" in asyncio.run(watch.screen(back)).records
    assert swarm.probed == ["dead", "dead"]


def test_a_flood_of_suspects_costs_a_bounded_number_of_probes_per_read() -> None:
    crowd = {f"p{i:03d}": record(f"p{i:03d}", "0:8", 1.0) for i in range(50)}
    view = SwarmView("m", 8, crowd)
    swarm = Swarm({p: 1.0 for p in crowd} | {"unknown": 5.0}, alive=set(crowd))
    watch = swarm.watch()
    asyncio.run(watch.screen(view))
    assert len(swarm.probed) == MAX_PROBES_PER_READ
    asyncio.run(watch.screen(view))
    assert len(swarm.probed) == 2 * MAX_PROBES_PER_READ and len(set(swarm.probed)) == len(swarm.probed)
    assert "unknown" not in swarm.probed, "a suspect without a record is not probed"


def test_a_failed_suspects_read_leaves_the_view_as_it_is() -> None:
    async def broken() -> dict[str, float]:
        raise TimeoutError("dht")

    async def never(peer_id: str) -> bool:
        raise AssertionError("no probe without suspects")

    assert asyncio.run(CrashWatch(broken, never, lambda: "me").screen(VIEW)) is VIEW
